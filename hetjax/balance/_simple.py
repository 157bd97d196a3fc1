"""Reference policies: plain BSP, react-to-last-step, and an oracle that knows the trace.

They bound LB-BSP from both sides in the benchmarks: `Uniform` is what balancing must beat,
`Proportional` is the simplest reactive balancer (LB-BSP with a last-value predictor, no
damping), and `Oracle` knows the slowdowns of the step it plans, which no real policy can.

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
from hetjax.balance._policy import observed_speeds, shares_array, shares_of
from hetjax.core._shares import ShareRules, Shares
from hetjax.core._stats import StepStats
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
  ``Uniform(ShareRules(10, 4))`` runs (3, 3, 2, 2).
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
  """Shares ∝ the true speeds of the step being planned: base_speed / trace.factors(step).

  It reads the slowdown trace, so it exists only for benchmarks, as the best any policy could
  do with perfect foresight (up to bucket rounding). It learns nothing: ``init()`` holds step
  0's shares and ``update`` after step t gives step t + 1's.

  Args:
    rules: the job's share rules.
    trace: the slowdowns the run will see.
    base_speed: each worker's undisturbed speed (rows/s); equal by default.
  """

  rules: ShareRules
  trace: SlowdownTrace
  base_speed: tuple[float, ...] | None = None
  name: str = dataclasses.field(default='oracle', init=False)

  def __post_init__(self):
    if self.trace.workers != self.rules.workers:
      raise ConfigError(f'oracle trace has {self.trace.workers} workers, rules '
                        f'{self.rules.workers}')
    if self.base_speed is not None:
      base = np.asarray(self.base_speed, dtype=np.float64)
      if base.shape != (self.rules.workers,) or not (np.isfinite(base).all() and (base > 0).all()):
        raise ConfigError(f'oracle base_speed {self.base_speed} must be '
                          f'{self.rules.workers} finite values > 0')
      object.__setattr__(self, 'base_speed', tuple(base.tolist()))

  def planned(self, step: int) -> Shares:
    """The shares of ``step``, from its true slowdowns."""
    base = np.ones(self.rules.workers) if self.base_speed is None else np.array(self.base_speed)
    return self.rules.from_weights(base / self.trace.factors(step))

  def init(self) -> SharesState:
    return SharesState(shares_array(self.planned(0)))

  def update(self, state: SharesState, stats: StepStats | None) -> tuple[Shares, SharesState]:
    if stats is None:
      return shares_of(state.shares, self.rules), state
    shares = self.planned(stats.step + 1)
    return shares, SharesState(shares_array(shares))
