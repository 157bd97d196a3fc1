"""Regime: a speed predictor that learns switching hosts (regimes, change points, transitions).

A host that is shared flips between a few speed levels: fast while alone, k× slower while a
neighbour runs, back again. Smoothing predictors (EWMA, AR, NARX) average the levels and lag
behind each flip; last value follows a flip one step late and knows nothing of what comes
next. `Regime` models each worker's log speed as a hidden Markov chain over a few levels and
learns both the levels and the transition probabilities online from the observed speeds:

* **Regimes (change points).** Each worker keeps up to ``states`` levels (log speed, a running
  mean of the observations assigned to it, weight max(α, 1/n)). An observation within the
  worker's noise limit of a known level (the larger of log(1 + ``threshold``) and
  ``noise_multiple`` × its typical in-regime deviation, as `ShiftDetector` learns it) belongs to
  that level: a switch to a regime seen before is recognised at once, with no lag and no
  re-learning. One further away is a change point: a new level (in a free slot, else in the
  least-visited one). A new level left again after one step, back to where it came from, was a
  blip (an overrun, a scheduler spike): its slot is dropped and the two steps count as stays.
* **Transitions.** Per worker, counts of regime a → regime b, forgotten with horizon
  ``horizon`` steps. The probability of staying is pooled across workers (empirical Bayes):
  p_stay = (stays + m·π) / (visits + m), π the pooled stay rate of all workers (with a prior
  of ``persistence`` worth ``prior`` transitions) and m = ``pooling``: one switching worker
  teaches the others how long spells last, which matters when a run is 15–30 steps long. A
  move goes to the other known regimes in proportion to their counts (+1).
* **Borrowed risk.** A worker seen at one level only is taken to be at its top speed (it has
  never been faster) and may drop, like the others that left their top regime, by their mean
  drop at their pooled rate (shrunk by its own stays). Without this a worker that has not
  flipped yet looks certain, gets a large share, and is the one that makes the step slow when it
  flips: with 64 workers someone does every step.
* **Decision.** The next step's speed of worker i is then a small discrete distribution (its
  levels, with the probabilities of its current regime's row). LB-BSP splits the batch in
  proportion to the speeds it is given and waits for the slowest worker, so what matters is not
  the mean speed but the expected makespan E[maxᵢ xᵢ / vᵢ]. With ``decision='makespan'``
  (default) the predictor scores a few point summaries of each distribution (the most likely
  level, the mean, the power means of order −1 (harmonic), −2, −4, −8, −32, and the slowest
  level) by the exact expected makespan of the proportional split they give
  (`expected_makespan`, independent workers) and returns the best: the speeds whose split is
  the least risky. On 4 workers flipping 3× with stay 0.9 that is mostly the most likely level;
  on 64 or 1024 workers someone always flips, the slowest level wins and the split is uniform,
  which is the causal optimum there (last value, EWMA, AR and NARX are 4–11% slower).
  ``'mean'`` returns E[v], ``'mode'`` the most likely level.

Only observed speeds enter (the exogenous ``load`` is ignored: it is the emulated slowdown
itself), so the predictor is causal: its prediction after step t is a function of the speeds of
steps 0 … t. What no causal predictor can know is *when* a memoryless switch comes; the best it
can do is the expected-makespan optimum given the current regimes and the transition matrix,
which `Regime` approaches as its estimates converge (`balance/_markov_limit.py` computes that
limit with the true chain).

The state (`RegimeState`) is a pytree of numpy arrays of shapes fixed by ``init`` and one step
count, saved and restored with the policy like every predictor's.

Example::

  >>> p = Regime()
  >>> s = p.init(1)
  >>> for v in [3.0, 3.0, 1.0, 1.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0]:  # flips between 3 and 1
  ...   s = p.update(s, np.array([v]), None)
  >>> np.exp(s.level[0, :2]).round(2)   # both levels learned
  array([3., 1.])
  >>> p.predict(s).round(2)   # fast now: fast next (one worker: no makespan risk to hedge)
  array([1.])
"""

from __future__ import annotations

import dataclasses
import enum

import jax
import numpy as np

from hetjax._checks import positive_int
from hetjax._errors import ConfigError, parse_choice
from hetjax.balance._predictors import checked_speeds


