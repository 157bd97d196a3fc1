"""Next-step speed predictors for LB-BSP: last value, EWMA and AR(p) baselines.

LB-BSP (CPU mode) splits the batch in proportion to *predicted* speeds, so a predictor trades
noise rejection against lag. The paper's NARX (`hetjax.balance._narx`) is judged against these
three. All are online and, like Optax transformations, hold only settings: ``init(workers)``
gives a state, ``update(state, speeds, load)`` takes one step's speeds (and exogenous load, if
known) and returns the next state, ``predict(state)`` gives the next step's speeds, one per
worker, vectorised over any number of workers. A state is a pytree of numpy arrays and Python
scalars whose shapes are fixed by ``init``, so it is saved in checkpoints as it is.

Example::

  >>> p = EWMA(alpha=0.1)
  >>> state = p.update(p.init(2), np.array([100.0, 50.0]), None)
  >>> state = p.update(state, np.array([80.0, 50.0]), None)
  >>> p.predict(state)   # a running mean over the first 1/α steps
  array([90., 50.])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from hetjax._checks import positive_int
from hetjax._errors import ConfigError


@runtime_checkable
class SpeedPredictor(Protocol):
  """Online next-step speed prediction: ``update`` once per finished step, then ``predict``."""

  @property
  def name(self) -> str: ...

  def init(self, workers: int) -> Any: ...

  def update(self, state: Any, speeds: np.ndarray, load: np.ndarray | None) -> Any: ...

  def predict(self, state: Any) -> np.ndarray: ...


def clip_to_recent(predicted: np.ndarray, recent: np.ndarray, low: float = 0.2,
                   high: float = 5.0) -> np.ndarray:
  """Keeps a model's prediction within [low × min, high × max] of each worker's recent speeds.

  A fitted model extrapolates wildly on data it has not seen (a level shift in its window); a
  speed outside this band is never plausible one step ahead. Non-finite predictions become the
  last value.

  Args:
    predicted: float[workers].
    recent: float[steps, workers], the last row being the last observed speeds.
  """
  p = np.where(np.isfinite(predicted), predicted, recent[-1])
  return np.clip(p, low * recent.min(axis=0), high * recent.max(axis=0))


def checked_speeds(speeds: np.ndarray, workers: int) -> np.ndarray:
  """``speeds`` as float64[workers], or a ConfigError naming the shape."""
  s = np.asarray(speeds, dtype=np.float64)
  if s.shape != (workers,):
    raise ConfigError(f'speeds of shape {s.shape}; expected one per worker ({workers})')
  return s


def _unseen() -> ConfigError:
  return ConfigError('predict() before any update()')


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LastValueState:
  """`LastValue`'s state: the last speeds (float64[workers]) and how many steps were seen."""

  last: np.ndarray
  seen: int


@dataclasses.dataclass(frozen=True)
class LastValue:
  """Next speed = last speed: the naive baseline, exact on a static cluster, lags by one step."""

  name: str = dataclasses.field(default='last', init=False)

  def init(self, workers: int) -> LastValueState:
    return LastValueState(np.zeros(positive_int(workers, 'predictor workers')), 0)

  def update(self, state: LastValueState, speeds: np.ndarray,
             load: np.ndarray | None) -> LastValueState:
    return LastValueState(checked_speeds(speeds, len(state.last)).copy(), state.seen + 1)

  def predict(self, state: LastValueState) -> np.ndarray:
    if not state.seen:
      raise _unseen()
    return state.last.copy()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShiftState:
  """`ShiftDetector`'s state, per worker (float64[workers] each).

  Attributes:
    sign: the direction of an unconfirmed big move at the last step (+1, −1; 0 when none).
    scale: the typical |log(v / ref)| of ordinary steps.
    quiet: how many ordinary (not big) steps ``scale`` was learned from.
  """

  sign: np.ndarray
  scale: np.ndarray
  quiet: np.ndarray


