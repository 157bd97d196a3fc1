"""Reference policies: plain BSP, react-to-last-step, and an oracle that knows the trace.

They bound LB-BSP from both sides in the benchmarks: `Uniform` is what balancing must beat,
`Proportional` is the simplest reactive balancer (LB-BSP with a last-value predictor, no
damping), and `Oracle` knows this step's slowdowns, which no real policy can.

Example::

  >>> rules = ShareRules(global_batch=4096, workers=4, bucket=64)
  >>> Oracle(rules, StaticTrace((1, 1, 1, 3))).shares(0, []).values
  (1280, 1216, 1216, 384)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.balance._policy import HistoryCursor
from hetjax.balance._shares import ShareRules, Shares
from hetjax.runtime._slowdown import SlowdownTrace
from hetjax.runtime._virtual_clock import StepStats


@dataclasses.dataclass(frozen=True)
class Uniform:
  """Plain BSP: ``rules.uniform()`` at every step, whatever happened."""

  rules: ShareRules
  name: str = dataclasses.field(default='uniform', init=False)

  def shares(self, step: int, history: Sequence[StepStats]) -> Shares:
    return self.rules.uniform()


class Proportional:
  """Shares ∝ the speeds observed at the last step (uniform before any step).

  A worker whose last compute time is unusable keeps its previous speed (see
  `observed_speeds`).
  """

  name = 'proportional'

  def __init__(self, rules: ShareRules):
    self.rules = rules
    self._cursor = HistoryCursor()

  def shares(self, step: int, history: Sequence[StepStats]) -> Shares:
    self._cursor.advance(history)
    if not history:
      return self.rules.uniform()
    return self.rules.from_weights(self._cursor.speeds)


@dataclasses.dataclass(frozen=True)
class Oracle:
  """Shares ∝ the true speeds of the step being planned: base_speed / trace.factors(step).

  It reads the slowdown trace, so it exists only for benchmarks, as the best any policy could
  do with perfect foresight (up to bucket rounding).

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

  def shares(self, step: int, history: Sequence[StepStats]) -> Shares:
    base = np.ones(self.rules.workers) if self.base_speed is None else np.array(self.base_speed)
    return self.rules.from_weights(base / self.trace.factors(step))
