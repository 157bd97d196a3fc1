"""The text form of slowdown traces: one grammar for ``--slowdown`` and every benchmark.

Example::

  >>> parse_trace('markov:3:0.9:seed=7:workers=0+3', workers=4).describe()
  'markov slow 3x stay 0.9 seed 7 on workers 0+3'
"""

from __future__ import annotations

import itertools

from hetjax._errors import ConfigError
from hetjax.emulation._traces import (
    ComposedTrace,
    CsvTrace,
    MarkovTrace,
    SlowdownTrace,
    StaticTrace,
    StepChangeTrace,
    TransientTrace,
    _factors,
    _number,
)

# name: (usage, fewest positional fields, most positional fields, the NAME=VALUE options it takes).
# The error for an unknown name lists them in this order.
_FORMS = {
    'none': ('none', 0, 0, ()),
    'static': ('static:F[,F…]', 1, 1, ()),
    'step': ('step:AT:BEFORE:AFTER', 3, 3, ()),
    'markov': ('markov:SLOW:STAY[:seed=N][:workers=I+J]', 2, 2, ('seed=N', 'workers=I+J')),
    'csv': ('csv:PATH', 1, 1, ()),
    'transient': ('transient:H[:P][:seed=N]', 1, 2, ('seed=N',)),
    'persistent': ('persistent:W:F', 2, 2, ()),
}


def _integer(text: str, what: str) -> int:
  if not text.strip().isdecimal():
    raise ConfigError(f'{what} {text!r} must be an integer >= 0')
  return int(text)


def _list(text: str, workers: int, what: str) -> tuple[float, ...]:
  values = [_number(t, f'{what} factor') for t in text.split(',')]
  if len(values) not in (1, workers):
    raise ConfigError(
        f'{what} has {len(values)} factors for {workers} workers; give {workers} or 1')
  return tuple(values * workers if len(values) == 1 else values)


def _parse(part: str, workers: int) -> SlowdownTrace:
  """One trace (no ``*``) from its spec."""
  name, *args = part.strip().split(':', 1 if part.strip().startswith('csv:') else -1)
  if name not in _FORMS:
    raise ConfigError(f'unknown trace {name!r}; choose one of: {", ".join(_FORMS)}')
  usage, low, high, known = _FORMS[name]
  fields = list(itertools.takewhile(lambda a: '=' not in a, args)) if known else args
  given = args[len(fields):]
  if not low <= len(fields) <= high:
    raise ConfigError(f'expected {usage}')
  options = dict(a.partition('=')[::2] for a in given)
  if len(options) != len(given) or not set(options) <= {k.partition('=')[0] for k in known}:
    raise ConfigError(f'bad {name} options {":".join(given)!r}; known: {", ".join(known)}')
  if name in ('none', 'static'):
    return StaticTrace(_list(fields[0] if fields else '1', workers, name))
  if name == 'step':
    at = _integer(fields[0], 'step change at')
    return StepChangeTrace(at, _list(fields[1], workers, 'before'),
                           _list(fields[2], workers, 'after'))
  if name == 'csv':
    return CsvTrace.load(fields[0], workers)
  if name == 'persistent':
    w = _integer(fields[0], 'persistent worker')
    if w >= workers:
      raise ConfigError(f'persistent worker {w} is not one of the {workers} workers')
    factor = _factors([_number(fields[1], 'persistent factor')], 'persistent')[0]
    return StaticTrace(tuple(factor if i == w else 1.0 for i in range(workers)))
  seed = _integer(options.get('seed', '0'), f'{name} seed')
  if name == 'transient':
    p = _number(fields[1], 'transient probability') if len(fields) > 1 else 0.1
    return TransientTrace(workers, _number(fields[0], 'transient delay h'), p, seed)
  ids = options.get('workers')
  return MarkovTrace(
      workers, _number(fields[0], 'markov slow factor'),
      _number(fields[1], 'markov stay probability'), seed,
      None if ids is None else tuple(_integer(w, 'markov worker id') for w in ids.split('+')))


def parse_trace(spec: str, workers: int) -> SlowdownTrace:
  """A trace from the text used by ``--slowdown`` and the benchmarks: the one trace grammar.

  Specs (a list F… is one factor for all workers or one per worker, comma-separated):

  - ``none``: every worker at 1.0;
  - ``static:F…``: fixed factors, i.e. per-worker base speeds;
  - ``step:AT:BEFORE:AFTER``: factors BEFORE for steps < AT, AFTER from AT on (lists as static);
  - ``markov:SLOW:STAY[:seed=N][:workers=I+J]``: two-state chains (`MarkovTrace`);
  - ``csv:PATH``: one row of factors per step, the last repeated (`CsvTrace.load`);
  - ``transient:H[:P][:seed=N]``: SDPipe's transients, H × a step with probability P (default
    0.1) per worker and step (`TransientTrace`);
  - ``persistent:W:F``: worker W is F× slower, the others 1× (a `StaticTrace`);
  - ``A*B*…``: all of them at once (`ComposedTrace`); a csv path cannot contain ``*``.

  Example::

    >>> parse_trace('markov:3:0.9:seed=7:workers=0+3', workers=4).describe()
    'markov slow 3x stay 0.9 seed 7 on workers 0+3'
    >>> parse_trace('persistent:1:3', workers=3) == StaticTrace((1, 3, 1))
    True

  Raises:
    ConfigError: one line naming ``spec`` and what is wrong with it.
  """
  try:
    if int(workers) != workers or workers < 1:
      raise ConfigError(f'workers must be >= 1, got {workers!r}')
    parts = [_parse(part, workers) for part in spec.split('*')]
    return parts[0] if len(parts) == 1 else ComposedTrace(tuple(parts))
  except ConfigError as e:
    raise ConfigError(f'slowdown {spec!r}: {e}') from None
