"""The causal limit under Markov slowdowns: the best share policy that cannot see the future.

Under `hetjax.emulation.MarkovTrace` every affected worker keeps its state (fast, factor 1, or
slow, factor ``slow``) with probability ``stay`` per step, independently of the others and of the
past. `MarkovLimit` knows that chain exactly (``stay``, ``slow``, which workers flip, the hosts'
``row_s`` and ``fixed_s``) and, after step t, every worker's state at t, which the speeds of step
t reveal. It picks step t + 1's shares to minimise the expected slowest-worker time over the
next states. That is the Bayes-optimal causal policy: given the chain, the states at t are all
the past says about t + 1, and shares change neither the chain nor what is observed (every
worker computes at least one bucket), so minimising each step's conditional expectation
minimises the mean. No causal policy beats it in expectation; on one finite trace one can be
luckier. The oracle (`hetjax.balance.Oracle`) knows the states at t + 1 as well; the gap between
the two is what not seeing a memoryless switch coming costs, whatever the predictor.

On 4 workers it searches every split exactly (all bucket splits, all next states); on more, the
workers in one state are interchangeable and the objective is convex, so the optimum gives each
state group one share: a 1-D convex search, then `ShareRules.from_weights` rounding.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from hetjax import emulation
from hetjax._errors import ConfigError
from hetjax.balance._regime import expected_makespan
from hetjax.balance._simple import SharesState
from hetjax.core import ShareRules, Shares

_BRUTE_FORCE_SPLITS = 20_000  # beyond this many bucket splits, the symmetric 1-D search


@dataclasses.dataclass(frozen=True)
class MarkovLimit:
  """The Bayes-optimal causal share policy for a known `MarkovTrace` (module docstring).

  Args:
    rules: the job's share rules (default bounds: at least one bucket a worker).
    trace: the Markov trace the run sees (read only at steps already finished, and step 0's
      known start: every worker fast).
    row_s: seconds per row at factor 1 (every worker the same).
    fixed_s: seconds per step whatever the rows, at factor 1.
  """

  rules: ShareRules
  trace: emulation.MarkovTrace
  row_s: float = 1.0
  fixed_s: float = 0.0
  name: str = dataclasses.field(default='causal-limit', init=False)

  def __post_init__(self):
    if not isinstance(self.trace, emulation.MarkovTrace):
      raise ConfigError(f'the causal limit needs a markov trace, got {self.trace.describe()!r}')
    if self.trace.workers != self.rules.workers:
      raise ConfigError(f'trace has {self.trace.workers} workers, rules {self.rules.workers}')

  def init(self) -> SharesState:
    return SharesState(np.asarray(self.plan(np.ones(self.rules.workers)).values))

  def update(self, state, stats):
    if stats is None:
      return Shares(tuple(int(v) for v in state.shares), self.rules), state
    shares = self.plan(self.trace.factors(stats.step), first=False)
    return shares, SharesState(np.asarray(shares.values))

  def plan(self, factors: np.ndarray, first: bool = True) -> Shares:
    """The shares minimising the expected next step given this step's ``factors`` (at step 0,
    ``first``: the chain's known start, every worker fast at that very step)."""
    t = self.trace
    affected = np.zeros(len(factors), dtype=bool)
    affected[np.arange(t.workers) if t.slow_workers is None else list(t.slow_workers)] = True
    slow_now = np.asarray(factors) > 1.0
    p_slow = np.where(slow_now, t.stay, 1.0 - t.stay) if not first else np.zeros(len(factors))
    p_slow = np.where(affected, p_slow, 0.0)
    inv_factor = np.array([1.0, 1.0 / t.slow])  # expected_makespan divides by a "speed"
    probs = np.stack([1.0 - p_slow, p_slow], axis=1)
    speeds = np.broadcast_to(inv_factor, probs.shape)

    def cost(units: np.ndarray) -> float:
      busy = self.fixed_s + units * self.rules.bucket * self.row_s  # at factor 1
      return expected_makespan(busy, speeds, probs)

    n, total = self.rules.workers, self.rules.global_batch // self.rules.bucket
    if math.comb(total - 1, n - 1) <= _BRUTE_FORCE_SPLITS and n <= 8:
      # Every split against every next state at once: E[max_i factor_i × busy_i].
      splits = np.array(list(_splits(total, n)), dtype=np.float64)  # [splits, n]
      slow_next = np.array(list(itertools.product((0, 1), repeat=n)), dtype=bool)  # [states, n]
      p_state = np.prod(np.where(slow_next, p_slow, 1.0 - p_slow), axis=1)
      busy = self.fixed_s + splits * self.rules.bucket * self.row_s
      factor = np.where(slow_next, t.slow, 1.0)
      step = (busy[:, None, :] * factor[None]).max(axis=2)  # [splits, states]
      best = splits[int(np.argmin(step @ p_state))]
      return Shares(tuple(int(u) * self.rules.bucket for u in best), self.rules)
    # One share per state group (interchangeable workers, convex objective): ternary search.
    group = slow_now & affected
    n_slow = int(group.sum())
    if n_slow in (0, n):
      return self.rules.uniform()

    def split(x_fast: float) -> np.ndarray:
      return np.where(group, (total - (n - n_slow) * x_fast) / n_slow, x_fast)

    lo, hi = 1.0, (total - n_slow) / (n - n_slow)
    for _ in range(60):
      a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
      lo, hi = (lo, b) if cost(split(a)) <= cost(split(b)) else (a, hi)
    return self.rules.from_weights(split((lo + hi) / 2))


def _splits(total: int, n: int):
  """Every way to write ``total`` as ``n`` positive integers."""
  for cuts in itertools.combinations(range(1, total), n - 1):
    yield tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))
