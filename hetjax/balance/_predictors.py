"""Next-step speed predictors for LB-BSP: last value, EWMA and AR(p) baselines.

LB-BSP (CPU mode) splits the batch in proportion to *predicted* speeds, so a predictor trades
noise rejection against lag. The paper's NARX (`hetjax.balance._narx`) is judged against these
three. All are online: `update` takes one step's speeds (and exogenous load, if known), then
`predict` gives the next step's speeds, one per worker, vectorised over any number of workers.

Example::

  >>> p = EWMA(alpha=0.1)
  >>> p.update(np.array([100.0, 50.0]), None); p.update(np.array([80.0, 50.0]), None)
  >>> p.predict()   # a running mean over the first 1/α steps
  array([90., 50.])
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import numpy as np

from hetjax._errors import ConfigError


@runtime_checkable
class SpeedPredictor(Protocol):
  """Online next-step speed prediction: ``update`` once per finished step, then ``predict``."""

  @property
  def name(self) -> str: ...

  def update(self, speeds: np.ndarray, load: np.ndarray | None) -> None: ...

  def predict(self) -> np.ndarray: ...


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


def _checked(speeds: np.ndarray, known: np.ndarray | None) -> np.ndarray:
  s = np.asarray(speeds, dtype=np.float64)
  if s.ndim != 1 or (known is not None and s.shape != known.shape):
    raise ConfigError(f'speeds of shape {s.shape}; expected one per worker'
                      + ('' if known is None else f' ({known.shape[0]})'))
  return s


class LastValue:
  """Next speed = last speed: the naive baseline, exact on a static cluster, lags by one step."""

  name = 'last'

  def __init__(self):
    self._last: np.ndarray | None = None

  def update(self, speeds: np.ndarray, load: np.ndarray | None) -> None:
    self._last = _checked(speeds, self._last).copy()

  def predict(self) -> np.ndarray:
    if self._last is None:
      raise ConfigError('predict() before any update()')
    return self._last.copy()


class ShiftDetector:
  """Tells a level shift from jitter: a big move twice running, in the same direction.

  Workers sharing cores measure their compute with a coefficient of variation of 0.3–0.5 per
  step, so one large deviation is usually noise; a move beyond twice the limit counts at once.
  "Big" is the larger of ``threshold`` and
  ``noise_multiple`` times the worker's typical deviation (a running mean of |log(v / ref)|),
  so the detector is as sensitive as the noise allows: on a quiet worker a 30% move counts, on
  a noisy one only a move well outside its jitter (a 3x straggler appearing still does).
  """

  def __init__(self, threshold: float | None, noise_multiple: float = 3.0, memory: float = 0.1):
    self.threshold, self.noise_multiple, self.memory = threshold, noise_multiple, memory
    self._sign: np.ndarray | None = None
    self._scale: np.ndarray | None = None

  def __call__(self, value: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Which workers shifted, given this step's ``value`` and the running ``reference``."""
    if self.threshold is None:
      return np.zeros(value.shape, dtype=bool)
    log_dev = np.log(np.maximum(value, 1e-300) / np.maximum(reference, 1e-300))
    if self._scale is None:
      self._scale, self._sign = np.zeros(value.shape), np.zeros(value.shape)
      self._seen = np.zeros(value.shape)
    limit = np.maximum(np.log1p(self.threshold), self.noise_multiple * self._scale)
    sign = np.where(np.abs(log_dev) > limit, np.sign(log_dev), 0.0)
    # Confirmed by a second step, or at once when twice beyond the limit (far outside the jitter).
    confirmed = ((sign != 0) & (self._sign == sign)) | (np.abs(log_dev) > 2 * limit)
    self._sign = np.where(confirmed, 0.0, sign)
    quiet = sign == 0  # learn the jitter from ordinary steps only (a plain mean at first)
    self._seen = self._seen + quiet
    weight = np.maximum(self.memory, 1.0 / np.maximum(self._seen, 1.0))
    self._scale = np.where(quiet, (1 - weight) * self._scale + weight * np.abs(log_dev),
                           self._scale)
    return confirmed


@dataclasses.dataclass(eq=False)
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
    self._mean: np.ndarray | None = None
    self._count: np.ndarray | None = None
    self._shift = ShiftDetector(self.reset)

  def update(self, speeds: np.ndarray, load: np.ndarray | None) -> None:
    v = _checked(speeds, self._mean)
    if self._mean is None:
      self._mean, self._count = v.copy(), np.ones(len(v))
      return
    shifted = self._shift(v, self._mean)
    self._count = np.where(shifted, 1.0, self._count + 1)
    weight = np.maximum(self.alpha, 1.0 / self._count)
    self._mean = np.where(shifted, v, weight * v + (1 - weight) * self._mean)

  def predict(self) -> np.ndarray:
    if self._mean is None:
      raise ConfigError('predict() before any update()')
    return self._mean.copy()


@dataclasses.dataclass(eq=False)
class AR:
  """Per-worker AR(p) with intercept, refitted each step by least squares on the last points.

  vₜ₊₁ = c + Σₖ aₖ·vₜ₋ₖ₊₁, fitted on each worker's last ``window`` speeds (ridge-stabilised
  normal equations, batched over workers). Until a worker has 2(p + 1) regression rows (3p + 2
  points) since its last level shift (a move by more than ``reset``, as in `EWMA`) it predicts
  its last value; predictions are clipped by `clip_to_recent`.

  Example::

    ar = AR(p=2, window=32)
    for v in speeds:  # float[steps, workers]
      ar.update(v, None)
    ar.predict()  # float[workers]
  """

  p: int = 2
  window: int = 32
  reset: float | None = 0.3
  name: str = dataclasses.field(default='ar', init=False)

  def __post_init__(self):
    if self.p < 1 or self.window < 2 * (self.p + 1):
      raise ConfigError(f'AR needs p >= 1 and window >= 2(p + 1); got p={self.p}, '
                        f'window={self.window}')
    self._buf: np.ndarray | None = None  # float[window, workers], newest last
    self._age: np.ndarray | None = None  # points since each worker's last level shift

  def update(self, speeds: np.ndarray, load: np.ndarray | None) -> None:
    v = _checked(speeds, None if self._buf is None else self._buf[-1])
    if self._buf is None:
      self._buf = np.repeat(v[None], self.window, axis=0)
      self._age = np.zeros(len(v), dtype=np.int64)
    elif self.reset is not None:
      last = self._buf[-1]
      self._age[np.abs(v - last) > self.reset * last] = 0
    self._buf = np.concatenate([self._buf[1:], v[None]])
    self._age = np.minimum(self._age + 1, self.window)

  def predict(self) -> np.ndarray:
    if self._buf is None:
      raise ConfigError('predict() before any update()')
    buf, p, w = self._buf, self.p, self.window
    rows = w - p  # regression rows: targets buf[p:], lags buf[p-k:w-k] for k = 1 … p
    lags = np.stack([buf[p - k:w - k] for k in range(1, p + 1)], axis=-1)  # [rows, n, p]
    y = buf[p:]  # [rows, n]
    valid = np.arange(rows)[:, None] >= (w - self._age)[None, :]  # all lags since the shift
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
