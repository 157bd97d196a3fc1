"""The host model: what a step costs on a host of known speed, written once for both clocks.

A step of ``rows`` rows on a host takes

  slowdown × (fixed_s + rows × row_s / speed)

seconds: a fixed per-step overhead plus a calibrated cost per row (divided by the host's speed,
1 when workers are alike), all stretched by the slowdown in force, the trace's factor plus its
transient delay (`SlowdownTrace`). `KnownSpeedHost` pads real steps to this time; the virtual
clocks (`hetjax.simulation.ClockCosts`, `hetjax.simulation.simulate_sync`) charge it. Sharing the
one object is what lets a virtual run and a real one on emulated hosts agree: a change to the
model is one change.

Pure arithmetic on floats or numpy arrays (one entry per worker): no clocks, no devices.

Example::

  >>> host = HostModel(row_s=0.002, fixed_s=0.01)
  >>> round(host.step_s(20, slowdown=3), 12)      # 3 × (10 ms + 20 × 2 ms)
  0.15
  >>> HostModel(row_s=(1e-3, 2e-3)).step_s(np.array([100, 50]), np.array([1.0, 2.0])).tolist()
  [0.1, 0.2]
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from hetjax._errors import ConfigError


def _finite(value, what: str, positive: bool) -> None:
  values = np.atleast_1d(np.asarray(value, dtype=np.float64)) if not isinstance(value, bool) \
      else np.array([math.nan])
  bound = '> 0' if positive else '>= 0'
  if values.size == 0 or not np.all(np.isfinite(values)) or not (
      np.all(values > 0) if positive else np.all(values >= 0)):
    raise ConfigError(f'{what} must be finite and {bound}, got {value!r}')


@dataclasses.dataclass(frozen=True)
class HostModel:
  """A host's (or each worker's) cost of a step: ``slowdown × (fixed_s + rows × row_s / speed)``.

  Attributes:
    row_s: seconds per row on an undisturbed host of speed 1; one value, or one per worker
      (a tuple, for the virtual clock's workers of different base speed).
    fixed_s: seconds per step whatever the rows (dispatch, the step's own overhead); not
      divided by ``speed``.
    speed: how many times as fast per row as a host of ``row_s`` (e.g. a worker's device count
      over the fewest any worker has).
  """

  row_s: float | tuple[float, ...]
  fixed_s: float = 0.0
  speed: float = 1.0

  def __post_init__(self):
    _finite(self.row_s, 'row_s', positive=True)
    _finite(self.fixed_s, 'fixed_s', positive=False)
    if isinstance(self.speed, bool) or not isinstance(self.speed, numbers.Real):
      raise ConfigError(f'speed must be a finite number > 0, got {self.speed!r}')
    _finite(self.speed, 'speed', positive=True)

  def nominal_s(self, rows):
    """An undisturbed host's seconds for ``rows`` rows: fixed_s + rows × row_s / speed."""
    row_s = np.asarray(self.row_s, dtype=np.float64) if isinstance(self.row_s, tuple) \
        else self.row_s
    return self.fixed_s + rows * row_s / self.speed

  def step_s(self, rows, slowdown=1.0):
    """Seconds for ``rows`` rows under ``slowdown`` (factor + transient delay, 1: none)."""
    return slowdown * self.nominal_s(rows)
