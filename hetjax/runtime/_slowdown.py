"""Slowdown traces: how much slower than itself each worker runs at each step.

Heterogeneity on a small machine is made by *time dilation*: worker i with factor sᵢ(t) sleeps
(sᵢ(t) − 1) × its measured compute time after computing, so it looks sᵢ times slower without
stealing another worker's core. The virtual clock multiplies modelled compute by the same factors,
which is why the two agree. A trace is a pure function of the step, so every worker and every run
sees the same slowdowns whatever order it asks in.

Example::

  >>> parse_slowdown('step:20:1:1,1,1,3', workers=4).factors(25)
  array([1., 1., 1., 3.])
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import math
import time
from typing import Protocol, runtime_checkable

import numpy as np

from hetjax._errors import ConfigError

_CHUNK_DRAWS = 2**18  # Markov states are drawn ~this many at a time (steps × affected workers).
_USAGE = {'none': 'none', 'static': 'static:F[,F…]', 'step': 'step:AT:BEFORE:AFTER',
          'markov': 'markov:SLOW:STAY[:seed=N][:workers=I+J]', 'csv': 'csv:PATH'}


@runtime_checkable
class SlowdownTrace(Protocol):
  """Per-step factors of ``workers`` workers: float64[workers], finite and > 0 (1.0 = normal)."""

  @property
  def workers(self) -> int: ...

  def factors(self, step: int) -> np.ndarray: ...

  def factor(self, worker: int, step: int) -> float: ...

  def describe(self) -> str: ...


def _factors(values, what: str) -> tuple[float, ...]:
  """``values`` as floats, or a ConfigError if any is not finite and > 0."""
  a = np.array(values, dtype=np.float64)
  ok = np.isfinite(a) & (a > 0)
  if a.size == 0 or not ok.all():
    bad = a[~ok].flat[0] if a.size else 'none'
    raise ConfigError(f'{what} has factor {bad}; factors must be finite and > 0')
  return tuple(a.ravel().tolist())


def _fmt(v: tuple[float, ...]) -> str:
  return f'{v[0]:g} on all {len(v)} workers' if min(v) == max(v) else ','.join(f'{x:g}' for x in v)


class _Trace:
  """What every trace shares: one worker's factor, and refusing negative steps."""

  def factor(self, worker: int, step: int) -> float:
    if not 0 <= worker < self.workers:
      raise ConfigError(f'worker {worker} out of range for {self.workers} workers')
    return float(self.factors(step)[worker])

  @staticmethod
  def _step(step: int) -> int:
    if step < 0:
      raise ConfigError(f'step {step} is negative')
    return int(step)


@dataclasses.dataclass(frozen=True)
class StaticTrace(_Trace):
  """The same factors at every step: ``StaticTrace((1, 1, 1, 3))`` makes worker 3 3× slower.

  The field is ``values`` because ``factors`` is the method every trace has.
  """

  values: tuple[float, ...]

  def __post_init__(self):
    object.__setattr__(self, 'values', _factors(self.values, 'static trace'))

  @property
  def workers(self) -> int:
    return len(self.values)

  def factors(self, step: int) -> np.ndarray:
    self._step(step)
    return np.array(self.values)

  def describe(self) -> str:
    return f'static {_fmt(self.values)}'


@dataclasses.dataclass(frozen=True)
class StepChangeTrace(_Trace):
  """``before`` for steps < ``at``, ``after`` from step ``at`` on: a load arriving mid-run.

  Example::

    >>> StepChangeTrace(20, (1, 1), (1, 3)).factor(1, step=20)
    3.0
  """

  at: int
  before: tuple[float, ...]
  after: tuple[float, ...]

  def __post_init__(self):
    if int(self.at) != self.at or self.at < 0:
      raise ConfigError(f'step change at {self.at!r}; it must be an integer >= 0')
    object.__setattr__(self, 'before', _factors(self.before, 'step trace before'))
    object.__setattr__(self, 'after', _factors(self.after, 'step trace after'))
    if len(self.before) != len(self.after):
      raise ConfigError(f'step trace has {len(self.before)} factors before, {len(self.after)} after')

  @property
  def workers(self) -> int:
    return len(self.before)

  def factors(self, step: int) -> np.ndarray:
    return np.array(self.before if self._step(step) < self.at else self.after)

  def describe(self) -> str:
    return f'step at {self.at}: {_fmt(self.before)} -> {_fmt(self.after)}'