class Decision(enum.Enum):
  """What `Regime.predict` returns from each worker's next-step speed distribution."""

  MAKESPAN = 'makespan'  # the summary whose proportional split has the least expected makespan
  MEAN = 'mean'          # the expected next-step speed
  MODE = 'mode'          # the most likely next regime's level


#: Decision.MAKESPAN scores the power means of order −q for these q (`_power_mean`): 1 is the
#: harmonic mean, larger ones weigh the slow levels more.
_ORDERS = (1.0, 2.0, 4.0, 8.0, 32.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RegimeState:
  """`Regime`'s state: per worker, its regimes and the transitions between them.

  Attributes:
    level: each regime's log speed, float64[workers, states] (0 in unused slots).
    count: observations assigned to each regime, float64[workers, states] (0: unused slot).
    trans: discounted transition counts, float64[workers, states, states], [a, b] for a → b.
    current: the regime of the last observation, int64[workers].
    previous: the regime before it, int64[workers].
    fresh: 1 where the current regime was created by the last observation, int64[workers].
    scale: typical |log speed − level| of in-regime observations, float64[workers].
    quiet: in-regime observations ``scale`` was learned from, float64[workers].
    seen: steps seen.
  """

  level: np.ndarray
  count: np.ndarray
  trans: np.ndarray
  current: np.ndarray
  previous: np.ndarray
  fresh: np.ndarray
  scale: np.ndarray
  quiet: np.ndarray
  seen: int


@dataclasses.dataclass(frozen=True)
class Regime:
  """Online per-worker regime model with pooled transition probabilities (module docstring).

  Args:
    states: most regimes (speed levels) a worker keeps, >= 2.
    threshold: smallest relative move that can be a change point (0.3: 30%).
    noise_multiple: a change point is also beyond this many typical in-regime deviations.
    alpha: floor of a level's running-mean weight (how fast a level follows a drift).
    horizon: transition counts are forgotten with weight 1 − 1/horizon per step.
    pooling: weight m, in transitions, of the pooled stay rate in each worker's.
    persistence: the prior stay rate, before any transition is seen (regimes last: LB-BSP's
      premise; without it the first few switches make every worker look as likely to flip as
      not, and the split hedges to uniform).
    prior: the prior's weight, in transitions.
    decision: `Decision` (or its name): what `predict` returns.
  """

  states: int = 3
  threshold: float = 0.3
  noise_multiple: float = 3.0
  alpha: float = 0.1
  horizon: float = 100.0
  pooling: float = 16.0
  persistence: float = 0.9
  prior: float = 4.0
  decision: Decision | str = Decision.MAKESPAN
  name: str = dataclasses.field(default='regime', init=False)

  def __post_init__(self):
    object.__setattr__(self, 'decision', parse_choice(Decision, self.decision, 'regime decision'))
    if (self.states < 2 or not self.threshold > 0 or not self.noise_multiple >= 0
        or not 0 < self.alpha <= 1 or not self.horizon >= 1 or not self.pooling >= 0
        or not 0 < self.persistence < 1 or not self.prior > 0):
      raise ConfigError(f'Regime needs states >= 2, threshold > 0, noise_multiple >= 0, '
                        f'0 < alpha <= 1, horizon >= 1, pooling >= 0, 0 < persistence < 1 and '
                        f'prior > 0; got states={self.states}, threshold={self.threshold}, '
                        f'noise_multiple={self.noise_multiple}, alpha={self.alpha}, '
                        f'horizon={self.horizon}, pooling={self.pooling}, '
                        f'persistence={self.persistence}, prior={self.prior}')

  def init(self, workers: int) -> RegimeState:
    n, k = positive_int(workers, 'predictor workers'), int(self.states)
    zeros = np.zeros(n, dtype=np.int64)
    return RegimeState(np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k, k)), zeros, zeros,
                       zeros, np.zeros(n), np.zeros(n), 0)

  def update(self, state: RegimeState, speeds: np.ndarray,
             load: np.ndarray | None) -> RegimeState:
    n = state.level.shape[0]
    y = np.log(np.maximum(checked_speeds(speeds, n), 1e-300))
    rows = np.arange(n)
    if not state.seen:
      level, count = state.level.copy(), state.count.copy()
      level[:, 0], count[:, 0] = y, 1.0
      zeros = np.zeros(n, dtype=np.int64)
      return RegimeState(level, count, state.trans.copy(), zeros, zeros, zeros,
                         state.scale.copy(), state.quiet.copy(), 1)
    level, count = state.level.copy(), state.count.copy()
    trans = state.trans * (1.0 - 1.0 / self.horizon)
    cur, prev = state.current, state.previous
    gap = np.where(count > 0, np.abs(y[:, None] - level), np.inf)
    near = np.argmin(gap, axis=1)
    limit = np.maximum(np.log1p(self.threshold), self.noise_multiple * state.scale)
    known = gap[rows, near] <= limit
    # A level created last step and left straight back to the regime before it: a blip. Drop
    # its slot and count both steps as stays of the regime it interrupted.
    blip = (state.fresh == 1) & known & (near == prev) & (prev != cur)
    b = np.flatnonzero(blip)
    count[b, cur[b]], level[b, cur[b]] = 0.0, 0.0
    trans[b, cur[b], :], trans[b, :, cur[b]] = 0.0, 0.0
    trans[b, prev[b], prev[b]] += 1.0  # the step before the blip's ( +1 below: this one)
    cur = np.where(blip, prev, cur)
    # Change points: a new level in a free slot, else in the least-visited slot but the current.
    free = count == 0
    spare = np.where(free, -1.0, count)
    spare[rows, cur] = np.inf
    slot = np.argmin(spare, axis=1)
    target = np.where(known, near, slot)
    new = np.flatnonzero(~known)
    count[new, slot[new]], level[new, slot[new]] = 0.0, y[new]
    trans[new, slot[new], :], trans[new, :, slot[new]] = 0.0, 0.0
    # The level's running mean, the noise scale (from in-regime observations only), the counts.
    residual = np.abs(y - level[rows, target])
    count[rows, target] += 1.0
    weight = np.maximum(self.alpha, 1.0 / count[rows, target])
    level[rows, target] += weight * (y - level[rows, target])
    quiet = state.quiet + known
    w = np.maximum(0.1, 1.0 / np.maximum(quiet, 1.0))
    scale = np.where(known, (1 - w) * state.scale + w * residual, state.scale)
    trans[rows, cur, target] += 1.0
    fresh = (~known).astype(np.int64)
    return RegimeState(level, count, trans, target.astype(np.int64), cur.astype(np.int64),
                       fresh, scale, quiet, state.seen + 1)

  def distribution(self, state: RegimeState) -> tuple[np.ndarray, np.ndarray]:
    """Each worker's next-step speeds and their probabilities, float64[workers, states] each
    (probability 0 on unused slots).

    A worker with one known regime borrows the others' experience: it is at its own top speed
    (it has never been faster), so it may drop by the pooled mean drop seen when other workers
    left their top regime, at the pooled rate of leaving a top regime (shrunk by its own stays).
    Without that, a worker that has not flipped yet looks certain, gets a large share and is the
    one that makes the step slow when it does flip (64 workers: someone flips every step).
    """
    if not state.seen:
      raise ConfigError('predict() before any update()')
    n = state.level.shape[0]
    rows = np.arange(n)
    active = state.count > 0
    level = state.level.copy()
    visits = state.trans.sum(axis=2)  # [n, k]
    stays = np.einsum('nkk->nk', state.trans)
    a = self.prior * self.persistence  # the prior's stays, out of self.prior transitions
    pooled = (stays.sum() + a) / (visits.sum() + self.prior)
    cur = state.current
    moves = np.where(active, state.trans[rows, cur] + 1.0, 0.0)
    moves[rows, cur] = 0.0
    total = moves.sum(axis=1)
    alone = total == 0  # a single known regime: nowhere to move to that it has seen
    # Leaving a top regime, pooled over workers: how often, and by how much (log speed).
    top = np.argmax(np.where(active, level, -np.inf), axis=1)
    top_stays, top_visits = stays[rows, top], visits[rows, top]
    left = state.trans[rows, top] * active
    left[rows, top] = 0.0
    drop_weight = left.sum()
    drop = (left * (level - level[rows, top][:, None])).sum() / max(drop_weight, 1e-300)
    top_rate = (top_stays.sum() + a) / (top_visits.sum() + self.prior)
    prior = np.where(alone, top_rate, pooled)
    p_stay = (stays[rows, cur] + self.pooling * prior) / (visits[rows, cur] + self.pooling)
    share_of_move = (1 - p_stay) / np.maximum(total, 1e-300)
    probs = np.where(alone[:, None], 0.0, moves * share_of_move[:, None])
    probs[rows, cur] = np.where(alone, 1.0, p_stay)
    if drop_weight > 0 and drop < 0:  # workers seen alone get a virtual lower regime
      a = np.flatnonzero(alone)
      spare = np.argmin(active[a], axis=1)  # a free slot (k >= 2, one regime in use)
      level[a, spare] = level[a, cur[a]] + drop
      probs[a, spare] = 1.0 - p_stay[a]
      probs[a, cur[a]] = p_stay[a]
    return np.exp(level), probs

  def predict(self, state: RegimeState) -> np.ndarray:
    speeds, probs = self.distribution(state)
    mean = (probs * speeds).sum(axis=1)
    mode = speeds[np.arange(len(speeds)), np.argmax(probs, axis=1)]
    if self.decision is Decision.MEAN:
      return mean
    if self.decision is Decision.MODE:
      return mode
    candidates = [mode, mean, *(_power_mean(speeds, probs, q) for q in _ORDERS),
                  np.min(np.where(probs > 0, speeds, np.inf), axis=1)]
    scores = [expected_makespan(c / c.sum(), speeds, probs) for c in candidates]
    return candidates[int(np.argmin(scores))]


