"""Slowdown traces and their one text grammar: how much slower than itself each worker runs.

A trace says, for every worker and step, two things about the host the worker is emulated on:

- ``factors(step)``: a multiplicative slowdown (1.0 = the calibrated speed, 3.0 = three times
  slower): static base speeds, a load that arrives at step k, a fast ↔ slow Markov chain, a
  persistent straggler, a replayed table;
- ``delays(step)``: an additive delay in units of the step's nominal time (0.0 = none): SDPipe's
  transient stragglers, which lose h × a step with probability p.

A step of nominal time T (the undisturbed host's time for its rows) then takes
(factor + delay) × T; `KnownSpeedHost` pads real steps to that, the virtual clock models it. A
trace is a pure function of the step, so every worker and every run sees the same slowdowns
whatever order it asks in. Traces compose with ``*``: factors multiply and delays add, so
``static:1,1,2,2*transient:1`` puts SDPipe's transients on hosts of two speeds.

Example::

  >>> parse_trace('step:20:1:1,1,1,3', workers=4).factors(25)
  array([1., 1., 1., 3.])
  >>> parse_trace('persistent:3:3*transient:1:0.5:seed=2', workers=4).describe()
  'static 1,1,1,3 * transient 1x a step with p 0.5 seed 2 on all 4 workers'
"""

from __future__ import annotations

import csv
import dataclasses
from typing import Protocol, runtime_checkable

import numpy as np

from hetjax._errors import ConfigError

_CHUNK_DRAWS = 2**18  # Markov states are drawn ~this many at a time (steps × affected workers).

@runtime_checkable
class SlowdownTrace(Protocol):
  """Per-step slowdowns of ``workers`` workers (module docstring).

  ``factors(step)`` is float64[workers], finite and > 0 (1.0 = normal speed); ``delays(step)``
  is float64[workers], finite and >= 0, in units of the step's nominal time (0.0 = no delay).
  ``factor`` and ``delay`` are one worker's entries. Steps are integers >= 0.
  """

  @property
  def workers(self) -> int: ...

  def factors(self, step: int) -> np.ndarray: ...

  def factor(self, worker: int, step: int) -> float: ...

  def delays(self, step: int) -> np.ndarray: ...

  def delay(self, worker: int, step: int) -> float: ...

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
  """What every trace shares: one worker's entries, no delays unless overridden, step checks."""

  def factor(self, worker: int, step: int) -> float:
    return float(self.factors(step)[self._worker(worker)])

  def delays(self, step: int) -> np.ndarray:
    self._step(step)
    return np.zeros(self.workers)

  def delay(self, worker: int, step: int) -> float:
    return float(self.delays(step)[self._worker(worker)])

  def _worker(self, worker: int) -> int:
    if not 0 <= worker < self.workers:
      raise ConfigError(f'worker {worker} out of range for {self.workers} workers')
    return int(worker)

  @staticmethod
  def _step(step: int) -> int:
    if step < 0:
      raise ConfigError(f'step {step} is negative')
    return int(step)


@dataclasses.dataclass(frozen=True)
class StaticTrace(_Trace):
  """The same factors at every step: ``StaticTrace((1, 1, 1, 3))`` makes worker 3 3× slower.

  This is how per-worker base speeds are written, and what ``persistent:W:F`` parses to. The
  field is ``values`` because ``factors`` is the method every trace has.
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
      raise ConfigError(
          f'step trace has {len(self.before)} factors before, {len(self.after)} after')

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
      raise ConfigError(
          f'markov needs integer seed >= 0 and workers >= 1: {self.seed}, {self.workers}')
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


@dataclasses.dataclass(frozen=True)
class TransientTrace(_Trace):
  """SDPipe's transient stragglers: at each step, each worker loses ``h`` × a step with prob. ``p``.

  Factors are all 1.0; worker w's delay at step t is ``h`` if
  ``np.random.default_rng([seed, w, t]).random() < p``, else 0.0: SDPipe's injection, the
  same stragglers at the same steps for the same seed on replicas (`replica_trace`),
  share workers and the virtual clocks. Each draw is a pure function of (seed, w, t), whatever order the steps are
  asked for; the draw decides whether, ``h`` only how long. The paper uses h ∈ {1, 3}, p = 0.1.

  Example::

    >>> trace = TransientTrace(workers=2, h=3.0, p=1.0)   # p = 1: every step
    >>> trace.factors(5), trace.delays(5)                  # a step of T takes (1 + 3) × T
    (array([1., 1.]), array([3., 3.]))
  """

  workers: int
  h: float
  p: float = 0.1
  seed: int = 0

  def __post_init__(self):
    if not 0.0 <= self.h < np.inf:
      raise ConfigError(f'transient delay h {self.h!r} must be finite and >= 0')
    if not 0.0 <= self.p <= 1.0:
      raise ConfigError(f'transient probability {self.p!r} is outside [0, 1]')
    if not all(int(v) == v and v >= low for v, low in ((self.seed, 0), (self.workers, 1))):
      raise ConfigError(
          f'transient needs integer seed >= 0 and workers >= 1: {self.seed}, {self.workers}')

  def factors(self, step: int) -> np.ndarray:
    self._step(step)
    return np.ones(self.workers)

  def delays(self, step: int) -> np.ndarray:
    """One draw per worker, each a Python call: a step's draws grow with the workers."""
    step = self._step(step)
    return np.array([self._delay(w, step) for w in range(self.workers)])

  def delay(self, worker: int, step: int) -> float:
    return self._delay(self._worker(worker), self._step(step))

  def _delay(self, worker: int, step: int) -> float:
    draw = np.random.default_rng([int(self.seed), worker, step]).random()
    return float(self.h) if draw < self.p else 0.0

  def describe(self) -> str:
    return (f'transient {self.h:g}x a step with p {self.p:g} seed {self.seed} '
            f'on all {self.workers} workers')


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


@dataclasses.dataclass(frozen=True)
class ComposedTrace(_Trace):
  """Several traces at once (``A*B`` in a spec): their factors multiply and their delays add.

  Example::

    >>> ComposedTrace((StaticTrace((1, 2)), StepChangeTrace(5, (1, 1), (3, 1)))).factors(5)
    array([3., 2.])
  """

  parts: tuple[SlowdownTrace, ...]

  def __post_init__(self):
    object.__setattr__(self, 'parts', tuple(self.parts))
    sizes = {part.workers for part in self.parts}
    if len(sizes) != 1:
      raise ConfigError(f'composed trace needs parts of one size, got workers {sorted(sizes)}')

  @property
  def workers(self) -> int:
    return self.parts[0].workers

  def factors(self, step: int) -> np.ndarray:
    return np.prod([part.factors(step) for part in self.parts], axis=0)

  def delays(self, step: int) -> np.ndarray:
    return np.sum([part.delays(step) for part in self.parts], axis=0)

  def delay(self, worker: int, step: int) -> float:
    self._worker(worker)
    return float(sum(part.delay(worker, step) for part in self.parts))

  def describe(self) -> str:
    return ' * '.join(part.describe() for part in self.parts)


def _number(text: str, what: str | None = None) -> float | None:
  """``float(text)``; if it is not a number, None, or a ConfigError saying ``what`` it is."""
  try:
    return float(text)
  except ValueError:
    if what is None:
      return None
    raise ConfigError(f'{what} {text.strip()!r} is not a number') from None
