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

Communication (LB-BSP's federated version): with ``transfer_s`` each worker's step is its
compute on its share plus its own transfer tᵢ, so the target minimises maxᵢ xᵢ / v̂ᵢ + tᵢ
(`min_max_shares`: every worker's compute plus transfer equal, up to buckets) and a worker on a
slow link gets fewer rows; the hedge and the dead band score the same times. The transfers are
the declared links priced by the one α–β model (`hetjax.emulation.Links.exchange_s` of the
program's gradient bytes), not measured: a synchronous combine gives each worker one time,
its own transfer plus its wait for the slowest, which cannot be told apart. Known in advance,
they keep the policy causal; equal transfers (a ring all-reduce, paced by its slowest link)
leave the compute-only split unchanged.

The predictor's state, the hedge and the current shares are all in `LBBSPState`, so a resumed
run decides exactly as the uninterrupted one would have.

Example::

  policy = LBBSP(rules, EWMA())
  run = simulate_shares(policy, StaticTrace((1, 1, 1, 3)), ClockCosts(per_sample_s=1e-3), 4096, 20)
  # step 0 uniform, step 1 balanced (2.4x faster), unchanged from then on
  links = LBBSP(rules, EWMA(), transfer_s=(0, 0, 0, 0.5))  # worker 3: 0.5 s of transfer a step
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import numpy as np

from hetjax._errors import ConfigError
from hetjax.balance._policy import (
  load_of,
  makespan,
  observed_speeds,
  shares_array,
  shares_of,
  transfer_of,
)
from hetjax.balance._predictors import SpeedPredictor
from hetjax.balance._simple import min_max_shares
from hetjax.core._shares import ShareRules, Shares
from hetjax.core._stats import StepStats


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LBBSPState:
  """What `LBBSP` has learned.

  Attributes:
    shares: the shares in force (the next step's), int64[workers].
    speeds: the speeds observed at the last step, float64[workers] (zeros before any).
    steps: steps learned from. Before the first one there is no proposal to score and the first
      decision goes straight to its target.
    predictor: the speed predictor's state.
    edge: the discounted log-makespan advantage of the proposals over uniform shares.
    proposal: the shares proposed at the last step (all of the predictor's target, before the
      hedge), int64[workers]; uniform before any step.
  """

  shares: np.ndarray
  speeds: np.ndarray
  steps: int
  predictor: Any
  edge: float
  proposal: np.ndarray


@dataclasses.dataclass(frozen=True)
class LBBSP:
  """Semi-dynamic load balancing from predicted speeds (LB-BSP, CPU clusters).

  Args:
    rules: the job's share rules.
    predictor: next-step speed predictor (its settings: its state is in `LBBSPState`).
    damping: fraction of the way to the target moved on a moderate predicted gain.
    dead_band: predicted relative gain at or below which the shares are kept.
    jump: predicted relative gain above which the target is taken at once.
    transfer_s: each worker's own transfer a step, seconds (module docstring); empty: compute
      only.
  """

  rules: ShareRules
  predictor: SpeedPredictor
  damping: float = 0.5
  dead_band: float = 0.1
  jump: float = 0.25
  transfer_s: tuple[float, ...] = ()

  # Hedging against uniform: after each step both LB-BSP's proposal and uniform shares are
  # scored on the speeds that actually happened (full information: no need to have played
  # them). The discounted log-makespan advantage `edge` sets how far the played target moves
  # from uniform toward the proposal: all the way while reacting pays (static, skewed, step
  # change), back toward uniform where it does not (many workers flipping independently:
  # whatever is fitted to the last step is wrong for the next). Starts trusting the proposal.
  OPTIMISM: ClassVar[float] = 0.5
  MEMORY: ClassVar[float] = 0.8
  TEMPERATURE: ClassVar[float] = 0.1

  def __post_init__(self):
    if not 0 < self.damping <= 1 or not 0 <= self.dead_band <= self.jump:
      raise ConfigError(f'LB-BSP needs 0 < damping <= 1 and 0 <= dead_band <= jump; got '
                        f'damping={self.damping}, dead_band={self.dead_band}, jump={self.jump}')
    object.__setattr__(self, 'transfer_s', transfer_of(self.transfer_s, self.rules.workers))

  @property
  def name(self) -> str:
    return f'lbbsp-{self.predictor.name}'

  def init(self) -> LBBSPState:
    n, uniform = self.rules.workers, shares_array(self.rules.uniform())
    return LBBSPState(uniform, np.zeros(n), 0, self.predictor.init(n), self.OPTIMISM, uniform)

  def update(self, state: LBBSPState, stats: StepStats | None) -> tuple[Shares, LBBSPState]:
    if stats is None:
      return shares_of(state.shares, self.rules), state
    uniform = self.rules.uniform()
    speeds = observed_speeds(stats, state.speeds if state.steps else None)
    load = load_of(stats)
    predictor = self.predictor.update(
        state.predictor, speeds, load if load is None or len(load) == len(speeds) else None)
    edge = state.edge
    if state.steps:  # score the last proposal against uniform, with what happened
      edge = self.MEMORY * edge + float(np.log(makespan(uniform, speeds, self.transfer_s) /
                                               makespan(state.proposal, speeds, self.transfer_s)))
    predicted = self.predictor.predict(predictor)
    proposal = self._proposal(predicted)
    shares = self._decide(stats, state.steps == 0, predicted, proposal, edge)
    return shares, LBBSPState(shares_array(shares), speeds, state.steps + 1, predictor, edge,
                              shares_array(proposal))

  def _proposal(self, predicted: np.ndarray) -> Shares:
    """The split that finishes the predicted slowest worker earliest: xᵢ ∝ v̂ᵢ when every
    transfer is alike (none, or a ring's), else the min-max split of compute plus transfer."""
    if len(set(self.transfer_s)) <= 1:
      return self.rules.from_weights(predicted)
    return min_max_shares(self.rules, 1.0 / predicted, self.transfer_s)

  def _decide(self, stats: StepStats, first: bool, predicted: np.ndarray, proposal: Shares,
              edge: float) -> Shares:
    """The next shares: the hedged target, reached through the dead band and damping."""
    trust = 1.0 / (1.0 + np.exp(-edge / self.TEMPERATURE))
    u = np.asarray(self.rules.uniform().values, dtype=np.float64)
    target = self.rules.from_weights(u + trust * (np.asarray(proposal.values) - u))
    try:
      current = Shares(tuple(int(x) for x in stats.rows), self.rules)
    except ConfigError:
      current = None  # the last step ran under other rules: nothing to move from
    if current is None or first:
      return target
    gain = (makespan(current, predicted, self.transfer_s) /
            makespan(target, predicted, self.transfer_s) - 1)
    if gain <= self.dead_band:
      return current
    fraction = 1.0 if gain > self.jump else self.damping
    x = np.asarray(current.values, dtype=np.float64)
    moved = self.rules.from_weights(x + fraction * (np.asarray(target.values) - x))
    return target if moved.values == current.values else moved
