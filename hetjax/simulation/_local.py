"""The virtual clock for local SGD (DiLoCo): rounds of H inner steps, one model exchange each.

Each inner step t consumes the global batch X; worker i computes its share xᵢ of it with no
communication, for the same modelled time a BSP step's compute takes (`ClockCosts.compute_s`
under the trace's factor plus delay at step t). After the round's H inner steps every worker
sends the model (or pseudo-gradient, ``ClockCosts.grad_bytes``) once, through its own link
(``transfer_s``) and one ring all-reduce, so a round takes

  round_s = maxᵢ (Σ_t compute_i,t + transfer_i) + sync_s(n)

which is `simulate_shares`'s BSP step summed over the round's inner steps: with H = 1 the two
clocks give the same times. The share policy is asked once a round, with one `StepStats` of the
round's per-inner-step means, and its shares are held for the whole round.

A ``cutoff`` c > 0 bounds a round: from round 1 on, the budget is H × the median over workers
of the last round's mean busy seconds per inner step, and a worker starts an inner step only if
it would end within c × budget (its first inner step of a round always runs). The steps it skips
contribute no rows and take no time, so a worker that turns slow mid-run holds the round back by
at most c × budget instead of H of its slow steps.

Example::

  >>> from hetjax import balance
  >>> from hetjax.core import ShareRules
  >>> from hetjax.emulation import StaticTrace
  >>> cost = ClockCosts(per_sample_s=1e-3, alpha_s=1e-3)
  >>> uniform = balance.Uniform(ShareRules(400, 4))
  >>> run = simulate_local(uniform, StaticTrace((1, 1, 1, 3)), cost, 400, rounds=3,
  ...                      steps_per_round=10)
  >>> round(run.mean_round_s(), 9)  # 10 × 3 × 100 × 1 ms, plus 2 (4 − 1) × 1 ms of all-reduce
  3.006
  >>> int(run.samples()), round(run.samples_per_s(), 3)
  (12000, 1330.672)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from hetjax._checks import number, positive_int
from hetjax._errors import ConfigError
from hetjax.core import Policy, StepStats, ring_bytes
from hetjax.emulation import SlowdownTrace
from hetjax.simulation._shares import ClockCosts, _checked_shares


@dataclasses.dataclass(frozen=True, eq=False)
class LocalRun:
  """Per-round modelled times of a simulated local SGD run (read-only arrays).

  Attributes:
    shares: rounds × workers, the shares the policy chose for each round (held all round).
    rows: rounds × workers, rows each worker computed in the round (H × its share, less the
      inner steps the cutoff skipped).
    busy_s: rounds × workers, each worker's compute seconds in the round.
    round_s: per round, maxᵢ (busy_s + transfer) + the model exchange (`ClockCosts.sync_s`).
    balanced_limit_s: per round, the shortest round any shares held for it could give (every
      worker's busy time plus transfer equal, fractional shares): `ClockCosts.balanced_limit_s`
      of the round's slowdowns summed over its inner steps.
    steps_per_round: H.
    bytes_per_worker_per_step: bytes one worker's link carries in the round's ring all-reduce,
      divided by H (what local SGD saves over BSP's all-reduce every step).
    history: the round `StepStats` the policy learned from.
    policy_state: the policy's state after the last round.
  """

  shares: np.ndarray
  rows: np.ndarray
  busy_s: np.ndarray
  round_s: np.ndarray
  balanced_limit_s: np.ndarray
  steps_per_round: int
  bytes_per_worker_per_step: float
  history: tuple[StepStats, ...]
  policy_state: Any = None

  def time_s(self) -> float:
    """The run's modelled seconds: every round's time."""
    return float(self.round_s.sum())

  def mean_round_s(self, skip: int = 0) -> float:
    """Mean round time after the first ``skip`` rounds (e.g. a policy's warm-up)."""
    if not 0 <= skip < len(self.round_s):
      raise ConfigError(f'skip {skip} must leave at least one of {len(self.round_s)} rounds')
    return float(self.round_s[skip:].mean())

  def samples(self) -> int:
    """Rows computed in all, skipped inner steps excluded."""
    return int(self.rows.sum())

  def samples_per_s(self) -> float:
    """Rows computed per modelled second."""
    return self.samples() / self.time_s()


def simulate_local(policy: Policy, trace: SlowdownTrace, cost: ClockCosts, global_batch: int,
                   rounds: int, steps_per_round: int, cutoff: float = 0.0,
                   workers: int | None = None, noise_cv: float = 0.0,
                   seed: int = 0) -> LocalRun:
  """Runs ``policy`` for ``rounds`` local SGD rounds of ``steps_per_round`` inner steps.

  The policy is driven as a real local SGD run drives it: ``state = policy.init()``,
  ``shares, state = policy.update(state, None)`` before round 0, then after each round
  ``shares, state = policy.update(state, stats)`` with one `StepStats` for the round: per
  worker its mean rows (rounded) and mean compute seconds per inner step, ``sync_s`` the
  round's time beyond the slowest compute over H, ``iter_s`` the round's time over H, ``load``
  the factors at the round's last inner step and ``step`` that step's index. With H = 1 this is
  `simulate_shares` step for step.

  ``noise_cv`` multiplies each inner step's modelled compute by a log-normal factor drawn as
  `simulate_shares` draws it (one draw per worker and inner step, in step order, skipped steps
  included), so the noise depends on the step only, not on the cutoff.

  Example::

    policy = balance.make_policy('lbbsp', ShareRules(4096, 1024))
    cost = ClockCosts(per_sample_s=1e-3, alpha_s=1e-5, beta_bytes_per_s=1e9, grad_bytes=4 * 10**8)
    run = simulate_local(policy, MarkovTrace(1024, slow=3, stay=0.9), cost, 4096, rounds=50,
                         steps_per_round=20, cutoff=1.5)
    print(run.samples_per_s(), run.bytes_per_worker_per_step)

  Args:
    policy: a `hetjax.core.Policy` whose decision is the shares (a sequence of ints).
    trace: the slowdowns, indexed by inner step.
    cost: the modelled costs; ``grad_bytes`` is what a round's exchange moves (the model's or
      pseudo-gradient's size).
    global_batch: X, the rows of every inner step; the shares must sum to it.
    rounds: the number of rounds.
    steps_per_round: H, inner steps per round.
    cutoff: the round budget's multiple a worker may run to (above); 0: no cutoff.
    workers: n, if given checked against the trace.
    noise_cv: compute-time noise (above).
    seed: the noise seed.

  Raises:
    ConfigError: bad sizes, a negative cutoff, a trace for another worker count, or a policy
      returning bad shares.
  """
  n = trace.workers if workers is None else positive_int(workers, 'workers')
  if n != trace.workers:
    raise ConfigError(f'trace {trace.describe()!r} has {trace.workers} workers, not {n}')
  rounds = positive_int(rounds, 'rounds')
  h = positive_int(steps_per_round, 'steps_per_round')
  global_batch = positive_int(global_batch, 'global_batch')
  cutoff = number(cutoff, 'cutoff')
  number(noise_cv, 'noise_cv')
  comm, transfer = cost.sync_s(n), cost.transfers(n)
  shares = np.empty((rounds, n), dtype=np.int64)
  rows = np.empty((rounds, n), dtype=np.int64)
  busy = np.empty((rounds, n))
  round_s = np.empty(rounds)
  limit = np.empty(rounds)
  history: list[StepStats] = []
  sigma = math.sqrt(math.log1p(noise_cv ** 2))
  rng = np.random.default_rng([seed, 0xC10C])  # simulate_shares' stream, drawn in step order
  budget = math.inf  # round 0 runs uncut
  state = policy.init()
  decided, state = policy.update(state, None)
  for r in range(rounds):
    steps = range(r * h, (r + 1) * h)
    shares[r] = x = _checked_shares(decided, policy, steps[0], n, global_batch)
    factors = np.stack([trace.factors(t) for t in steps])  # H × n
    slowdown = factors + np.stack([trace.delays(t) for t in steps])
    compute = cost.compute_s(x, slowdown) * (
        rng.lognormal(-sigma ** 2 / 2, sigma, (h, n)) if sigma else 1.0)
    ran = np.ones((h, n), dtype=bool)
    if cutoff and r:  # busy time is increasing, so a step past the budget ends the round
      ran[1:] = np.cumsum(compute, axis=0)[1:] <= cutoff * budget
    busy[r] = b = np.where(ran, compute, 0.0).sum(axis=0)
    rows[r] = done = ran.sum(axis=0) * x
    limit[r] = cost.balanced_limit_s(global_batch, slowdown.sum(axis=0))
    finish = b + transfer
    round_s[r] = float(finish.max()) + comm
    wait = float(finish.max() - b.max()) + comm  # transfers outlasting the compute, exchange
    stats = StepStats(steps[-1], rows=tuple(np.rint(done / h).astype(np.int64).tolist()),
                      compute_s=tuple((b / h).tolist()), sync_s=wait / h,
                      iter_s=(float(b.max()) + wait) / h,
                      load=tuple(factors[-1].tolist()))
    history.append(stats)
    decided, state = policy.update(state, stats)
    budget = float(np.median(b))  # H × the median mean busy seconds per inner step
  for a in (shares, rows, busy, round_s, limit):
    a.setflags(write=False)
  return LocalRun(shares, rows, busy, round_s, limit, h,
                  ring_bytes(cost.grad_bytes, n) / h, tuple(history), state)
