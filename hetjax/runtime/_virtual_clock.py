"""A virtual clock: share policies driven by modelled times, for 8…4096 workers.

This is how hetjax speaks about scale beyond the machine it runs on. The model is deliberately the
one time dilation makes real: worker i at step t computes for

  compute_i = factor_i(t) × (fixed_s + per_sample_s × share_i)

(linear in its share plus a fixed per-step overhead, times the slowdown trace's factor, exactly
as a dilated worker sleeps (factor − 1) × its measured compute), and the step's gradients are
combined by a ring all-reduce of 2(n − 1)·alpha_s + 2(n − 1)/n · grad_bytes / beta. BSP waits for
the slowest worker, so iter_s = max_i compute_i + comm_s. Where a real run and a virtual one both
exist (same policy, trace and calibrated costs) they must agree; a policy cannot tell which clock
feeds it, because both hand it the same `StepStats`.

Example::

  >>> cost = CostModel(per_sample_s=1e-3)
  >>> run = simulate(UniformShares(400, 4), StaticTrace((1, 1, 1, 3)), cost, 400, steps=10)
  >>> run.mean_iter_s(), round(run.ratio_to_limit(), 9)  # 3 × 100 × 1 ms vs 400 ms / (3 + 1/3)
  (0.3, 2.5)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from hetjax._errors import ConfigError
from hetjax.runtime._slowdown import SlowdownTrace


def _count(value: int, what: str, low: int) -> int:
  if isinstance(value, bool) or int(value) != value or value < low:
    raise ConfigError(f'{what} must be an integer >= {low}, got {value!r}')
  return int(value)


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Modelled seconds for compute (per example, per step) and for the gradient all-reduce.

  Example::

    >>> CostModel(per_sample_s=1e-3, fixed_s=5e-3).compute_s(np.array([100, 0]), np.array([1, 2]))
    array([0.105, 0.01 ])
  """

  per_sample_s: float | tuple[float, ...]  # one value, or one per worker (base speeds differ)
  fixed_s: float = 0.0
  alpha_s: float = 0.0
  beta_bytes_per_s: float = math.inf
  grad_bytes: int = 0
  host_s: float = 0.0  # per-step work no slowdown stretches: batch slicing, dispatch, update

  def sync_s(self, workers: int) -> float:
    """The part of a step after the slowest worker's compute: all-reduce plus ``host_s``."""
    return self.allreduce_s(workers) + self.host_s

  def __post_init__(self):
    per_sample = np.atleast_1d(np.asarray(self.per_sample_s, dtype=np.float64))
    if per_sample.size == 0 or not (np.all(np.isfinite(per_sample)) and np.all(per_sample > 0)):
      raise ConfigError(f'per_sample_s must be finite and > 0, got {self.per_sample_s!r}')
    for name in ('fixed_s', 'alpha_s', 'host_s'):
      if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
        raise ConfigError(f'{name} must be finite and >= 0, got {getattr(self, name)!r}')
    if not self.beta_bytes_per_s > 0:
      raise ConfigError(f'beta_bytes_per_s must be > 0, got {self.beta_bytes_per_s!r}')
    _count(self.grad_bytes, 'grad_bytes', 0)

  def compute_s(self, shares: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """factors × (fixed_s + per_sample_s × shares); a share of 0 still pays fixed_s × factor."""
    per_sample = np.asarray(self.per_sample_s, dtype=np.float64)
    return np.asarray(factors) * (self.fixed_s + per_sample * np.asarray(shares))

  def allreduce_s(self, workers: int) -> float:
    """Ring all-reduce: 2(n−1) messages of latency alpha, 2(n−1)/n of the bytes each way; 0 at n=1."""
    n = _count(workers, 'workers', 1)
    return 2 * (n - 1) * self.alpha_s + 2 * (n - 1) / n * self.grad_bytes / self.beta_bytes_per_s

  def balanced_limit_s(self, global_batch: int, factors: np.ndarray) -> float:
    """The perfectly balanced iteration time: a lower bound that no share policy can beat.

    It is the T at which the workers, each given exactly the (fractional) share it can finish in
    T, together cover the global batch X: Σᵢ max(0, (T / fᵢ − fixed_s) / per_sample_s) = X, plus
    `sync_s` (all-reduce and host work). Fractional shares make it a bound rather than a schedule. The left side is
    piecewise linear in T with breaks at fixed_s·fᵢ, so it is solved exactly: with the k fastest
    workers active, T = (X·per_sample_s + k·fixed_s) / Σ_{j≤k} 1/fⱼ. With fixed_s = 0 this is
    X·per_sample_s / Σ 1/fᵢ, i.e. X / Σ vᵢ. A worker whose fixed overhead alone exceeds T is left
    out of the bound (share 0, skipping the step); `simulate` still charges it fixed_s·fᵢ.

    Example::

      >>> round(CostModel(per_sample_s=1e-3).balanced_limit_s(400, np.array([1, 1, 1, 3])), 9)
      0.12
    """
    x = _count(global_batch, 'global_batch', 1)
    factors = np.asarray(factors, dtype=np.float64)
    c = np.broadcast_to(np.asarray(self.per_sample_s, dtype=np.float64), factors.shape)
    order = np.argsort(factors, kind='stable')
    f, c = factors[order], c[order]
    breaks = self.fixed_s * f  # T below which worker j (fastest first) gets no share
    # With workers 1..k active: Σ_j (T/f_j − fixed)/c_j = X  ⇒  T = (X + fixed·Σ 1/c_j) / Σ 1/(f_j c_j)
    level = (x + self.fixed_s * np.cumsum(1.0 / c)) / np.cumsum(1.0 / (f * c))
    fits = level <= np.append(breaks[1:], np.inf)  # the k-active line solves before the next break
    return float(level[np.argmax(fits)]) + self.sync_s(len(f))


@dataclasses.dataclass(frozen=True)
class StepStats:
  """What a share policy sees of one finished step; real runs produce the same type.

  ``compute_s`` is per worker and includes dilation (the time the worker was busy with its
  share); ``iter_s`` is the whole BSP step. ``load`` is each worker's exogenous host-load input
  for predictors (LB-BSP's NARX): the background load that slows the host. Under emulation that
  load is the slowdown factor in force (sleeping does not load a CPU, so no OS counter would see
  it); on a real cluster it is the host's run-queue load. Empty when unknown. ``sampled`` is
  False for a worker whose time says nothing about its speed (it ran a new share size as
  pieces while the size's own program compiled); empty means every time is a sample.
  """

  step: int
  shares: tuple[int, ...]
  compute_s: tuple[float, ...]
  comm_s: float
  iter_s: float
  load: tuple[float, ...] = ()
  sampled: tuple[bool, ...] = ()


@runtime_checkable
class SharePolicy(Protocol):
  """Chooses next step's integer shares (summing to the global batch) from the steps so far."""

  def shares(self, step: int, history: Sequence[StepStats]) -> Sequence[int]: ...


@dataclasses.dataclass(frozen=True)
class UniformShares:
  """Plain BSP: X // n each, the remainder X mod n one each to workers 0 … r−1.

  Example::

    >>> UniformShares(global_batch=10, workers=4).shares(0, [])
    (3, 3, 2, 2)
  """

  global_batch: int
  workers: int

  def __post_init__(self):
    _count(self.workers, 'workers', 1)
    _count(self.global_batch, f'global_batch for {self.workers} workers', self.workers)

  def shares(self, step: int, history: Sequence[StepStats]) -> tuple[int, ...]:
    base, extra = divmod(self.global_batch, self.workers)
    return (base + 1,) * extra + (base,) * (self.workers - extra)


@dataclasses.dataclass(frozen=True, eq=False)
class VirtualRun:
  """Per-step modelled times of a simulated run (read-only arrays, steps × workers)."""

  shares: np.ndarray
  compute_s: np.ndarray
  comm_s: np.ndarray
  iter_s: np.ndarray
  balanced_limit_s: np.ndarray
  idle_fraction: np.ndarray  # (slowest compute − own compute) / iter_s
  history: tuple[StepStats, ...]

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


def simulate(policy: SharePolicy, trace: SlowdownTrace, cost: CostModel, global_batch: int,
             steps: int, workers: int | None = None, noise_cv: float = 0.0,
             seed: int = 0) -> VirtualRun:
  """Runs ``policy`` for ``steps`` BSP steps on the virtual clock.

  ``noise_cv`` multiplies every modelled compute time by an independent log-normal factor with
  that coefficient of variation (seeded by ``seed``): real workers sharing cores measure their
  compute with a CV of 0.3–0.5 per step, and a policy must not chase that noise.

  Example::

    run = simulate(UniformShares(4096, 1024), MarkovTrace(1024, slow=3, stay=0.9), cost, 4096, 100)
    print(run.ratio_to_limit(skip=10))

  Raises:
    ConfigError: bad sizes, a trace for another worker count, or a policy returning bad shares.
  """
  n = trace.workers if workers is None else _count(workers, 'workers', 1)
  if n != trace.workers:
    raise ConfigError(f'trace {trace.describe()!r} has {trace.workers} workers, not {n}')
  _count(steps, 'steps', 1)
  comm = cost.sync_s(n)
  shares = np.empty((steps, n), dtype=np.int64)
  compute = np.empty((steps, n))
  limit = np.empty(steps)
  history: list[StepStats] = []
  if not (math.isfinite(noise_cv) and noise_cv >= 0):
    raise ConfigError(f'noise_cv must be finite and >= 0, got {noise_cv!r}')
  sigma = math.sqrt(math.log1p(noise_cv ** 2))
  rng = np.random.default_rng([seed, 0xC10C])
  for t in range(steps):
    shares[t] = x = _checked_shares(policy.shares(t, history), policy, t, n, global_batch)
    factors = trace.factors(t)
    compute[t] = c = cost.compute_s(x, factors) * (
        rng.lognormal(-sigma ** 2 / 2, sigma, n) if sigma else 1.0)
    limit[t] = cost.balanced_limit_s(global_batch, factors)
    history.append(StepStats(t, tuple(x.tolist()), tuple(c.tolist()), comm, float(c.max()) + comm,
                             tuple(factors.tolist())))
  slowest = compute.max(axis=1)
  iter_s = slowest + comm
  arrays = [shares, compute, np.full(steps, comm), iter_s, limit,
            (slowest[:, None] - compute) / iter_s[:, None]]
  for a in arrays:
    a.setflags(write=False)
  return VirtualRun(*arrays, history=tuple(history))