@dataclasses.dataclass(frozen=True)
class ShiftDetector:
  """Tells a level shift from jitter: a big move twice running, in the same direction.

  Workers sharing cores measure their compute with a coefficient of variation of several tenths
  per step, so one large deviation is usually noise; a move beyond twice the limit counts at once.
  "Big" is the larger of ``threshold`` and
  ``noise_multiple`` times the worker's typical deviation (a running mean of |log(v / ref)|),
  so the detector is as sensitive as the noise allows: on a quiet worker a 30% move counts, on
  a noisy one only a move well outside its jitter (a 3x straggler appearing still does).
  ``threshold=None`` never reports a shift.

  Example::

    >>> d = ShiftDetector(0.3)
    >>> shifted, s = d.update(d.init(1), np.array([3.0]), np.array([1.0]))
    >>> shifted   # 3x is beyond twice the 30% limit: a shift at once
    array([ True])
  """

  threshold: float | None
  noise_multiple: float = 3.0
  memory: float = 0.1

  def init(self, workers: int) -> ShiftState:
    n = positive_int(workers, 'predictor workers')
    return ShiftState(np.zeros(n), np.zeros(n), np.zeros(n))

  def update(self, state: ShiftState, value: np.ndarray,
             reference: np.ndarray) -> tuple[np.ndarray, ShiftState]:
    """Which workers shifted, given this step's ``value`` and the running ``reference``."""
    if self.threshold is None:
      return np.zeros(value.shape, dtype=bool), state
    log_dev = np.log(np.maximum(value, 1e-300) / np.maximum(reference, 1e-300))
    limit = np.maximum(np.log1p(self.threshold), self.noise_multiple * state.scale)
    sign = np.where(np.abs(log_dev) > limit, np.sign(log_dev), 0.0)
    # Confirmed by a second step, or at once when twice beyond the limit (far outside the jitter).
    confirmed = ((sign != 0) & (state.sign == sign)) | (np.abs(log_dev) > 2 * limit)
    quiet = sign == 0  # learn the jitter from ordinary steps only (a plain mean at first)
    seen = state.quiet + quiet
    weight = np.maximum(self.memory, 1.0 / np.maximum(seen, 1.0))
    scale = np.where(quiet, (1 - weight) * state.scale + weight * np.abs(log_dev), state.scale)
    return confirmed, ShiftState(np.where(confirmed, 0.0, sign), scale, seen)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EWMAState:
  """`EWMA`'s state.

  Attributes:
    mean: the running mean speed, float64[workers].
    count: observations since each worker's last (re)start, float64[workers].
    seen: steps seen.
    shift: the level-shift detector's state.
  """

  mean: np.ndarray
  count: np.ndarray
  seen: int
  shift: ShiftState


@dataclasses.dataclass(frozen=True)
class EWMA:
  """Exponentially weighted mean with a running-mean start, restarted on a confirmed shift.

  After a (re)start the weight of a new speed is max(α, 1/n) for its n-th observation: a plain
  running mean at first (its noise falls like 1/√n), an EWMA of weight α once n > 1/α. A move
  by more than ``reset`` twice running in one direction (`ShiftDetector`) restarts the mean at
  the latest speed, so a lasting change is followed in two steps while single-step jitter of
  the size seen on shared cores is averaged away. ``reset=None`` disables restarts.
  """

  alpha: float = 0.1
  reset: float | None = 0.3
  name: str = dataclasses.field(default='ewma', init=False)

  def __post_init__(self):
    if not 0 < self.alpha <= 1:
      raise ConfigError(f'EWMA alpha {self.alpha} must be in (0, 1]')
    if self.reset is not None and not self.reset > 0:
      raise ConfigError(f'EWMA reset {self.reset} must be > 0 or None')

  @property
  def detector(self) -> ShiftDetector:
    return ShiftDetector(self.reset)

  def init(self, workers: int) -> EWMAState:
    n = positive_int(workers, 'predictor workers')
    return EWMAState(np.zeros(n), np.zeros(n), 0, self.detector.init(n))

  def update(self, state: EWMAState, speeds: np.ndarray, load: np.ndarray | None) -> EWMAState:
    v = checked_speeds(speeds, len(state.mean))
    if not state.seen:
      return EWMAState(v.copy(), np.ones(len(v)), 1, state.shift)
    shifted, shift = self.detector.update(state.shift, v, state.mean)
    count = np.where(shifted, 1.0, state.count + 1)
    weight = np.maximum(self.alpha, 1.0 / count)
    mean = np.where(shifted, v, weight * v + (1 - weight) * state.mean)
    return EWMAState(mean, count, state.seen + 1, shift)

  def predict(self, state: EWMAState) -> np.ndarray:
    if not state.seen:
      raise _unseen()
    return state.mean.copy()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ARState:
  """`AR`'s state.

  Attributes:
    buf: the last ``window`` speeds, float64[window, workers], newest last (before two points
      are seen, the first one repeated).
    age: points since each worker's last level shift, int64[workers] (at most ``window``).
    seen: steps seen.
  """

  buf: np.ndarray
  age: np.ndarray
  seen: int


