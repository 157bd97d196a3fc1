"""`Shares`: per-worker integer batch sizes; `ShareRules`: what every policy's output obeys."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from hetjax._errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ShareRules:
  """What valid shares look like for one job.

  Attributes:
    global_batch: X; shares sum to it.
    workers: n.
    bucket: every share is a multiple of it, so a worker compiles at most X / bucket programs
      (and every worker's local data-parallel degree divides it: with workers of different
      degrees, a multiple of their least common multiple).
    minimum: per-worker lower bounds (default: one bucket each, so no worker is dropped).
    maximum: per-worker upper bounds, e.g. memory caps (default: none).
    devices: each worker's device count (default: all equal). `uniform` gives every device
      the same rows, so a worker of 2 devices gets twice the rows of a worker of 1: data
      parallelism over all devices, which is what BSP over workers of different device counts
      means. Only `uniform` reads it; policies that measure speeds see the devices in them.

  Raises:
    ConfigError: at construction, when no shares can satisfy the rules: a global batch smaller
      than workers × bucket, bounds that are not bucket multiples, or caps that cannot hold X.
  """

  global_batch: int
  workers: int
  bucket: int = 1
  minimum: tuple[int, ...] | None = None
  maximum: tuple[int, ...] | None = None
  devices: tuple[int, ...] | None = None

  def __post_init__(self):
    x, n, b = self.global_batch, self.workers, self.bucket
    if n < 1 or b < 1:
      raise ConfigError(f'workers ({n}) and bucket ({b}) must be positive')
    if self.devices is not None:
      if len(self.devices) != n or any(int(k) != k or k < 1 for k in self.devices):
        raise ConfigError(f'devices {tuple(self.devices)} must be {n} positive integers, one a '
                          'worker')
      object.__setattr__(self, 'devices', tuple(int(k) for k in self.devices))
    if x % b:
      raise ConfigError(f'global batch {x} is not a multiple of the bucket {b}')
    lo = self.lower
    hi = self.upper
    for name, bounds in (('minimum', lo), ('maximum', hi)):
      if len(bounds) != n:
        raise ConfigError(f'{name} has {len(bounds)} entries for {n} workers')
      if any(v % b for v in bounds if v != math.inf):
        raise ConfigError(f'{name} {tuple(bounds)} is not made of multiples of the bucket {b}')
    if sum(lo) > x:
      raise ConfigError(f'global batch {x} is smaller than the minimum shares need '
                        f'({n} workers x at least {min(lo)}: {sum(lo)})')
    if any(low > high for low, high in zip(lo, hi, strict=True)):
      raise ConfigError(f'minimum {tuple(lo)} exceeds maximum {tuple(hi)}')
    if sum(hi) < x:
      raise ConfigError(f'memory caps {tuple(hi)} hold {sum(hi)} rows, less than the global '
                        f'batch {x}')

  @property
  def lower(self) -> tuple[int, ...]:
    return self.minimum if self.minimum is not None else (self.bucket,) * self.workers

  @property
  def upper(self) -> tuple[float, ...]:
    return self.maximum if self.maximum is not None else (math.inf,) * self.workers

  def uniform(self) -> Shares:
    """Equal shares (BSP), rounded to buckets, within the bounds: equal per worker, or, given
    ``devices``, equal per device.

    Example::

      >>> ShareRules(global_batch=64, workers=3, bucket=4, devices=(2, 1, 1)).uniform().values
      (32, 16, 16)
    """
    return _uniform(self)

  def from_weights(self, weights: Sequence[float]) -> Shares:
    """Shares proportional to ``weights`` (e.g. predicted speeds), in buckets, within bounds.

    Water-filling on the bounds (a worker at its cap or floor is fixed and the rest re-split),
    then rounding down to buckets and handing out the leftover buckets one at a time to the
    worker that would finish soonest with one more ((units + 1) / weight smallest). For BSP this
    beats largest-remainder rounding: with weights (1, 1, 1, 1/3) and 64 buckets, the leftover
    bucket goes to a fast worker (20 units, time 20) rather than the slow one (7 units, time 21).
    Non-finite or negative weights count as 0; all of them 0 gives `uniform`.

    Example::

      >>> ShareRules(global_batch=12, workers=3, bucket=2).from_weights([1, 1, 2]).values
      (4, 2, 6)
    """
    w = np.nan_to_num(np.asarray(weights, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    w = np.maximum(w, 0.0)
    if len(w) != self.workers:
      raise ConfigError(f'{len(w)} weights for {self.workers} workers')
    if w.sum() <= 0:  # nothing to go by: uniform
      w = np.ones(self.workers) if self.devices is None else np.asarray(self.devices, np.float64)
    b = self.bucket
    units = self.global_batch // b
    lo = np.asarray(self.lower, dtype=np.float64) / b
    hi = np.asarray(self.upper, dtype=np.float64) / b
    ideal = _water_fill(w, units, lo, hi)
    base = np.maximum(np.floor(ideal + 1e-9), lo).astype(np.int64)
    with np.errstate(divide='ignore'):
      inverse = np.where(w > 0, 1.0 / w, np.inf)
    for _ in range(int(units - base.sum())):
      finish = np.where(base + 1 <= hi, (base + 1) * inverse, np.inf)
      if np.isinf(finish).all():  # only zero-weight workers have room left
        finish = np.where(base + 1 <= hi, base + 1.0, np.inf)
      base[int(np.argmin(finish))] += 1
    return Shares(tuple(int(v) * b for v in base), self)


def _water_fill(w: np.ndarray, total: float, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
  """Fractional x ∝ w with lo ≤ x ≤ hi and Σx = total (clamp violators, re-split the rest)."""
  fixed = np.full(len(w), np.nan)
  for _ in range(2 * len(w) + 1):
    free = np.isnan(fixed)
    rest = total - np.nansum(fixed)
    x = np.where(free, 0.0, fixed)
    wf = np.where(free, w, 0.0)
    if wf.sum() > 0:
      x = np.where(free, rest * wf / wf.sum(), fixed)
    else:
      x = np.where(free, rest / max(free.sum(), 1), fixed)
    over, under = free & (x > hi), free & (x < lo)
    if not over.any() and not under.any():
      return x
    fixed[over] = hi[over]
    fixed[under] = lo[under]
  return np.clip(x, lo, hi)


@dataclasses.dataclass(frozen=True)
class Shares:
  """Per-worker integer batch sizes for one step: a valid point of `ShareRules`.

  Behaves as a sequence of ints (``len``, indexing, iteration), so it can be passed wherever
  shares are expected.

  ``upcoming``: the shares a policy expects to move to at a coming step (a move it waits to
  confirm), or None: a step program may prepare for them (compile their programs in the
  background) while these run. Not part of the value: two shares of equal values are equal.

  Raises:
    ConfigError: if the values break the rules (sum, bucket multiples, bounds).
  """

  values: tuple[int, ...]
  rules: ShareRules = dataclasses.field(repr=False, compare=False)
  upcoming: tuple[int, ...] | None = dataclasses.field(default=None, repr=False, compare=False)

  def __post_init__(self):
    r = self.rules
    v = self.values
    if len(v) != r.workers or sum(v) != r.global_batch:
      raise ConfigError(f'shares {v} must be {r.workers} values summing to {r.global_batch}')
    for i, (s, lo, hi) in enumerate(zip(v, r.lower, r.upper, strict=True)):
      if s % r.bucket or not lo <= s <= hi:
        raise ConfigError(f'share {s} of worker {i} is not a multiple of {r.bucket} in '
                          f'[{lo}, {hi}]')

  def __len__(self) -> int:
    return len(self.values)

  def __iter__(self) -> Iterator[int]:
    return iter(self.values)

  def __getitem__(self, i: int) -> int:
    return self.values[i]


@functools.lru_cache(maxsize=256)
def _uniform(rules: ShareRules) -> Shares:
  """`ShareRules.uniform`, computed once per rules (a policy asks for it several times a step:
  it was a third of LB-BSP's decision time)."""
  return rules.from_weights(np.ones(rules.workers) if rules.devices is None else rules.devices)
