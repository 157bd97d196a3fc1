"""LB-BSP for GPU clusters: fit t(x) ≈ max(c, a + b·x) per worker, equalise finish times.

A GPU is flat at small batches (not saturated), linear beyond, and holds at most Mᵢ rows, so a
split ∝ speed mis-splits it. Each worker's curve is fitted from its recent (share, compute time)
points, T with Σᵢ clamp(tᵢ⁻¹(T), minᵢ, Mᵢ) = X is found by bisection (water-filling), and shares
step toward that target with a dead band, halving a worker's step when it reverses. The recent
points, the fitted curves and the stepping state are the policy's state (`GpuState`). Example:
``simulate_shares(LBBSPGpu(ShareRules(4096, 4, bucket=64)), StaticTrace((1, 1, 1, 3)),
ClockCosts(1e-3, fixed_s=0.05), 4096, 8)`` settles at (1280, 1216, 1216, 384) from step 1.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import jax
import numpy as np

from hetjax._errors import ConfigError
from hetjax.balance._policy import shares_array, shares_of
from hetjax.core import ShareRules, Shares, StepStats

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GpuState:
  """What `LBBSPGpu` has learned, per worker (n workers, a window of w points).

  Attributes:
    shares: the shares in force (the next step's), int64[n].
    x: the recent shares, float64[n, w], a ring written at ``seen % w``.
    t: their compute seconds, float64[n, w].
    ok: which points count, bool[n, w] (sampled, and not from before a change).
    seen: steps observed.
    curve: the fitted `TimeModel`, float64[3, n]: floor_s, intercept_s, slope_s rows.
    fitted: whether ``curve`` holds a model yet.
    finish_s: the modelled finish time of the last target (NaN before any).
    fraction: each worker's step fraction, float64[n] (halved on reversals).
    direction: the sign of each worker's last wanted move, float64[n] (0 when none).
    fresh: workers whose next decision jumps straight to target, bool[n].
  """

  shares: np.ndarray
  x: np.ndarray
  t: np.ndarray
  ok: np.ndarray
  seen: int
  curve: np.ndarray
  fitted: bool
  finish_s: float
  fraction: np.ndarray
  direction: np.ndarray
  fresh: np.ndarray

  @property
  def model(self) -> TimeModel | None:
    """The fitted curves as a `TimeModel` of arrays, or None before any fit."""
    return TimeModel(*self.curve) if self.fitted else None


@dataclasses.dataclass(frozen=True)
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

  rules: ShareRules
  window: int = 16
  step_fraction: float = 0.5
  dead_band_buckets: int = 1
  probe: int = 1
  change_tolerance: float = 0.25
  halve_on_reversal: bool = True
  name: str = dataclasses.field(default='lbbsp-gpu', init=False)

  def __post_init__(self):
    if self.window < 2 or not (0 < self.step_fraction <= 1 and self.change_tolerance > 0) or min(
        self.dead_band_buckets, self.probe) < 0:
      raise ConfigError(f'need window >= 2 ({self.window}), 0 < step_fraction <= 1 '
                        f'({self.step_fraction}), dead_band_buckets and probe >= 0 '
                        f'({self.dead_band_buckets}, {self.probe}), change_tolerance > 0 '
                        f'({self.change_tolerance})')
    for field, kind in (('window', int), ('step_fraction', float), ('dead_band_buckets', int),
                        ('probe', int), ('change_tolerance', float)):
      object.__setattr__(self, field, kind(getattr(self, field)))

  def init(self) -> GpuState:
    n, w = self.rules.workers, self.window
    return GpuState(
        shares=shares_array(self.rules.uniform()), x=np.zeros((n, w)), t=np.zeros((n, w)),
        ok=np.zeros((n, w), dtype=bool), seen=0, curve=np.zeros((3, n)), fitted=False,
        finish_s=float('nan'), fraction=np.full(n, self.step_fraction),
        direction=np.zeros(n), fresh=np.ones(n, dtype=bool))

  def _observe(self, state: GpuState, stats: StepStats) -> GpuState:
    """``state`` with ``stats``' point in the window and the curves refitted."""
    ratio = np.ones(self.rules.workers)
    xs, ts, ok = state.x.copy(), state.t.copy(), state.ok.copy()
    x, t = np.asarray(stats.rows, dtype=np.float64), np.asarray(stats.compute_s, dtype=np.float64)
    model = state.model
    if model is not None:
      with np.errstate(divide='ignore', invalid='ignore'):
        ratio = t / model.time(x)
      ok[np.abs(ratio - 1) > self.change_tolerance] = False
    slot = state.seen % self.window
    sampled = np.asarray(stats.sampled, dtype=bool) if stats.sampled else True
    xs[:, slot], ts[:, slot], ok[:, slot] = x, t, sampled
    fit, kind = _fit_rows(xs, ts, ok)
    new = np.array(dataclasses.astuple(fit))
    if model is not None:  # a one-share window keeps the old curve, rescaled by a running
      keep = (kind == 0) | ((kind == 1) & np.isfinite(ratio) & (ratio > 0))  # mean of its misses
      scale = np.where(kind == 1, 1 + (ratio - 1) / np.maximum(ok.sum(1), 1), 1.0)
      with np.errstate(invalid='ignore', over='ignore'):  # inf × 0 where the fit is used
        new = np.where(keep, state.curve * scale, new)
    missing = ~np.isfinite(new[0]) | ((kind == 0) & (model is None))
    curve, fitted = state.curve, state.fitted
    if not missing.all():  # a worker never usefully seen gets the median worker's curve
      new[:, missing] = np.median(new[:, ~missing], axis=1, keepdims=True)
      curve, fitted = new, True
    return dataclasses.replace(state, x=xs, t=ts, ok=ok, seen=state.seen + 1, curve=curve,
                               fitted=fitted)

  def update(self, state: GpuState, stats: StepStats | None) -> tuple[Shares, GpuState]:
    """The next shares: uniform without a usable fit, else the damped target."""
    if stats is None:
      return shares_of(state.shares, self.rules), state
    state = self._observe(state, stats)
    model = state.model
    if model is None:
      shares = self.rules.uniform()
      return shares, dataclasses.replace(state, shares=shares_array(shares))
    r, q = self.rules, float(self.rules.bucket)
    lo, hi = np.asarray(r.lower, dtype=np.float64), np.asarray(r.upper, dtype=np.float64)
    finish_s, target = finish_time_shares(model, r.global_batch, lo, hi)
    s = np.asarray(stats.rows, dtype=np.float64)
    d = np.sign(target - s)
    best = model.time(np.array(self._round(model, target, target, lo, hi))).max()
    late = model.time(s) > best * (1 + 1e-9)  # would finish after the best whole-bucket split
    fresh, frac, direction = state.fresh, state.fraction, state.direction
    want = ~fresh & ((np.abs(target - s) > self.dead_band_buckets * q) | late)
    if self.halve_on_reversal:
      f = np.where(want & (d == -direction), frac / 2, 2 * frac)
      frac = np.where(want, np.minimum(f, self.step_fraction), frac)
    direction = np.where(fresh, 0.0, np.where(want, d, direction))  # jumps set no direction
    size = q * np.maximum(np.round(frac * np.abs(target - s) / q), frac == self.step_fraction)
    new = np.where(fresh, target, np.where(want, s + d * size, s))
    probed = np.zeros_like(fresh)
    if fresh.all() and self.probe:
      idx = np.flatnonzero(np.abs(target - s) < q)
      idx = idx[: len(idx) // 2 * 2]
      new[idx] = s[idx] + self.probe * q * (1 - 2 * (np.arange(len(idx)) % 2))
      probed[idx] = True
    shares = Shares(self._round(model, np.clip(new, lo, hi), target, lo, hi), r)
    return shares, dataclasses.replace(
        state, shares=shares_array(shares), finish_s=float(finish_s), fraction=frac,
        direction=direction, fresh=probed)

  def _round(self, model: TimeModel, x, target, lo, hi) -> tuple[int, ...]:
    """Whole buckets summing to X, handed out by modelled time rather than as from_weights does.

    A missing bucket goes to the worker modelled to finish soonest with it, a surplus one leaves
    the last to finish, first among workers short of (past) their target so no damped move is
    undone. E.g. (1238.8 ×3, 379.6) in 64-row buckets → (1280, 1216, 1216, 384).
    """
    q, (c, a, b) = self.rules.bucket, dataclasses.astuple(model)
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
