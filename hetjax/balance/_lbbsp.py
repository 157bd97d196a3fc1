"""LB-BSP, CPU mode: shares follow predicted speeds, moved cautiously at iteration boundaries.

Each step the predictor sees every worker's observed speed vᵢ = xᵢ / tᵢ (and host load), and
the target split makes the predicted slowest worker finish earliest (``rules.from_weights``:
xᵢ ∝ v̂ᵢ up to bucket rounding). Following the target blindly over-reacts to noise and can
oscillate, so the move is guarded by the predicted gain g = makespan(current) / makespan(target)
− 1, both under the predicted speeds:

* g ≤ ``dead_band``: keep the current shares (a 1-bucket shuffle for a 1% speed wobble gains
  nothing, may cost a compile for the new share size, and feeds noise into the next reading);
* ``dead_band`` < g ≤ ``jump``: move ``damping`` of the way (a drift or a noisy reading);
* g > ``jump``, or the first decision where a change costs no compile: go straight to the
  target (a regime change such as a new straggler; waiting costs a whole slow step per step of
  delay).

The dead band is on predicted time rather than per-share change because with coarse buckets a
one-bucket difference on the straggler can be worth ~5% of the step (X = 4096 in 64-row buckets,
speeds (1, 1, 1, ⅓): 7 buckets on the straggler is 91% of the ideal speedup, 6 buckets 96%).

A step's time is not always rows × a cost: on a GPU at small batch, and on a loaded CPU at small
shares, most of it is a fixed cost (dispatch, launches, the step's own overhead). With a fixed
cost a split ∝ speed over-feeds the fast workers and predicts gains that are not there, and a
policy that reads them moves rows for nothing. So each worker's time is a fixed part plus a
per-row part, tᵢ(x) = (φ·uᵢ + (1 − φ)·x) / vᵢ with uᵢ its uniform share: φ is the fraction of a
uniform share's time that does not depend on its rows, the same for every worker (slowdowns
scale a host's whole step), and vᵢ the worker's speed in "effective rows" per second, which the
predictor predicts. φ starts at ``fixed_fraction`` (0: the paper's time ∝ rows; the emulated
hosts' calibrated fixed cost and per-row cost give it, `hetjax.run`), and is measured once
shares move: a worker whose share changed by at least a quarter of a uniform share between two
sampled steps gives one estimate of φ, the one that explains the ratio of its two times (its
speed taken as unchanged), and φ is the median of the last estimates of every worker (a
slowdown that changed between the two steps spoils an estimate; the median outvotes it). The
target then equalises finish times (`min_max_shares`: fixed plus per-row, in whole buckets).

A move must pay for itself, and the dead band alone does not see what a move costs. A move is
*costly* wherever the run reports compiles (`StepStats.worker_compile_s`: a real
run, even at a step that compiled nothing, since the next share size may need a program). The
virtual clock models none: there a move is free, and is made at once, as the paper's policy
does (a wrong one is undone at the next step at no cost). A costly move must also clear:

* **noise**: its predicted gain must exceed the step-time noise as measured (`NOISE_Z` × the
  median of the recent |log(makespan / the last one)| over clean steps of unchanged shares: a
  regime change moves it once, noise every step; a noisy machine's wobble of tens of percent
  would otherwise read as imbalance), and no move before `MIN_NOISE_SAMPLES` such steps, in all and
  since the last change (one noisy first step read as speeds sent rows to the wrong workers; a
  move is measured at its new shares before the next). A step whose every worker was padded
  to its emulated host's time with room to spare (`StepStats.worker_exact`) is a measurement
  without noise: there the noise counts as measured at once (waiting for it would cost a few
  uniform steps of a run whose hosts are declared);
* **cost**: the seconds it saves per step, times ``horizon`` steps (how long a split is
  expected to hold), must exceed what a change costs in compiles: the compile seconds the last
  change caused (the slowest worker's, summed from the step it was prepared for until a clean
  step after it), or the first program's compile before any change; a change that compiled
  nothing (shares in micro-batches of compiled programs) makes the next one free of this gate;
* **a second look**: under material noise, two decisions in a row must want it (`CONFIRM`), the
  same split to within a bucket a worker: one outlying step restarts a predictor's level and
  predicts a large gain once, and a first split read from a few noisy steps is rarely read
  again;

* **ready**: no step waits for its compile. The shares a move would go to ride on the held
  ones (`Shares.upcoming`) while every worker compiles what its new share needs on its
  background thread, and the move is made once every worker reports it can run its share
  without waiting (`StepStats.worker_ready`), to the split they prepared (within a bucket a
  worker of the target). On processes sharing a few cores a transformer's micro-batch program
  takes many steps' time to compile, which a move made at once waits for; held, the old shares
  keep running (on hosts padded to a declared time, mostly asleep) while it compiles. The
  preparing starts while the noise is measured where a compile has been seen to spoil no
  sample (hosts padded with room to spare); elsewhere a compile beside a step would spoil it
  as a sample, so it starts once the noise is measured;

and it goes all the way to its target (damping would pay the compile twice).

A step during which any worker compiled is no speed sample for anyone (`StepStats.sampled`): its
contention says nothing about the hosts.

Communication (LB-BSP's federated version): with ``transfer_s`` each worker's step is its
compute on its share plus its own transfer tᵢ, so the target minimises maxᵢ xᵢ / v̂ᵢ + tᵢ
(`min_max_shares`: every worker's compute plus transfer equal, up to buckets) and a worker on a
slow link gets fewer rows; the hedge and the dead band score the same times. The transfers are
the declared links priced by the one α–β model (`hetjax.emulation.Links.exchange_s` of the
program's gradient bytes), not measured: a synchronous combine gives each worker one time,
its own transfer plus its wait for the slowest, which cannot be told apart. Known in advance,
they keep the policy causal; equal transfers (a ring all-reduce, paced by its slowest link)
leave the compute-only split unchanged.

The predictor's state, the hedge, the fitted curve, the noise and the cost of a change are all
in `LBBSPState`, so a resumed run decides exactly as the uninterrupted one would have.

Example::

  policy = LBBSP(rules, EWMA())
  run = simulate_shares(policy, StaticTrace((1, 1, 1, 3)), ClockCosts(per_sample_s=1e-3), 4096, 20)
  # step 0 uniform, step 1 balanced (2.4x faster), unchanged from then on
  links = LBBSP(rules, EWMA(), transfer_s=(0, 0, 0, 0.5))  # worker 3: 0.5 s of transfer a step
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import numpy as np

from hetjax._errors import ConfigError
from hetjax.balance._policy import (
  load_of,
  observed_speeds,
  shares_array,
  shares_of,
  transfer_of,
)
from hetjax.balance._predictors import SpeedPredictor
from hetjax.balance._simple import min_max_shares
from hetjax.core import ShareRules, Shares, StepStats

#: Noise samples (pairs of clean steps of unchanged shares) measured before a costly move, both
#: in all and since the last change (a move is measured at its new shares before the next).
MIN_NOISE_SAMPLES = 3
#: Under material noise (its band at least half the dead band) and where a change costs
#: compiles, consecutive decisions that must want a move before it is made: one outlying step (a
#: 3x scheduler spike on a loaded machine) restarts a predictor's level and predicts a large gain
#: for one decision only. Hosts whose steps are padded to a declared time have no such noise and
#: move at once.
CONFIRM = 2
#: A move's predicted gain must exceed this many times the measured noise (the median error):
#: 1.5 held a static straggler under a per-worker noise of CV 0.4 (the virtual clock, 100 steps,
#: 3 seeds) to 5–7 changes where 1.0 made 9–12, at a better mean step than either 1.0 or 3.0.
NOISE_Z = 1.5
_NOISE_WINDOW = 9  # recent makespan errors whose median is the noise
_FIT_WINDOW = 15  # recent estimates of φ whose median is used
_FIT_MOVE = 0.25  # a share change of at least this fraction of a uniform share estimates φ
_FIT_MIN = 3  # estimates before φ replaces its prior
_MAX_FRACTION = 0.95


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LBBSPState:
  """What `LBBSP` has learned.

  Attributes:
    shares: the shares in force (the next step's), int64[workers].
    speeds: the speeds observed at the last step, float64[workers] (zeros before any), in
      effective rows (``fraction``) per second.
    steps: steps learned from. Before the first one there is no proposal to score, and where
      moves are free (the virtual clock) the first decision goes straight to its target.
    predictor: the speed predictor's state.
    edge: the discounted log-makespan advantage of the proposals over uniform shares.
    proposal: the shares proposed at the last step (all of the predictor's target, before the
      hedge), int64[workers]; uniform before any step.
    fraction: φ, the fixed fraction of a uniform share's time in use.
    errors: the recent |log(makespan / the last one)| of clean steps of unchanged shares,
      float64[window] (NaN: none yet).
    samples: errors recorded.
    move_cost_s: the compile seconds a change of the shares is expected to cost.
    open_cost_s: compile seconds since a change was prepared for or made, until a clean step
      after it (NaN: no change awaiting its cost).
    rows: each worker's share at its last sampled step, float64[workers] (NaN: none yet).
    times: its busy seconds then, float64[workers].
    estimates: the recent estimates of φ, float64[window] (NaN: empty), a ring.
    seen: estimates written to the ring.
    wanted: consecutive decisions whose gain cleared the bands without a move (`CONFIRM`).
    settled: errors recorded since the last change of the shares.
    pending: the shares the last decision held for a second look (`Shares.upcoming`),
      int64[workers]; zeros when none.
    immune: a step has compiled and still sampled every worker (hosts padded with room to
      spare): a move is then prepared while the noise is measured, too.
  """

  shares: np.ndarray
  speeds: np.ndarray
  steps: int
  predictor: Any
  edge: float
  proposal: np.ndarray
  fraction: float = 0.0
  errors: np.ndarray = dataclasses.field(default_factory=lambda: np.full(_NOISE_WINDOW, np.nan))
  samples: int = 0
  move_cost_s: float = 0.0
  open_cost_s: float = float('nan')
  rows: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
  times: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
  estimates: np.ndarray = dataclasses.field(default_factory=lambda: np.full(_FIT_WINDOW, np.nan))
  seen: int = 0
  wanted: int = 0
  settled: int = 0
  pending: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
  immune: bool = False


@dataclasses.dataclass(frozen=True)
class LBBSP:
  """Semi-dynamic load balancing from predicted speeds (LB-BSP, CPU clusters).

  Args:
    rules: the job's share rules.
    predictor: next-step speed predictor (its settings: its state is in `LBBSPState`).
    damping: fraction of the way to the target moved on a moderate predicted gain (when a
      change costs no compile).
    dead_band: predicted relative gain at or below which the shares are kept (the measured
      noise raises it).
    jump: predicted relative gain above which the target is taken at once.
    transfer_s: each worker's own transfer a step, seconds (module docstring); empty: compute
      only.
    fixed_fraction: φ before it is fitted: the fraction of a uniform share's step time that does
      not depend on the rows (0: time ∝ rows). `make_policy` sets it from what the hosts are
      known to cost (`KnownCosts.fixed_fraction`: a run's calibrated fixed and per-row costs).
    horizon: steps a new split is expected to hold: a change's compile cost is weighed against
      its saving over them.
  """

  rules: ShareRules
  predictor: SpeedPredictor
  damping: float = 0.5
  dead_band: float = 0.1
  jump: float = 0.25
  transfer_s: tuple[float, ...] = ()
  fixed_fraction: float = 0.0
  horizon: int = 50

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
    if not 0 <= self.fixed_fraction < 1 or self.horizon < 1:
      raise ConfigError(f'LB-BSP needs 0 <= fixed_fraction < 1 and horizon >= 1; got '
                        f'fixed_fraction={self.fixed_fraction}, horizon={self.horizon}')
    object.__setattr__(self, 'transfer_s', transfer_of(self.transfer_s, self.rules.workers))
    object.__setattr__(self, 'fixed_fraction', float(self.fixed_fraction))

  @property
  def name(self) -> str:
    return f'lbbsp-{self.predictor.name}'

  def init(self) -> LBBSPState:
    n, uniform = self.rules.workers, shares_array(self.rules.uniform())
    return LBBSPState(uniform, np.zeros(n), 0, self.predictor.init(n), self.OPTIMISM, uniform,
                      fraction=self.fixed_fraction, rows=np.full(n, np.nan),
                      times=np.full(n, np.nan), pending=np.zeros(n, np.int64))

  # -- the time model ------------------------------------------------------------------------------

  @functools.cached_property
  def _uniform_rows(self) -> np.ndarray:
    return np.asarray(self.rules.uniform().values, dtype=np.float64)

  def _uniform(self) -> np.ndarray:
    return self._uniform_rows

  def _effective(self, rows, fraction: float) -> np.ndarray:
    """Effective rows φ·uᵢ + (1 − φ)·xᵢ: what a worker's time is proportional to."""
    return fraction * self._uniform() + (1 - fraction) * np.asarray(rows, dtype=np.float64)

  def _times(self, shares, speeds: np.ndarray, fraction: float) -> np.ndarray:
    """Each worker's predicted step: effective rows over speed, plus its own transfer."""
    time = self._effective(shares, fraction) / speeds
    return time + np.asarray(self.transfer_s, dtype=np.float64) if self.transfer_s else time

  def _makespan(self, shares, speeds: np.ndarray, fraction: float) -> float:
    return float(np.max(self._times(shares, speeds, fraction)))

  def _estimates(self, x1: np.ndarray, t1: np.ndarray, x2: np.ndarray,
                 t2: np.ndarray) -> np.ndarray:
    """φ for each worker whose share moved by `_FIT_MOVE` of its uniform share between two
    sampled steps (NaN for the others): (φu + (1 − φ)x₂) / (φu + (1 − φ)x₁) = t₂ / t₁, the
    worker's speed taken as unchanged; clipped to [0, `_MAX_FRACTION`]."""
    u = self._uniform()
    with np.errstate(divide='ignore', invalid='ignore'):
      ratio = t2 / t1
      phi = (ratio * x1 - x2) / (u * (1 - ratio) - x2 + ratio * x1)
    moved = np.isfinite(phi) & (np.abs(x2 - x1) >= _FIT_MOVE * u)
    return np.where(moved, np.clip(phi, 0.0, _MAX_FRACTION), np.nan)

  # -- one decision --------------------------------------------------------------------------------

  def update(self, state: LBBSPState, stats: StepStats | None) -> tuple[Shares, LBBSPState]:
    if stats is None:
      return shares_of(state.shares, self.rules), state
    n = self.rules.workers
    rows = np.asarray(stats.rows, dtype=np.float64)
    busy = np.asarray(stats.compute_s, dtype=np.float64)
    sampled = np.asarray(stats.sampled, dtype=bool) if stats.sampled else np.ones(n, bool)
    clean = bool(sampled.all()) and len(rows) == n
    # The noise: how much the makespan moved between two clean steps of the same shares.
    errors, samples, settled = state.errors, state.samples, state.settled
    usable = clean and np.isfinite(busy).all() and (busy > 0).all()
    if usable and np.array_equal(rows, state.rows) and np.isfinite(state.times).all():
      errors = np.roll(errors, 1)
      errors[0] = min(abs(float(np.log(busy.max() / state.times.max()))), 1.0)
      samples, settled = samples + 1, settled + 1
    # What a change costs: the compiles it caused, every worker's, until a step is clean.
    compiled = float(np.max(stats.worker_compile_s, initial=0.0))
    # A step that compiled and still sampled every worker: hosts padded with room to spare,
    # whose samples a background compile does not spoil (so a move may be prepared at once).
    immune = state.immune or (compiled > 0 and clean)
    move_cost, open_cost = state.move_cost_s, state.open_cost_s
    if state.steps == 0:
      move_cost = compiled  # the first program's compile: what a new share size may cost
    elif np.isfinite(open_cost):
      open_cost += compiled
    # The curve: φ from the workers whose share moved since their last sampled step.
    seen, xs, ts, estimates = state.seen, state.rows, state.times, state.estimates
    if usable:
      new = self._estimates(xs, ts, rows, busy)
      new = new[np.isfinite(new)]
      if len(new):
        estimates = estimates.copy()
        estimates[(seen + np.arange(len(new))) % _FIT_WINDOW] = new
        seen += len(new)
      xs, ts = rows, busy
    fraction = (float(np.nanmedian(estimates)) if np.isfinite(estimates).sum() >= _FIT_MIN
                else self.fixed_fraction)
    effective = dataclasses.replace(stats, rows=tuple(self._effective(rows, fraction).tolist()))
    speeds = observed_speeds(effective, state.speeds if state.steps else None)
    load = load_of(stats)
    predictor = self.predictor.update(
        state.predictor, speeds, load if load is None or len(load) == len(speeds) else None)
    edge = state.edge
    uniform = self.rules.uniform()
    if state.steps:  # score the last proposal against uniform, with what happened
      edge = self.MEMORY * edge + float(np.log(self._makespan(uniform, speeds, fraction) /
                                               self._makespan(state.proposal, speeds, fraction)))
    predicted = self.predictor.predict(predictor)
    proposal = self._proposal(predicted, fraction)
    noise = float(np.nanmedian(errors)) if samples else 0.0
    exact = bool(stats.worker_exact) and all(stats.worker_exact)  # no noise to wait out
    measured = exact or min(samples, settled) >= MIN_NOISE_SAMPLES
    shares, wants = self._decide(stats, state.steps == 0, predicted, proposal, edge, fraction,
                                 noise if measured else None,
                                 move_cost,
                                 state.wanted, state.pending, immune)
    moved = shares.values != tuple(int(x) for x in rows)
    changing = moved or shares.upcoming is not None  # a change, or one prepared for
    if changing and state.steps and not np.isfinite(open_cost):
      open_cost = 0.0  # its compile seconds are counted from the next step on
    elif not changing and np.isfinite(open_cost) and clean:
      move_cost, open_cost = open_cost, float('nan')  # done: what the change cost
    wanted = state.wanted + 1 if wants and not moved else 0
    pending = (np.zeros(n, np.int64) if shares.upcoming is None
               else np.asarray(shares.upcoming, np.int64))
    return shares, LBBSPState(shares_array(shares), speeds, state.steps + 1, predictor, edge,
                              shares_array(proposal), fraction, errors, samples, move_cost,
                              open_cost, xs, ts, estimates, seen, wanted,
                              0 if moved else settled, pending, immune)

  def _proposal(self, predicted: np.ndarray, fraction: float) -> Shares:
    """The split that finishes the predicted slowest worker earliest: xᵢ ∝ v̂ᵢ when time is
    proportional to rows and every transfer is alike (none, or a ring's), else the min-max
    split of fixed plus per-row time (and transfer)."""
    if fraction == 0 and len(set(self.transfer_s)) <= 1:
      return self.rules.from_weights(predicted)
    fixed = fraction * self._uniform() / predicted
    if self.transfer_s:
      fixed = fixed + np.asarray(self.transfer_s, dtype=np.float64)
    return min_max_shares(self.rules, (1 - fraction) / predicted, fixed)

  def _decide(self, stats: StepStats, first: bool, predicted: np.ndarray, proposal: Shares,
              edge: float, fraction: float, noise: float | None, move_cost_s: float,
              wanted: int, pending: np.ndarray, immune: bool = False) -> tuple[Shares, bool]:
    """The next shares, and whether they wanted to move (the gain cleared the bands): the
    hedged target, reached through the dead band (raised to the measured noise), a second
    look under noise, the cost of a change, and damping."""
    trust = 1.0 / (1.0 + np.exp(-edge / self.TEMPERATURE))
    u = np.asarray(self.rules.uniform().values, dtype=np.float64)
    target = self.rules.from_weights(u + trust * (np.asarray(proposal.values) - u))
    try:
      current = Shares(tuple(int(x) for x in stats.rows), self.rules)
    except ConfigError:
      current = None  # the last step ran under other rules: nothing to move from
    compiles = bool(stats.worker_compile_s)  # the run compiles programs: a change may cost one
    if current is None or (first and not compiles):
      return target, False  # a free move: a wrong one is undone at the next step at no cost
    now = self._makespan(current, predicted, fraction)
    then = self._makespan(target, predicted, fraction)
    gain = now / then - 1
    if gain <= max(self.dead_band, NOISE_Z * (noise or 0.0)):
      return current, False
    if (now - then) * self.horizon <= move_cost_s:
      return current, False  # it would not save what its compiles cost
    held = Shares(current.values, self.rules, upcoming=target.values)  # prepare its programs
    if noise is None and compiles:  # a costly move waits until the noise is measured, on quiet
      return (held if immune else current), False  # steps, unless a compile spoils none
    same = np.all(np.abs(np.asarray(target.values) - pending) <= self.rules.bucket)
    if NOISE_Z * (noise or 0.0) >= self.dead_band / 2 and compiles and (
        wanted + 1 < CONFIRM or not same):
      return held, True  # under material noise, a costly gain is acted on once seen twice
    if compiles and stats.worker_ready:
      if not same:
        return held, True  # prepared first: the workers compile it beside their steps
      prepared = Shares(tuple(int(x) for x in pending), self.rules)
      if not all(stats.worker_ready):  # a step never waits for a compile: hold until ready
        return Shares(current.values, self.rules, upcoming=prepared.values), True
      return prepared, True  # the split every worker compiled for (within a bucket of target)
    fraction_moved = 1.0 if gain > self.jump or compiles else self.damping
    x = np.asarray(current.values, dtype=np.float64)
    moved = self.rules.from_weights(x + fraction_moved * (np.asarray(target.values) - x))
    return (target if moved.values == current.values else moved), True
