"""A virtual clock: share policies driven by modelled times, for 8…4096 workers.

This is how hetjax speaks about scale beyond the machine it runs on. The model is deliberately the
one emulated hosts make real: worker i at step t computes for

  compute_i = (factor_i(t) + delay_i(t)) × (fixed_s + per_sample_s × share_i)

(linear in its share plus a fixed per-step overhead, times the slowdown trace's factor plus its
transient delay, exactly the time a `hetjax.emulation.KnownSpeedHost` pads a real step to: both
charge `hetjax.emulation.HostModel`), and the step's gradients are combined by a ring all-reduce
of 2(n − 1)·alpha_s + 2(n − 1)/n · grad_bytes / beta (the one α–β model,
`hetjax.core.LinkCost`). BSP waits for the slowest worker, so iter_s = max_i compute_i + sync_s.
Where each worker moves the gradient through its own link (`hetjax.emulation.Exchange`'s
server exchange: `ClockCosts.transfer_s`, from `hetjax.emulation.Links.exchange_s`), worker i's
step is compute_i + transfer_i and iter_s = max_i (compute_i + transfer_i) + sync_s, as a
padded real step's. Where a real run and a virtual one both
exist (same policy, trace and calibrated costs) they must agree; a policy cannot tell which clock
feeds it, because both hand it the same `hetjax.core.StepStats` and carry its state the same way
(``init``, then ``update`` after every step).

Example::

  >>> cost = ClockCosts(per_sample_s=1e-3)
  >>> uniform = balance.Uniform(ShareRules(400, 4))
  >>> run = simulate_shares(uniform, StaticTrace((1, 1, 1, 3)), cost, 400, steps=10)
  >>> run.mean_iter_s(), round(run.ratio_to_limit(), 9)  # 3 × 100 × 1 ms vs 400 ms / (3 + 1/3)
  (0.3, 2.5)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from hetjax._checks import integer, number, positive_int
from hetjax._errors import ConfigError
from hetjax.core import LinkCost, Policy, StepStats
from hetjax.emulation import HostModel, SlowdownTrace


@dataclasses.dataclass(frozen=True)
class ClockCosts:
  """The virtual clock's modelled seconds: compute (per example, per step), all-reduce, host work.

  Not the planner's `CostModel` (what a parallel layout costs): one name, one thing.

  Example::

    >>> costs = ClockCosts(per_sample_s=1e-3, fixed_s=5e-3)
    >>> costs.compute_s(np.array([100, 0]), np.array([1, 2]))
    array([0.105, 0.01 ])
  """

  per_sample_s: float | tuple[float, ...]  # one value, or one per worker (base speeds differ)
  fixed_s: float = 0.0
  alpha_s: float = 0.0
  beta_bytes_per_s: float = math.inf
  grad_bytes: int = 0
  host_s: float = 0.0  # per-step work no slowdown stretches: batch slicing, dispatch, update
  # each worker's own transfer a step (server exchange), before the barrier; empty: none
  transfer_s: tuple[float, ...] = ()

  def sync_s(self, workers: int) -> float:
    """The part of a step after the slowest worker's compute: all-reduce plus ``host_s``."""
    return self.allreduce_s(workers) + self.host_s

  def __post_init__(self):
    per_sample = np.atleast_1d(np.asarray(self.per_sample_s, dtype=np.float64))
    if per_sample.size == 0 or not (np.all(np.isfinite(per_sample)) and np.all(per_sample > 0)):
      raise ConfigError(f'per_sample_s must be finite and > 0, got {self.per_sample_s!r}')
    for name in ('fixed_s', 'alpha_s', 'host_s'):
      number(getattr(self, name), name)
    if not self.beta_bytes_per_s > 0:
      raise ConfigError(f'beta_bytes_per_s must be > 0, got {self.beta_bytes_per_s!r}')
    integer(self.grad_bytes, 'grad_bytes')
    transfer = np.atleast_1d(np.asarray(self.transfer_s, dtype=np.float64))
    if not (np.all(np.isfinite(transfer)) and np.all(transfer >= 0)):
      raise ConfigError(f'transfer_s must be finite and >= 0, got {self.transfer_s!r}')
    object.__setattr__(self, 'transfer_s', tuple(transfer.tolist()))

  def transfers(self, workers: int) -> np.ndarray:
    """``transfer_s`` as float64[workers] (zeros when empty).

    Raises:
      ConfigError: transfers given for another number of workers.
    """
    if not self.transfer_s:
      return np.zeros(workers)
    if len(self.transfer_s) != workers:
      raise ConfigError(f'transfer_s has {len(self.transfer_s)} values for {workers} workers')
    return np.asarray(self.transfer_s, dtype=np.float64)

  def compute_s(self, shares: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """factors × (fixed_s + per_sample_s × shares); a share of 0 still pays fixed_s × factor.
    The emulated hosts' model (`host`), so a virtual step costs what a padded real one does."""
    return np.asarray(self.host.step_s(np.asarray(shares), np.asarray(factors)), dtype=np.float64)

  @functools.cached_property
  def host(self) -> HostModel:
    """The workers' hosts: `hetjax.emulation.HostModel` of ``per_sample_s`` and ``fixed_s``."""
    per_sample = self.per_sample_s
    return HostModel(float(per_sample) if np.ndim(per_sample) == 0
                     else tuple(np.asarray(per_sample, dtype=np.float64).tolist()), self.fixed_s)

  def allreduce_s(self, workers: int) -> float:
    """Ring all-reduce: 2(n−1) messages of latency α, 2(n−1)/n of the bytes each way; 0 at n=1."""
    n = positive_int(workers, 'workers')
    return self.link.ring_all_reduce_s(self.grad_bytes, n)

  @property
  def link(self) -> LinkCost:
    """The workers' link (α, β) as the α–β model."""
    return LinkCost(self.alpha_s, self.beta_bytes_per_s)

  def balanced_limit_s(self, global_batch: int, factors: np.ndarray) -> float:
    """The perfectly balanced iteration time: a lower bound that no share policy can beat.

    It is the T at which the workers, each given exactly the (fractional) share it can finish in
    T, together cover the global batch X: Σᵢ max(0, (T / fᵢ − fixed_s) / per_sample_s) = X, plus
    `sync_s` (all-reduce and host work). Fractional shares make it a bound rather than a schedule.
    The left side is piecewise linear in T with breaks at fixed_s·fᵢ, so it is solved exactly:
    with the k fastest workers active, T = (X·per_sample_s + k·fixed_s) / Σ_{j≤k} 1/fⱼ. With
    fixed_s = 0 this is X·per_sample_s / Σ 1/fᵢ, i.e. X / Σ vᵢ. A worker whose fixed overhead
    alone exceeds T is left out of the bound (share 0, skipping the step); `simulate_shares` still
    charges it fixed_s·fᵢ.

    Each worker's own transfer tᵢ (`transfer_s`) shifts its line: it covers rows from
    tᵢ + fixed_s·fᵢ on, and T = (X + fixed_s·Σ 1/c_j + Σ t_j/(f_j c_j)) / Σ 1/(f_j c_j) over the
    active workers (every worker's compute plus transfer is T).

    Example::

      >>> round(ClockCosts(per_sample_s=1e-3).balanced_limit_s(400, np.array([1, 1, 1, 3])), 9)
      0.12
    """
    x = positive_int(global_batch, 'global_batch')
    factors = np.asarray(factors, dtype=np.float64)
    c = np.broadcast_to(np.asarray(self.per_sample_s, dtype=np.float64), factors.shape)
    t = self.transfers(len(factors))
    order = np.lexsort((factors, t + self.fixed_s * factors))
    f, c, t = factors[order], c[order], t[order]
    breaks = t + self.fixed_s * f  # T below which worker j (earliest first) gets no share
    # With workers 1..k active: Σ_j ((T − t_j)/f_j − fixed)/c_j = X
    #   ⇒  T = (X + fixed·Σ 1/c_j + Σ t_j/(f_j c_j)) / Σ 1/(f_j c_j)
    level = (x + self.fixed_s * np.cumsum(1.0 / c) + np.cumsum(t / (f * c))) / np.cumsum(
        1.0 / (f * c))
    fits = level <= np.append(breaks[1:], np.inf)  # the k-active line solves before the next break
    return float(level[np.argmax(fits)]) + self.sync_s(len(f))


@dataclasses.dataclass(frozen=True, eq=False)
class VirtualRun:
  """Per-step modelled times of a simulated run (read-only arrays, steps × workers).

  ``comm_s`` is each step's `ClockCosts.sync_s`; ``history`` the `StepStats` the policy learned
  from; ``policy_state`` the policy's state after the last step (what a checkpoint would save:
  ``simulate_shares(…, later, start=steps, policy_state=run.policy_state)`` continues the run).
  """

  shares: np.ndarray
  compute_s: np.ndarray
  comm_s: np.ndarray
  iter_s: np.ndarray
  balanced_limit_s: np.ndarray
  idle_fraction: np.ndarray  # (slowest compute − own compute, transfers included) / iter_s
  history: tuple[StepStats, ...]
  policy_state: Any = None

  def _tail(self, values: np.ndarray, skip: int) -> float:
    if not 0 <= skip < len(values):
      raise ConfigError(f'skip {skip} must leave at least one of {len(values)} steps')
    return float(values[skip:].mean())

  def mean_iter_s(self, skip: int = 0) -> float:
    """Mean iteration time after the first ``skip`` steps (e.g. a policy's warm-up)."""
    return self._tail(self.iter_s, skip)

  def mean_balanced_limit_s(self, skip: int = 0) -> float:
    return self._tail(self.balanced_limit_s, skip)

  def ratio_to_limit(self, skip: int = 0) -> float:
    """Mean iteration time over mean balanced limit: 1.0 is perfect balance, never below."""
    return self.mean_iter_s(skip) / self.mean_balanced_limit_s(skip)


def _checked_shares(shares, policy, step: int, workers: int, total: int) -> np.ndarray:
  a = np.asarray(shares)
  where = f'share policy {type(policy).__name__} at step {step}'
  if a.shape != (workers,) or a.dtype.kind not in 'iu':
    raise ConfigError(f'{where} returned {a.shape} {a.dtype}; expected {workers} integers')
  if (a < 0).any() or a.sum() != total:
    raise ConfigError(f'{where} returned shares with min {a.min()} and sum {a.sum()}; '
                      f'they must be >= 0 and sum to the global batch {total}')
  return a


def simulate_shares(policy: Policy, trace: SlowdownTrace, cost: ClockCosts, global_batch: int,
             steps: int, workers: int | None = None, noise_cv: float = 0.0, seed: int = 0, *,
             start: int = 0, policy_state: Any = None) -> VirtualRun:
  """Runs ``policy`` for BSP steps ``start`` … ``steps`` − 1 on the virtual clock.

  The policy is driven as a real run drives it: ``state = policy.init()`` (or ``policy_state``),
  ``shares, state = policy.update(state, None)`` for the first step, then after each step
  ``shares, state = policy.update(state, stats)`` with the step's `StepStats` (rows, compute_s,
  sync_s, iter_s, and load = the slowdown factors in force, as an emulated host reports it:
  without transient delays). A run resumed from a saved state (``start`` and ``policy_state``)
  is step for step the same as the uninterrupted one.

  ``noise_cv`` multiplies every modelled compute time by an independent log-normal factor with
  that coefficient of variation (seeded by ``seed``, drawn step by step from step 0, so a resumed
  run sees the same noise): real workers sharing cores measure their compute with a CV of
  several tenths per step, and a policy must not chase that noise.

  Example::

    policy = balance.make_policy('lbbsp', balance.ShareRules(4096, 1024))
    run = simulate_shares(policy, MarkovTrace(1024, slow=3, stay=0.9), cost, 4096, 100)
    print(run.ratio_to_limit(skip=10))
    rest = simulate_shares(policy, MarkovTrace(1024, slow=3, stay=0.9), cost, 4096, 200, start=100,
                    policy_state=run.policy_state)   # steps 100 … 199

  Args:
    policy: a `hetjax.core.Policy` whose decision is the shares (a sequence of ints).
    trace: the slowdowns.
    cost: the modelled costs.
    global_batch: X; the shares must sum to it.
    steps: the step to stop before (the number of steps when ``start`` is 0).
    workers: n, if given checked against the trace.
    noise_cv: compute-time noise (above).
    seed: the noise seed.
    start: the first step.
    policy_state: the policy's state to continue from (default ``policy.init()``).

  Raises:
    ConfigError: bad sizes, a trace for another worker count, or a policy returning bad shares.
  """
  n = trace.workers if workers is None else positive_int(workers, 'workers')
  if n != trace.workers:
    raise ConfigError(f'trace {trace.describe()!r} has {trace.workers} workers, not {n}')
  steps, start = positive_int(steps, 'steps'), integer(start, 'start')
  if start >= steps:
    raise ConfigError(f'start {start} leaves no step to run before steps {steps}')
  number(noise_cv, 'noise_cv')
  comm, transfer = cost.sync_s(n), cost.transfers(n)
  count = steps - start
  shares = np.empty((count, n), dtype=np.int64)
  compute = np.empty((count, n))
  limit = np.empty(count)
  history: list[StepStats] = []
  sigma = math.sqrt(math.log1p(noise_cv ** 2))
  rng = np.random.default_rng([seed, 0xC10C])
  for _ in range(start if sigma else 0):  # the noise of the steps before, as a run from 0 drew it
    rng.lognormal(-sigma ** 2 / 2, sigma, n)
  state = policy.init() if policy_state is None else policy_state
  decided, state = policy.update(state, None)
  for i, t in enumerate(range(start, steps)):
    shares[i] = x = _checked_shares(decided, policy, t, n, global_batch)
    factors = trace.factors(t)
    slowdown = factors + trace.delays(t)  # a transient delay adds to the factor, as on a host
    compute[i] = c = cost.compute_s(x, slowdown) * (
        rng.lognormal(-sigma ** 2 / 2, sigma, n) if sigma else 1.0)
    limit[i] = cost.balanced_limit_s(global_batch, slowdown)
    after = float((c + transfer).max() - c.max())  # the transfers outlasting the compute
    stats = StepStats(t, rows=tuple(x.tolist()), compute_s=tuple(c.tolist()),
                      sync_s=after + comm, iter_s=float(c.max()) + after + comm,
                      load=tuple(factors.tolist()))
    history.append(stats)
    decided, state = policy.update(state, stats)
  finish = compute + transfer
  slowest = finish.max(axis=1)
  iter_s = slowest + comm
  arrays = [shares, compute, np.full(count, comm), iter_s, limit,
            (slowest[:, None] - finish) / iter_s[:, None]]
  for a in arrays:
    a.setflags(write=False)
  return VirtualRun(*arrays, history=tuple(history), policy_state=state)