@dataclasses.dataclass(frozen=True)
class MarkovTrace(_Trace):
  """Each affected worker (default all) flips between fast (1.0) and slow (``slow``).

  A worker keeps its state with probability ``stay`` per step and starts fast, so for stay < 1 it
  is slow half the time in the long run, in spells of 1 / (1 − stay) steps on average. Worker w's
  chain is drawn from ``np.random.default_rng([seed, w])`` in chunks of steps, cached and always
  extended in order; a stream's draws do not depend on how they are chunked, so step t's factors
  are a pure function of (seed, w, t), whatever order steps are asked for and whichever other
  workers are affected.

  Example::

    >>> MarkovTrace(workers=4, slow=3.0, stay=0.9, slow_workers=(3,)).factors(0)
    array([1., 1., 1., 1.])
  """

  workers: int
  slow: float
  stay: float
  seed: int = 0
  slow_workers: tuple[int, ...] | None = None

  def __post_init__(self):
    _factors([self.slow], 'markov slow factor')
    if not 0.0 <= self.stay <= 1.0:
      raise ConfigError(f'markov stay probability {self.stay!r} is outside [0, 1]')
    if not all(int(v) == v and v >= low for v, low in ((self.seed, 0), (self.workers, 1))):
      raise ConfigError(f'markov needs integer seed >= 0 and workers >= 1: {self.seed}, {self.workers}')
    ids = tuple(range(self.workers) if self.slow_workers is None else self.slow_workers)
    if not ids or len(set(ids)) != len(ids) or not all(0 <= w < self.workers for w in ids):
      raise ConfigError(f'markov workers {ids} must be distinct ids in [0, {self.workers})')
    object.__setattr__(self, 'slow_workers', None if self.slow_workers is None else ids)
    object.__setattr__(self, '_rngs', [np.random.default_rng([self.seed, w]) for w in ids])
    object.__setattr__(self, '_ids', np.array(ids))
    object.__setattr__(self, '_chunks', [])  # bool[len(ids), _size] per chunk: True = slow
    object.__setattr__(self, '_size', min(4096, max(64, _CHUNK_DRAWS // len(ids))))

  def _extend(self) -> None:
    flips = np.stack([rng.random(self._size) >= self.stay for rng in self._rngs])
    if self._chunks:
      prev = self._chunks[-1][:, -1:].astype(np.int64)
    else:
      flips[:, 0], prev = False, 0  # step 0 is fast
    self._chunks.append((prev + np.cumsum(flips, axis=1)) % 2 == 1)

  def factors(self, step: int) -> np.ndarray:
    chunk, offset = divmod(self._step(step), self._size)
    while len(self._chunks) <= chunk:
      self._extend()
    out = np.ones(self.workers)
    out[self._ids] = np.where(self._chunks[chunk][:, offset], self.slow, 1.0)
    return out

  def describe(self) -> str:
    who = '+'.join(map(str, self.slow_workers)) if self.slow_workers else f'all {self.workers}'
    return f'markov slow {self.slow:g}x stay {self.stay:g} seed {self.seed} on workers {who}'


@dataclasses.dataclass(frozen=True, eq=False)
class CsvTrace(_Trace):
  """Replays a table: row t holds step t's factors, and steps past the last row repeat it.

  Example::

    >>> CsvTrace(np.array([[1.0, 1.0], [1.0, 3.0]])).factors(10**6)  # past the end: last row
    array([1., 3.])
  """

  rows: np.ndarray
  source: str = 'table'

  def __post_init__(self):
    rows = np.array(self.rows, dtype=np.float64)
    if rows.ndim != 2 or 0 in rows.shape:
      raise ConfigError(f'csv trace needs a non-empty 2-D table, got shape {rows.shape}')
    _factors(rows.ravel(), f'csv trace {self.source}')
    rows.setflags(write=False)
    object.__setattr__(self, 'rows', rows)

  @classmethod
  def load(cls, path: str, workers: int) -> CsvTrace:
    """One row per step, one column per worker; a first row of non-numbers is a header."""
    try:
      with open(path, newline='') as f:
        reader = csv.reader(f)
        table = [(reader.line_num, row) for row in reader if ''.join(row).strip()]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
      raise ConfigError(f'cannot read csv {path}: {e}') from None
    if table and all(_number(c) is None for c in table[0][1]):
      table = table[1:]
    if not table:
      raise ConfigError(f'csv {path} has no data rows')
    for line, row in table:
      if len(row) != workers:
        raise ConfigError(f'csv {path} line {line} has {len(row)} columns, expected {workers}')
      for cell in row:
        _number(cell, f'csv {path} line {line}: cell')
    return cls(np.array([[float(c) for c in row] for _, row in table]), source=str(path))

  @property
  def workers(self) -> int:
    return self.rows.shape[1]

  def factors(self, step: int) -> np.ndarray:
    return self.rows[min(self._step(step), len(self.rows) - 1)].copy()

  def describe(self) -> str:
    return f'csv {self.source} ({len(self.rows)} steps x {self.workers} workers, last repeats)'


def dilation_seconds(factor: float, compute_s: float) -> float:
  """How long a worker sleeps after ``compute_s`` of compute to look ``factor`` times slower.

  Example::

    >>> dilation_seconds(3.0, 0.1)  # 0.1 s of compute becomes 0.3 s
    0.2
  """
  _factors([factor], 'dilation')
  if not compute_s >= 0:
    raise ConfigError(f'compute time {compute_s!r} must be >= 0')
  return max(0.0, (factor - 1.0) * compute_s)


@dataclasses.dataclass(frozen=True)
class TimeDilation:
  """Makes ``worker`` as slow as ``trace`` says by sleeping, never by burning a core.

  Example::

    dilation = TimeDilation(parse_slowdown('static:1,3', 2), worker=1)
    slept = dilation.apply(step, compute_s=measured)  # sleeps 2 × measured
  """

  trace: SlowdownTrace
  worker: int
  base: float = 1.0  # every worker's factor is multiplied by this (see `factor`)

  def __post_init__(self):
    if not 0 <= self.worker < self.trace.workers:
      raise ConfigError(f'worker {self.worker} out of range for {self.trace.workers} workers')
    if not (math.isfinite(self.base) and self.base >= 1):
      raise ConfigError(f'dilation base {self.base!r} must be finite and >= 1')
    object.__setattr__(self, '_recent', {})  # rows -> last compute times
    object.__setattr__(self, '_per_row', collections.deque(maxlen=5))  # seconds per row, any size

  def factor(self, step: int) -> float:
    """The slowdown applied at ``step``: ``base`` × the trace's factor.

    A base above 1 emulates hosts slower than this machine's share of a core. With several
    workers on few cores, most of each worker's step is then sleep, so the workers stop
    contending for the cores and behave like separate hosts (4 workers on 2 cores: base 4).
    """
    return self.base * self.trace.factor(self.worker, step)

  def apply(self, step: int, compute_s: float, rows: int | None = None) -> float:
    """Sleeps the dilation for ``step``; returns the seconds actually slept (0.0 if none).

    With ``rows`` given, the sleep is (factor − 1) × the median of this worker's last few
    compute times for that many rows, not × this one. On a machine where workers share cores,
    a small computation's measured time has scheduler spikes of up to 10x; multiplied by the
    factor they would emulate a host that is erratic, not just slow.
    """
    if rows is not None:
      recent = self._recent.setdefault(rows, collections.deque(maxlen=5))
      recent.append(compute_s)
      self._per_row.append(compute_s / max(rows, 1))
      # A size seen fewer than 3 times: the median per-row time of recent steps of any size.
      compute_s = float(np.median(recent) if len(recent) >= 3
                        else np.median(self._per_row) * rows)
    seconds = dilation_seconds(self.factor(step), compute_s)
    if seconds <= 0:
      return 0.0
    start = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - start


def _number(text: str, what: str | None = None) -> float | None:
  """``float(text)``; if it is not a number, None, or a ConfigError saying ``what`` it is."""
  try:
    return float(text)
  except ValueError:
    if what is None:
      return None
    raise ConfigError(f'{what} {text.strip()!r} is not a number') from None


def _integer(text: str, what: str) -> int:
  if not text.strip().isdecimal():
    raise ConfigError(f'{what} {text!r} must be an integer >= 0')
  return int(text)


def _list(text: str, workers: int, what: str) -> tuple[float, ...]:
  values = [_number(t, f'{what} factor') for t in text.split(',')]
  if len(values) not in (1, workers):
    raise ConfigError(f'{what} has {len(values)} factors for {workers} workers; give {workers} or 1')
  return tuple(values * workers if len(values) == 1 else values)


def _parse(name: str, args: list[str], workers: int) -> SlowdownTrace:
  if name not in _USAGE:
    raise ConfigError(f'unknown trace {name!r}; choose one of: {", ".join(_USAGE)}')
  low, high = {'none': (0, 0), 'step': (3, 3), 'markov': (2, 4)}.get(name, (1, 1))
  if not low <= len(args) <= high:
    raise ConfigError(f'expected {_USAGE[name]}')
  if name in ('none', 'static'):
    return StaticTrace(_list(args[0] if args else '1', workers, name))
  if name == 'step':
    at = _integer(args[0], 'step change at')
    return StepChangeTrace(at, _list(args[1], workers, 'before'), _list(args[2], workers, 'after'))
  if name == 'csv':
    return CsvTrace.load(args[0], workers)
  options = dict(a.partition('=')[::2] for a in args[2:])
  if len(options) != len(args) - 2 or not set(options) <= {'seed', 'workers'}:
    raise ConfigError(f'bad markov options {":".join(args[2:])!r}; known: seed=N, workers=I+J')
  ids = options.get('workers')
  return MarkovTrace(
      workers, _number(args[0], 'markov slow factor'), _number(args[1], 'markov stay probability'),
      _integer(options.get('seed', '0'), 'markov seed'),
      None if ids is None else tuple(_integer(w, 'markov worker id') for w in ids.split('+')))


def parse_slowdown(spec: str, workers: int) -> SlowdownTrace:
  """A trace from the text used by ``--slowdown`` and the benchmarks.

  Specs: ``none``; ``static:F`` (all workers) or ``static:F0,…,Fn-1``; ``step:AT:BEFORE:AFTER``
  (lists as for static); ``markov:SLOW:STAY[:seed=N][:workers=I+J]``; ``csv:PATH``.

  Example::

    >>> parse_slowdown('markov:3:0.9:seed=7:workers=0+3', workers=4).describe()
    'markov slow 3x stay 0.9 seed 7 on workers 0+3'

  Raises:
    ConfigError: one line naming ``spec`` and what is wrong with it.
  """
  name, *args = spec.strip().split(':', 1 if spec.strip().startswith('csv:') else -1)
  try:
    if int(workers) != workers or workers < 1:
      raise ConfigError(f'workers must be >= 1, got {workers!r}')
    return _parse(name, args, workers)
  except ConfigError as e:
    raise ConfigError(f'slowdown {spec!r}: {e}') from None
