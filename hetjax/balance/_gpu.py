"""LB-BSP for GPU clusters: fit t(x) ≈ max(c, a + b·x) per worker, equalise finish times.

A GPU is flat at small batches (not saturated), linear beyond, and holds at most Mᵢ rows, so a
split ∝ speed mis-splits it. Each worker's curve is fitted from its recent (share, compute time)
points, T with Σᵢ clamp(tᵢ⁻¹(T), minᵢ, Mᵢ) = X is found by bisection (water-filling), and shares
step toward that target with a dead band, halving a worker's step when it reverses. Example:
``simulate(LBBSPGpu(ShareRules(4096, 4, bucket=64)), StaticTrace((1, 1, 1, 3)),
CostModel(1e-3, fixed_s=0.05), 4096, 8)`` settles at (1280, 1216, 1216, 384) from step 1.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.balance._shares import ShareRules, Shares
from hetjax.runtime._virtual_clock import StepStats

_NOISE = 1e-6  # relative timing resolution: residuals below it count as a perfect fit


@dataclasses.dataclass(frozen=True)
class TimeModel:
  """Compute seconds for share x: t(x) = max(floor_s, intercept_s + slope_s·x).

  The floor is the unsaturated device (more rows are free), the line the saturated one. Fields
  are floats (one worker) or arrays (one entry per worker). E.g. ``TimeModel(0.1, 0.02, 1e-3)``:
  time(50) = 0.1, time(180) = 0.2, inverse(0.18) = 160, inverse(0.05) = 0.
  """

  floor_s: float | np.ndarray = 0.0
  intercept_s: float | np.ndarray = 0.0
  slope_s: float | np.ndarray = 0.0

  def time(self, x):
    """Modelled seconds for share(s) ``x``."""
    return np.maximum(self.floor_s, self.intercept_s + self.slope_s * np.asarray(x, float))[()]

  def inverse(self, t):
    """The largest share done within ``t`` s: (t − a)/b; +inf if slope ≤ 0; 0 if none is."""
    c, a, b, t = self.floor_s, self.intercept_s, self.slope_s, np.asarray(t, float)
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
      x = np.where(b > 0, (t - a) / np.where(b > 0, b, 1.0), np.inf)
    return np.where((t < c) | (t < a), 0.0, np.maximum(x, 0.0))[()]


def _fit_rows(x: np.ndarray, t: np.ndarray, ok: np.ndarray) -> tuple[TimeModel, np.ndarray]:
  """`fit_time_model` for every row, plus each row's kind (0 no data, 1 one share, 2 fitted).

  Each split "k smallest points = floor, the rest = least-squares line" is scored by AIC (SSE
  floored at the timing resolution: a noiseless line grows no floor); it counts if the line rises
  by more than that resolution across its shares and meets the floor between the two parts.
  """
  ok = ok & np.isfinite(x) & np.isfinite(t) & (t > 0) & (x >= 0)
  order = np.argsort(np.where(ok, x, np.inf), axis=1, kind='stable')
  v, x, t = (np.take_along_axis(np.where(ok, q, 0.0), order, 1) for q in (1.0, x, t))
  cnt, xmin = v.sum(1), np.where(ok.any(1), np.where(v > 0, x, np.inf).min(1), 0.0)
  with np.errstate(divide='ignore', invalid='ignore'):
    xm, tm, xmax = (x * v).sum(1) / cnt, (t * v).sum(1) / cnt, (x * v).max(1)
    xc = (x - xm[:, None]) * v  # centred, for well-conditioned sums
    sums = [v, xc, t, xc * xc, xc * t, t * t]
    floor = [np.cumsum(q, axis=1) - q for q in sums]  # sums over the k points before column k
    nl, sx, st, sxx, sxt, stt = (
        q.sum(1, keepdims=True) - f for q, f in zip(sums, floor, strict=True))
    b = (nl * sxt - sx * st) / (nl * sxx - sx * sx)
    a0 = (st - b * sx) / nl
    a, c, k = a0 - b * xm[:, None], floor[2] / floor[0], np.arange(x.shape[1])
    prev = np.concatenate([np.full((len(x), 1), -np.inf), x[:, :-1]], axis=1)
    good = (v > 0) & (b * (xmax[:, None] - x) > _NOISE * tm[:, None])  # the line visibly rises
    good &= (k == 0) | ((prev < x) & (c >= a + b * prev) & (a + b * x >= c))
    sse = stt - a0 * st - b * sxt + np.where(k > 0, floor[5] - floor[2] * c, 0.0)
    sse = np.maximum(sse, cnt[:, None] * (_NOISE * tm[:, None]) ** 2)
    score = np.where(good, cnt[:, None] * np.log(sse / cnt[:, None]) + 4 + 2 * (k > 0), np.inf)
    best, rows = np.argmin(score, axis=1), np.arange(len(x))
    fit, many = np.isfinite(score[rows, best]), xmax > xmin
    # Shares that never raised the time: flat up to the largest seen, proportional beyond.
    # One distinct share: a line through the origin, t = (t̄ / x̄)·x.
    cf = np.where(fit, np.where(best > 0, c[rows, best], 0.0), np.where(many, tm, 0.0))
    af = np.where(fit, a[rows, best], np.where(many | (xm > 0), 0.0, tm))
    bf = np.where(fit, b[rows, best], np.where(many, tm / xmax, np.where(xm > 0, tm / xm, 0.0)))
  return TimeModel(cf, af, bf), np.where(cnt == 0, 0, np.where(fit | many, 2, 1))


def fit_time_model(xs: Sequence[float], ts: Sequence[float]) -> TimeModel:
  """Fits one worker's `TimeModel` to its (share, compute seconds) observations.

  Non-finite or non-positive times are ignored. A floor is kept only when the small shares sit
  measurably above the line through the rest; with one distinct share, t = (t/x)·x. Example:
  ``fit_time_model([32, 64, 256, 512], [0.1, 0.1, 0.276, 0.532])`` is
  ``TimeModel(floor_s=0.1, intercept_s=0.02, slope_s=0.001)``.

  Raises:
    ConfigError: when no observation is usable.
  """
  x, t = np.asarray(xs, dtype=np.float64)[None], np.asarray(ts, dtype=np.float64)[None]
  if x.shape != t.shape:
    raise ConfigError(f'{x.size} shares but {t.size} times')
  m, kind = _fit_rows(x, t, np.ones(x.shape, dtype=bool))
  if kind[0] == 0:
    raise ConfigError(f'no usable (share, time) observation among {x.size}')
  return TimeModel(*(float(f'{v[0]:.12g}') for v in dataclasses.astuple(m)))


def finish_time_shares(model: TimeModel | Sequence[TimeModel], total: float,
                       lower: Sequence[float], upper: Sequence[float]) -> tuple[float, np.ndarray]:
  """The common finish time T, and fractional xᵢ = clamp(tᵢ⁻¹(T), lowerᵢ, upperᵢ) with Σx = total.

  E.g. two equal workers, 300 rows, one capped at 100: ``finish_time_shares([TimeModel(slope_s=
  1e-3)] * 2, 300, [0, 0], [100, 1000])`` is (0.2, [100, 200]): the cap holds, the other has the
  rest. ``model`` is per-worker models or one `TimeModel` of arrays.
  """
  if not isinstance(model, TimeModel):
    model = TimeModel(*np.array([dataclasses.astuple(m) for m in model], dtype=np.float64).T)
  lo, hi = np.asarray(lower, dtype=np.float64), np.minimum(np.asarray(upper, float), total)
  if lo.sum() > total or hi.sum() < total:
    raise ConfigError(f'bounds hold {lo.sum()}…{hi.sum()} rows, not {total}')
  t_lo, t_hi = 0.0, float(np.max(model.time(hi))) * (1 + 1e-9) + 1e-300
  while t_hi - t_lo > 1e-12 * t_hi:
    mid = 0.5 * (t_lo + t_hi)
    t_lo, t_hi = (t_lo, mid) if np.clip(model.inverse(mid), lo, hi).sum() >= total else (mid, t_hi)
  x_lo = lo if t_lo == 0 else np.clip(model.inverse(t_lo), lo, hi)
  x_hi = np.clip(model.inverse(t_hi), lo, hi)
  gap = x_hi.sum() - x_lo.sum()  # a worker at its floor's edge jumps: interpolate to Σx = total
  return t_hi, x_lo + ((total - x_lo.sum()) / gap if gap > 0 else 1.0) * (x_hi - x_lo)


class LBBSPGpu:
  """LB-BSP's GPU policy: fitted curves, water-filled T, damped steps. E.g. ``LBBSPGpu(rules)``.

  ``window`` 16 steps: enough points for a floor/line split, yet follows drift. A time 25%
  (``change_tolerance``) off the curve restarts that worker's window; while it holds one share the
  old curve is rescaled (slowdowns multiply), fully after a restart. The first decision goes right
  to target, later ones ``step_fraction`` ½ of the gap in whole buckets (none if that rounds to 0);
  a gap ≤ ``dead_band_buckets`` 1 is rounding, not signal, and is left alone unless the worker
  would finish after the best whole-bucket split. A reversal of the wanted direction halves that
  fraction (the paper's rule), the same direction doubles it back so real change is followed
  fast; at the full fraction a step is ≥ 1 bucket, so a real gap always closes. ``probe`` 1:
  first-decision workers within a bucket of their target get ±1 bucket (signs alternate) so their
  fit sees two shares, then go straight to target.
  """

  name = 'lbbsp-gpu'

  def __init__(self, rules: ShareRules, window: int = 16, step_fraction: float = 0.5,
               dead_band_buckets: int = 1, probe: int = 1, change_tolerance: float = 0.25,
               halve_on_reversal: bool = True):
    if window < 2 or not (0 < step_fraction <= 1 and change_tolerance > 0) or min(
        dead_band_buckets, probe) < 0:
      raise ConfigError(f'need window >= 2 ({window}), 0 < step_fraction <= 1 ({step_fraction}), '
                        f'dead_band_buckets and probe >= 0 ({dead_band_buckets}, {probe}), '
                        f'change_tolerance > 0 ({change_tolerance})')
    self.rules, self.window, self.step_fraction = rules, int(window), float(step_fraction)
    self.dead_band_buckets, self.probe = int(dead_band_buckets), int(probe)
    self.change_tolerance, self.halve_on_reversal = float(change_tolerance), halve_on_reversal
    self._reset()

  def _reset(self) -> None:
    n, w = self.rules.workers, self.window
    self._x, self._t, self._ok = np.zeros((n, w)), np.zeros((n, w)), np.zeros((n, w), dtype=bool)
    self._seen, self.model, self.finish_s = 0, None, float('nan')  # model: a TimeModel of arrays
    self._frac, self._dir = np.full(n, self.step_fraction), np.zeros(n)
    self._fresh = np.ones(n, dtype=bool)

  def _observe(self, history: Sequence[StepStats]) -> None:
    ratio = np.ones(self.rules.workers)
    for st in history[self._seen:]:
      x, t = np.asarray(st.shares, dtype=np.float64), np.asarray(st.compute_s, dtype=np.float64)
      if self.model is not None:
        with np.errstate(divide='ignore', invalid='ignore'):
          ratio = t / self.model.time(x)
        self._ok[np.abs(ratio - 1) > self.change_tolerance] = False
      slot = self._seen % self.window
      sampled = np.asarray(st.sampled, dtype=bool) if st.sampled else True
      self._x[:, slot], self._t[:, slot], self._ok[:, slot] = x, t, sampled
      self._seen += 1
    fit, kind = _fit_rows(self._x, self._t, self._ok)
    new = np.array(dataclasses.astuple(fit))
    if self.model is not None:  # a one-share window keeps the old curve, rescaled by a running
      keep = (kind == 0) | ((kind == 1) & np.isfinite(ratio) & (ratio > 0))  # mean of its misses
      scale = np.where(kind == 1, 1 + (ratio - 1) / np.maximum(self._ok.sum(1), 1), 1.0)
      new = np.where(keep, np.array(dataclasses.astuple(self.model)) * scale, new)
    missing = ~np.isfinite(new[0]) | ((kind == 0) & (self.model is None))
    if not missing.all():  # a worker never usefully seen gets the median worker's curve
      new[:, missing] = np.median(new[:, ~missing], axis=1, keepdims=True)
      self.model = TimeModel(*new)

  def shares(self, step: int, history: Sequence[StepStats]) -> Shares:
    """Next step's shares: uniform at step 0 or without usable history, else the damped target."""
    if step == 0 or not history or len(history) < self._seen:
      self._reset()
    self._observe(history)
    if self.model is None:
      return self.rules.uniform()
    r, q = self.rules, float(self.rules.bucket)
    lo, hi = np.asarray(r.lower, dtype=np.float64), np.asarray(r.upper, dtype=np.float64)
    self.finish_s, target = finish_time_shares(self.model, r.global_batch, lo, hi)
    s = np.asarray(history[-1].shares, dtype=np.float64)
    d = np.sign(target - s)
    best = self.model.time(np.array(self._round(target, target, lo, hi))).max()
    late = self.model.time(s) > best * (1 + 1e-9)  # would finish after the best whole-bucket split
    want = ~self._fresh & ((np.abs(target - s) > self.dead_band_buckets * q) | late)
    if self.halve_on_reversal:
      f = np.where(want & (d == -self._dir), self._frac / 2, 2 * self._frac)
      self._frac = np.where(want, np.minimum(f, self.step_fraction), self._frac)
    self._dir = np.where(self._fresh, 0.0, np.where(want, d, self._dir))  # jumps set no direction
    size = q * np.maximum(np.round(self._frac * np.abs(target - s) / q),
                          self._frac == self.step_fraction)
    new = np.where(self._fresh, target, np.where(want, s + d * size, s))
    probed = np.zeros_like(self._fresh)
    if self._fresh.all() and self.probe:
      idx = np.flatnonzero(np.abs(target - s) < q)
      idx = idx[: len(idx) // 2 * 2]
      new[idx] = s[idx] + self.probe * q * (1 - 2 * (np.arange(len(idx)) % 2))
      probed[idx] = True
    self._fresh = probed
    return Shares(self._round(np.clip(new, lo, hi), target, lo, hi), r)

  def _round(self, x, target, lo, hi) -> tuple[int, ...]:
    """Whole buckets summing to X, handed out by modelled time rather than as from_weights does.

    A missing bucket goes to the worker modelled to finish soonest with it, a surplus one leaves
    the last to finish, first among workers short of (past) their target so no damped move is
    undone. E.g. (1238.8 ×3, 379.6) in 64-row buckets → (1280, 1216, 1216, 384).
    """
    q, (c, a, b) = self.rules.bucket, dataclasses.astuple(self.model)
    u = np.clip(np.floor(x / q + 1e-9), lo / q, hi / q).astype(np.int64)
    d = self.rules.global_batch // q - int(u.sum())
    sign, edge = (1, hi / q) if d > 0 else (-1, lo / q)
    toward = np.ceil(target / q - 1e-9) if d > 0 else np.floor(target / q + 1e-9)

    def key(i: int) -> tuple[bool, float]:  # past target last; then (minus) modelled time
      t = max(c[i], a[i] + b[i] * q * (u[i] + (sign > 0)))
      return bool(sign * (toward[i] - u[i]) <= 0), sign * float(t)

    heap = [(key(i), i) for i in np.flatnonzero(sign * (edge - u) > 0).tolist()]
    heapq.heapify(heap)
    for _ in range(abs(d)):
      i = heapq.heappop(heap)[1]
      u[i] += sign
      if sign * (edge[i] - u[i]) > 0:
        heapq.heappush(heap, (key(i), i))
    return tuple(int(v) * q for v in u)
