"""Hosts of known speed: a real worker's step padded by sleep to the time its emulated host takes.

Why: on a machine whose few cores several worker processes share, how fast a worker computes
depends on what its neighbours do at that moment. Time dilation (sleeping (s − 1) × the measured
compute) inherits that noise, multiplied by s: with more processes than cores a policy's block
time swings by a factor of two or more between blocks. A `KnownSpeedHost` instead defines the
host: a step of ``rows`` rows takes

  target = (factor(step) + delay(step)) × (fixed_s + rows × row_s / speed)

seconds (`HostModel`, the model the virtual clocks charge too), from the calibrated per-row cost (`calibrate_row_cost`) and the worker's `SlowdownTrace`
(a factor, and SDPipe's transient delay in units of the nominal step). ``speed`` is how many
times as fast per row this host is as one of ``row_s``: 1 when workers are alike; a worker of k
devices among workers of 1 runs at speed k (its devices as fast as theirs, rows split over
them), so that a host stands for what its devices would do, not for how this machine's cores
happen to be shared out among them. The worker computes for
real, then sleeps until the target. Compute, collectives, compiles and the policies' decisions
stay real; only the host's speed is defined rather than left to whoever shares the cores. A
compute that takes longer than the target is not padded and is reported as an overrun, so a
benchmark can say how often (and by how much) the emulation failed to hold.

Example::

  host = KnownSpeedHost(parse_trace('static:1,3', 2), worker=1, row_s=2e-4, fixed_s=1e-3)
  start = time.perf_counter()
  run_step(rows=100)
  slept, overrun = host.pad(step, rows=100, measured_s=time.perf_counter() - start)  # to 63 ms

A `KnownSpeedHost` is a `hetjax.core.Pace` of its own (a program takes it with ``use_host``):
it pads compute phases of rows and leaves transfers as they are; on emulated links it is
`LinkedHost`'s host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import time
from collections.abc import Callable

from hetjax._errors import ConfigError
from hetjax._links import Collective
from hetjax.emulation._host_model import HostModel
from hetjax.emulation._traces import SlowdownTrace


def _seconds(value: float, what: str) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) \
      or not (math.isfinite(value) and value >= 0):
    raise ConfigError(f'{what} must be a finite number >= 0, got {value!r}')
  return float(value)


def _count(value: int, what: str) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
    raise ConfigError(f'{what} must be an int >= 0, got {value!r}')
  return int(value)


@dataclasses.dataclass(frozen=True)
class KnownSpeedHost:
  """Worker ``worker``'s emulated host (module docstring): ``pad`` each step to ``target_s``.

  Example::

    >>> host = KnownSpeedHost(StaticTrace((1, 3)), worker=1, row_s=0.002, fixed_s=0.01)
    >>> round(host.target_s(step=0, rows=20), 12)   # 3 × (10 ms + 20 × 2 ms)
    0.15

  Attributes:
    trace: the slowdowns of all workers; this host uses row ``worker``.
    worker: this worker's id in ``trace``.
    row_s: seconds per row of this model on an undisturbed host of speed 1 (calibrated,
      margin included).
    fixed_s: seconds per step whatever the rows (dispatch, the step's own overhead).
    speed: how many times as fast per row as a host of ``row_s``, > 0: a worker's device
      count over the fewest any worker has (devices of equal speed), 1 when workers are alike.
      The per-row cost is ``row_s / speed``; ``fixed_s`` is not scaled.
    sleep: sleeps that many seconds (`time.sleep`; injectable for tests).
    clock: seconds, monotonic (`time.perf_counter`; injectable for tests).
  """

  trace: SlowdownTrace
  worker: int
  row_s: float
  fixed_s: float = 0.0
  speed: float = 1.0
  sleep: Callable[[float], None] = time.sleep
  clock: Callable[[], float] = time.perf_counter

  def __post_init__(self):
    worker = _count(self.worker, 'worker')
    if worker >= self.trace.workers:
      raise ConfigError(f'worker {worker} out of range for {self.trace.workers} workers')
    object.__setattr__(self, 'worker', worker)
    if _seconds(self.row_s, 'row_s') == 0:
      raise ConfigError('row_s must be > 0, got 0')
    object.__setattr__(self, 'row_s', float(self.row_s))
    object.__setattr__(self, 'fixed_s', _seconds(self.fixed_s, 'fixed_s'))
    if isinstance(self.speed, bool) or not isinstance(self.speed, numbers.Real) \
        or not (math.isfinite(self.speed) and self.speed > 0):
      raise ConfigError(f'speed must be a finite number > 0, got {self.speed!r}')
    object.__setattr__(self, 'speed', float(self.speed))

  def factor(self, step: int) -> float:
    """This host's multiplicative slowdown at ``step`` (1.0 = the calibrated speed)."""
    return self.trace.factor(self.worker, step)

  def load(self, step: int) -> float:
    """The host-load input of ``step``: its slowdown (`hetjax.core.Pace.load`)."""
    return self.factor(step)

  @functools.cached_property
  def model(self) -> HostModel:
    """This host's cost of a step, the one model the virtual clocks charge too."""
    return HostModel(self.row_s, self.fixed_s, self.speed)

  def nominal_s(self, rows: int) -> float:
    """An undisturbed host's seconds for a step of ``rows`` rows: fixed_s + rows × row_s / speed.

    Example::

      >>> KnownSpeedHost(StaticTrace((1, 1)), 0, row_s=0.002, fixed_s=0.01, speed=2).nominal_s(20)
      0.03
    """
    return self.model.nominal_s(_count(rows, 'rows'))

  def target_s(self, step: int, rows: int) -> float:
    """Seconds step ``step`` of ``rows`` rows takes on this host: (factor + delay) × nominal."""
    slowdown = self.factor(step) + self.trace.delay(self.worker, step)
    return self.model.step_s(_count(rows, 'rows'), slowdown)

  def pad(self, step: int, rows: int, measured_s: float) -> tuple[float, float]:
    """Sleeps the rest of the target after a compute of ``measured_s``; returns (slept, overrun).

    ``slept`` is the time actually slept, by ``clock`` (0.0 if none); ``overrun`` is how far
    ``measured_s`` went past the target (0.0 if it did not), in which case nothing is slept.
    A worker that makes several calls a step (tokens) passes ``measured_s`` plus the overrun
    the previous call returned: the host's clock runs over the step, so one slow call is made
    up by the next one's padding, and only what is late after the last call is an overrun.

    Example::

      >>> host = KnownSpeedHost(StaticTrace((1.0,)), 0, row_s=0.001)
      >>> host.pad(0, rows=50, measured_s=0.08)    # target 0.05: 30 ms too slow
      (0.0, 0.03)
    """
    measured_s = _seconds(measured_s, 'measured_s')
    rest = self.target_s(step, rows) - measured_s
    if rest <= 0:
      return 0.0, -rest
    start = self.clock()
    self.sleep(rest)
    return self.clock() - start, 0.0

  def pad_action(self, step: int, stage: int, kind: str, measured_s: float
                 ) -> tuple[float, float]:
    """Refused in one line: a cost per row prices no stage action (`StagePace` does)."""
    raise ConfigError(f'a host of a cost per row (worker {self.worker}) paces steps of rows, '
                      f'not stage {stage}\'s {kind}: a plan\'s stages need a '
                      'hetjax.emulation.StagePace (roofline costs per action)')

  def exchange(self, nbytes: int, collective: Collective = Collective.GRADIENT
               ) -> contextlib.AbstractContextManager[None]:
    """No links of its own: a transfer takes the machine's time (`LinkedHost` adds links)."""
    return contextlib.nullcontext()
