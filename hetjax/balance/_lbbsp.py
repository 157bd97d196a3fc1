"""LB-BSP, CPU mode: shares follow predicted speeds, moved cautiously at iteration boundaries.

Each step the predictor sees every worker's observed speed vᵢ = xᵢ / tᵢ (and host load), and
the target split makes the predicted slowest worker finish earliest (``rules.from_weights``:
xᵢ ∝ v̂ᵢ up to bucket rounding). Following the target blindly over-reacts to noise and can
oscillate, so the move is guarded by the predicted gain g = makespan(current) / makespan(target)
− 1, both under the predicted speeds:

* g ≤ ``dead_band``: keep the current shares (a 1-bucket shuffle for a 1% speed wobble gains
  nothing, may cost a compile for the new share size, and feeds noise into the next reading);
* ``dead_band`` < g ≤ ``jump``: move ``damping`` of the way (a drift or a noisy reading);
* g > ``jump``, or the first decision: go straight to the target (a regime change such as a
  new straggler; waiting costs a whole slow step per step of delay).

The dead band is on predicted time rather than per-share change because with coarse buckets a
one-bucket difference on the straggler can be worth ~5% of the step (X = 4096 in 64-row buckets,
speeds (1, 1, 1, ⅓): 7 buckets on the straggler is 91% of the ideal speedup, 6 buckets 96%).

Example::

  policy = LBBSP(rules, EWMA())
  run = simulate(policy, StaticTrace((1, 1, 1, 3)), CostModel(per_sample_s=1e-3), 4096, 20)
  # step 0 uniform, step 1 balanced (2.4x faster), unchanged from then on
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.balance._policy import HistoryCursor, load_of, makespan
from hetjax.balance._predictors import SpeedPredictor
from hetjax.balance._shares import ShareRules, Shares
from hetjax.runtime._virtual_clock import StepStats


class LBBSP:
  """Semi-dynamic load balancing from predicted speeds (LB-BSP, CPU clusters).

  Args:
    rules: the job's share rules.
    predictor: next-step speed predictor; a pristine copy is kept, so a new run (a history
      shorter than the last one seen) starts from an untrained predictor.
    damping: fraction of the way to the target moved on a moderate predicted gain.
    dead_band: predicted relative gain at or below which the shares are kept.
    jump: predicted relative gain above which the target is taken at once.
  """

  def __init__(self, rules: ShareRules, predictor: SpeedPredictor, damping: float = 0.5,
               dead_band: float = 0.1, jump: float = 0.25):
    if not 0 < damping <= 1 or not 0 <= dead_band <= jump:
      raise ConfigError(f'LB-BSP needs 0 < damping <= 1 and 0 <= dead_band <= jump; got '
                        f'damping={damping}, dead_band={dead_band}, jump={jump}')
    self.rules, self.damping, self.dead_band, self.jump = rules, damping, dead_band, jump
    self.predictor = predictor
    self._pristine = copy.deepcopy(predictor)
    self._cursor = HistoryCursor()
    self._decided = False
    self._proposal: Shares | None = None
    self._edge = self.OPTIMISM

  # Hedging against uniform: after each step both LB-BSP's proposal and uniform shares are
  # scored on the speeds that actually happened (full information: no need to have played
  # them). The discounted log-makespan advantage `_edge` sets how far the played target moves
  # from uniform toward the proposal: all the way while reacting pays (static, skewed, step
  # change), back toward uniform where it does not (many workers flipping independently:
  # whatever is fitted to the last step is wrong for the next). Starts trusting the proposal.
  OPTIMISM = 0.5
  MEMORY = 0.8
  TEMPERATURE = 0.1

  @property
  def name(self) -> str:
    return f'lbbsp-{self.predictor.name}'

  def shares(self, step: int, history: Sequence[StepStats]) -> Shares:
    restarted, new = self._cursor.advance(history)
    if restarted:
      self.predictor, self._decided = copy.deepcopy(self._pristine), False
      self._proposal, self._edge = None, self.OPTIMISM
    uniform = self.rules.uniform()
    for stats, speeds in new:
      load = load_of(stats)
      self.predictor.update(speeds, load if load is None or len(load) == len(speeds) else None)
      if self._proposal is not None:  # score last proposal against uniform, with what happened
        edge = np.log(makespan(uniform, speeds) / makespan(self._proposal, speeds))
        self._edge = self.MEMORY * self._edge + edge
    if not history:
      return uniform
    predicted = self.predictor.predict()
    self._proposal = self.rules.from_weights(predicted)
    trust = 1.0 / (1.0 + np.exp(-self._edge / self.TEMPERATURE))
    u = np.asarray(uniform.values, dtype=np.float64)
    target = self.rules.from_weights(u + trust * (np.asarray(self._proposal.values) - u))
    try:
      current = Shares(tuple(int(x) for x in history[-1].shares), self.rules)
    except ConfigError:
      current = None  # the last step ran under other rules: nothing to move from
    if current is None or not self._decided:
      self._decided = True
      return target
    gain = makespan(current, predicted) / makespan(target, predicted) - 1
    if gain <= self.dead_band:
      return current
    fraction = 1.0 if gain > self.jump else self.damping
    x = np.asarray(current.values, dtype=np.float64)
    moved = self.rules.from_weights(x + fraction * (np.asarray(target.values) - x))
    return target if moved.values == current.values else moved