@dataclasses.dataclass(frozen=True)
class AR:
  """Per-worker AR(p) with intercept, refitted each step by least squares on the last points.

  vₜ₊₁ = c + Σₖ aₖ·vₜ₋ₖ₊₁, fitted on each worker's last ``window`` speeds (ridge-stabilised
  normal equations, batched over workers). Until a worker has 2(p + 1) regression rows (3p + 2
  points) since its last level shift (a move by more than ``reset``, as in `EWMA`) it predicts
  its last value; predictions are clipped by `clip_to_recent`.

  Example::

    ar = AR(p=2, window=32)
    state = ar.init(workers)
    for v in speeds:  # float[steps, workers]
      state = ar.update(state, v, None)
    ar.predict(state)  # float[workers]
  """

  p: int = 2
  window: int = 32
  reset: float | None = 0.3
  name: str = dataclasses.field(default='ar', init=False)

  def __post_init__(self):
    if self.p < 1 or self.window < 2 * (self.p + 1):
      raise ConfigError(f'AR needs p >= 1 and window >= 2(p + 1); got p={self.p}, '
                        f'window={self.window}')

  def init(self, workers: int) -> ARState:
    n = positive_int(workers, 'predictor workers')
    return ARState(np.zeros((self.window, n)), np.zeros(n, dtype=np.int64), 0)

  def update(self, state: ARState, speeds: np.ndarray, load: np.ndarray | None) -> ARState:
    v = checked_speeds(speeds, state.buf.shape[1])
    if not state.seen:
      buf, age = np.repeat(v[None], self.window, axis=0), np.zeros(len(v), dtype=np.int64)
    else:
      buf, age = state.buf, state.age
      if self.reset is not None:
        last = buf[-1]
        age = np.where(np.abs(v - last) > self.reset * last, 0, age)
    return ARState(np.concatenate([buf[1:], v[None]]), np.minimum(age + 1, self.window),
                   state.seen + 1)

  def predict(self, state: ARState) -> np.ndarray:
    if not state.seen:
      raise _unseen()
    buf, p, w = state.buf, self.p, self.window
    rows = w - p  # regression rows: targets buf[p:], lags buf[p-k:w-k] for k = 1 … p
    lags = np.stack([buf[p - k:w - k] for k in range(1, p + 1)], axis=-1)  # [rows, n, p]
    y = buf[p:]  # [rows, n]
    valid = np.arange(rows)[:, None] >= (w - state.age)[None, :]  # all lags since the shift
    m = valid.astype(np.float64)
    count = np.maximum(m.sum(axis=0), 1.0)
    lag_mean = (m[..., None] * lags).sum(axis=0) / count[:, None]  # [n, p]
    y_mean = (m * y).sum(axis=0) / count
    xc = (lags - lag_mean[None]) * m[..., None]
    yc = (y - y_mean[None]) * m
    gram = np.einsum('rnp,rnq->npq', xc, xc)
    ridge = 1e-8 * np.trace(gram, axis1=1, axis2=2)[:, None, None] + 1e-300
    coef = np.linalg.solve(gram + ridge * np.eye(p), np.einsum('rnp,rn->np', xc, yc)[..., None])
    latest = buf[w - p:][::-1].T  # [n, p]: v_t, v_{t-1}, …
    pred = y_mean + ((latest - lag_mean)[:, None, :] @ coef)[:, 0, 0]
    pred = clip_to_recent(pred, buf)
    return np.where(m.sum(axis=0) >= 2 * (p + 1), pred, buf[-1])
