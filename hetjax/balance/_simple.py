"""Reference policies: plain BSP, react-to-last-step, and an oracle that knows the trace.

They bound LB-BSP from both sides in the benchmarks: `Uniform` is what balancing must beat,
`Proportional` is the simplest reactive balancer (LB-BSP with a last-value predictor, no
damping), and `Oracle` knows every worker's true speed at the step it plans (slowdown and
base speed), which no real policy can.

Example::

  >>> rules = ShareRules(global_batch=4096, workers=4, bucket=64)
  >>> oracle = Oracle(rules, StaticTrace((1, 1, 1, 3)))
  >>> oracle.update(oracle.init(), None)[0].values
  (1280, 1216, 1216, 384)
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from hetjax._errors import ConfigError
from hetjax.balance._policy import observed_speeds, shares_array, shares_of, transfer_of
from hetjax.core import ShareRules, Shares, StepStats
from hetjax.emulation import SlowdownTrace


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SharesState:
  """The state of a policy that learns nothing: the shares in force, int64[workers]."""

  shares: np.ndarray


@dataclasses.dataclass(frozen=True)
class Uniform:
  """Plain BSP: ``rules.uniform()`` at every step, whatever happened.

  With bucket 1 that is X // n rows each and the remainder one each to the first workers:
  ``Uniform(ShareRules(10, 4))`` runs (3, 3, 2, 2). Workers of different device counts
  (``rules.devices``) get equal rows per device: ``Uniform(ShareRules(64, 3, 4, devices=(2, 1,
  1)))`` runs (32, 16, 16), data parallelism over all four devices.
  """

  rules: ShareRules
  name: str = dataclasses.field(default='uniform', init=False)

  def init(self) -> SharesState:
    return SharesState(shares_array(self.rules.uniform()))

  def update(self, state: SharesState, stats: StepStats | None) -> tuple[Shares, SharesState]:
    return shares_of(state.shares, self.rules), state


@dataclasses.dataclass(frozen=True)
class Fixed:
  """The same given shares at every step (``--shares``), checked against ``rules`` once.

  Example::

    >>> policy = Fixed(ShareRules(8, 2, minimum=(0, 0)), (6, 2))
    >>> policy.update(policy.init(), None)[0].values
    (6, 2)
  """

  rules: ShareRules
  values: tuple[int, ...]
  name: str = dataclasses.field(default='fixed', init=False)

  def __post_init__(self):
    Shares(tuple(int(v) for v in self.values), self.rules)  # raises ConfigError, one line

  def init(self) -> SharesState:
    return SharesState(shares_array(self.values))

  def update(self, state: SharesState, stats: StepStats | None) -> tuple[Shares, SharesState]:
    return shares_of(state.shares, self.rules), state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ProportionalState:
  """`Proportional`'s state.

  Attributes:
    shares: the shares in force, int64[workers].
    speeds: the speeds observed at the last step, float64[workers] (zeros before any).
    steps: steps learned from.
  """

  shares: np.ndarray
  speeds: np.ndarray
  steps: int


@dataclasses.dataclass(frozen=True)
class Proportional:
  """Shares ∝ the speeds observed at the last step (uniform before any step).

  A worker whose last compute time is unusable keeps its previous speed (see
  `observed_speeds`).
  """

  rules: ShareRules
  name: str = dataclasses.field(default='proportional', init=False)

  def init(self) -> ProportionalState:
    n = self.rules.workers
    return ProportionalState(shares_array(self.rules.uniform()), np.zeros(n), 0)

  def update(self, state: ProportionalState,
             stats: StepStats | None) -> tuple[Shares, ProportionalState]:
    if stats is None:
      return shares_of(state.shares, self.rules), state
    speeds = observed_speeds(stats, state.speeds if state.steps else None)
    shares = self.rules.from_weights(speeds)
    return shares, ProportionalState(shares_array(shares), speeds, state.steps + 1)


@dataclasses.dataclass(frozen=True)
class Oracle:
  """The balanced optimum of every step, from each worker's true speed at that step.

  Worker i's step of x rows takes ``(factor_i(t) + delay_i(t)) × (fixed_s + x × row_s_i)``
  seconds: the time a `hetjax.emulation.KnownSpeedHost` pads it to and the virtual clock's
  model; then its own transfer ``transfer_s_i``, when given. The oracle reads the slowdown
  trace (factor and transient delay) and the hosts' costs (base speed 1 / row_s_i and the
  per-step fixed_s), so it exists only for benchmarks. Its
  shares minimise the slowest worker's time over all valid shares (`min_max_shares`), which
  makes it an upper bound for every causal policy wherever the model holds: on the virtual
  clock exactly, on hosts of known speed up to their overruns. Shares ∝ 1 / factor (the oracle
  before) are that optimum only when fixed_s is 0 and base speeds are equal. It learns nothing:
  ``init()`` holds step 0's shares and ``update`` after step t gives step t + 1's.

  Args:
    rules: the job's share rules.
    trace: the slowdowns the run will see.
    row_s: each worker's seconds per row at factor 1 (one value for all, or one per worker).
    fixed_s: seconds per step whatever the rows, at factor 1.
    transfer_s: each worker's own transfer a step, seconds, which no slowdown stretches
      (`hetjax.balance.LBBSP`'s); empty: none.
  """

  rules: ShareRules
  trace: SlowdownTrace
  row_s: float | tuple[float, ...] = 1.0
  fixed_s: float = 0.0
  transfer_s: tuple[float, ...] = ()
  name: str = dataclasses.field(default='oracle', init=False)

  def __post_init__(self):
    n = self.rules.workers
    if self.trace.workers != n:
      raise ConfigError(f'oracle trace has {self.trace.workers} workers, rules {n}')
    row = np.broadcast_to(np.asarray(self.row_s, dtype=np.float64), (n,)) \
        if np.ndim(self.row_s) == 0 or np.shape(self.row_s) == (n,) else None
    if row is None or not (np.isfinite(row).all() and (row > 0).all()):
      raise ConfigError(f'oracle row_s {self.row_s} must be one or {n} finite values > 0')
    if not (np.isfinite(self.fixed_s) and self.fixed_s >= 0):
      raise ConfigError(f'oracle fixed_s {self.fixed_s} must be finite and >= 0')
    object.__setattr__(self, 'row_s', tuple(row.tolist()))
    object.__setattr__(self, 'fixed_s', float(self.fixed_s))
    object.__setattr__(self, 'transfer_s', transfer_of(self.transfer_s, n))

  def planned(self, step: int) -> Shares:
    """The shares of ``step``: the min-max split at its true slowdowns."""
    slow = np.asarray(self.trace.factors(step)) + np.asarray(self.trace.delays(step))
    transfer = np.asarray(self.transfer_s or (0.0,) * self.rules.workers)
    return min_max_shares(self.rules, slow * np.array(self.row_s), slow * self.fixed_s + transfer)

  def init(self) -> SharesState:
    return SharesState(shares_array(self.planned(0)))

  def update(self, state: SharesState, stats: StepStats | None) -> tuple[Shares, SharesState]:
    if stats is None:
      return shares_of(state.shares, self.rules), state
    shares = self.planned(stats.step + 1)
    return shares, SharesState(shares_array(shares))


def min_max_shares(rules: ShareRules, per_row_s, fixed_s) -> Shares:
  """The valid shares minimising max_i (fixed_s_i + share_i × per_row_s_i).

  The fractional optimum first: the level T at which each worker, given the rows it finishes by
  T (within its bounds), covers the global batch — solved exactly, since the rows covered are
  piecewise linear and grow with T. Its shares rounded down to buckets are at most those of an integer optimum, so
  handing out the leftover buckets one at a time to the worker that would finish soonest with
  one more is optimal too (each hand-out stays at or under the optimum's time).

  Example::

    >>> rules = ShareRules(global_batch=8, workers=2, bucket=1)
    >>> min_max_shares(rules, [1.0, 1.0], [4.0, 0.0]).values  # both done at 6 s
    (2, 6)

  Args:
    rules: the bounds, bucket and global batch.
    per_row_s: seconds per row of each worker (> 0).
    fixed_s: seconds each worker takes whatever its rows (>= 0).
  """
  b, units = rules.bucket, rules.global_batch // rules.bucket
  per_unit = np.asarray(per_row_s, dtype=np.float64) * b
  fixed = np.broadcast_to(np.asarray(fixed_s, dtype=np.float64), per_unit.shape)
  lo = np.asarray(rules.lower, dtype=np.float64) / b
  hi = np.minimum(np.asarray(rules.upper, dtype=np.float64) / b, units)

  def covered(level: float) -> np.ndarray:
    return np.clip((level - fixed) / per_unit, lo, hi)

  # Σ covered is piecewise linear in the level: worker i adds rows at 1 / per_unitᵢ between
  # its start (fixed + lo per_unit) and its stop (fixed + hi per_unit). Walk the sorted events.
  events = np.concatenate([fixed + lo * per_unit, fixed + hi * per_unit])
  order = np.argsort(events, kind='stable')
  at = events[order]
  slope = np.cumsum(np.concatenate([1 / per_unit, -1 / per_unit])[order])  # after each event
  total = lo.sum() + np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(at))])
  k = max(int(np.searchsorted(total, units, side='right')) - 1, 0)
  level = at[k] + ((units - total[k]) / slope[k] if slope[k] > 1e-300 else 0.0)
  low = level - 1e-12 * max(abs(level), 1e-300)  # just under the crossing, as a bisection ends
  taken = np.floor(covered(low)).astype(np.int64)  # Σ <= units, each >= lo (integers)
  for _ in range(units - int(taken.sum())):  # at most about one a worker
    finish = np.where(taken + 1 <= hi, fixed + per_unit * (taken + 1), np.inf)
    taken[int(np.argmin(finish))] += 1
  return Shares(tuple(int(v) * b for v in taken), rules)