def _power_mean(speeds: np.ndarray, probs: np.ndarray, order: float) -> np.ndarray:
  """(Σₖ pₖ vₖ^(−order))^(−1/order) per worker, the power mean of order −``order``: 1 is the
  harmonic mean (the speed of the expected time), larger ones approach the slowest level."""
  log_v = np.log(speeds)
  z = -order * log_v
  top = np.max(np.where(probs > 0, z, -np.inf), axis=1, keepdims=True)
  total = (probs * np.exp(np.where(probs > 0, z - top, 0.0))).sum(axis=1)
  return np.exp(-(top[:, 0] + np.log(total)) / order)


def expected_makespan(shares: np.ndarray, speeds: np.ndarray, probs: np.ndarray) -> float:
  """E[maxᵢ sharesᵢ / vᵢ], independent workers, worker i at speed speeds[i, k] w.p. probs[i, k].

  Exact: the candidate times sorted, P(max <= t) = Πᵢ Fᵢ(t) updated one entry at a time
  (O(n·k log(n·k))). Entries of probability 0 are ignored; each row of ``probs`` sums to 1.

  Example::

    >>> expected_makespan(np.array([1.0, 1.0]), np.array([[1.0, 0.5], [1.0, 0.5]]),
    ...                   np.full((2, 2), 0.5))   # max time 1 w.p. 1/4, else 2
    1.75
  """
  times = np.asarray(shares, dtype=np.float64)[:, None] / speeds
  keep = probs > 0
  worker = np.nonzero(keep)[0]
  t, p = times[keep], probs[keep]
  order = np.argsort(t, kind='stable')
  t, p, worker = t[order], p[order], worker[order]
  # Each entry's worker CDF after it: a cumulative sum within the worker, in time order.
  by_worker = np.argsort(worker, kind='stable')  # stable: time order within each worker
  sums = np.cumsum(p[by_worker])
  starts = np.searchsorted(worker[by_worker], worker[by_worker])  # each group's first entry
  after = np.empty(len(t))
  after[by_worker] = sums - sums[starts] + p[by_worker][starts]
  before = after - p
  first = before <= 1e-12
  log_step = np.log(np.maximum(after, 1e-300)) - np.where(first, 0.0,
                                                          np.log(np.maximum(before, 1e-300)))
  unseen = len(shares) - np.cumsum(first)
  joint = np.where(unseen == 0, np.exp(np.minimum(np.cumsum(log_step), 0.0)), 0.0)
  return float(np.sum(t * np.diff(joint, prepend=0.0)))
