"""SDPipe's straggler injection on a real worker: each step padded by sleep to an emulated time.

On a shared 2-core machine a step's compute time varies with what the other processes do. To
emulate hosts of known speed, `StragglerPause` sleeps after each step's compute until the step
has taken ``factor × step_s`` (``factor`` is the worker's `Straggler` slowdown: 3 for a
'persistent:w:3' straggler, else 1), then adds the transient sleep of SDPipe's injection: ``h ×
step_s`` with probability ``p`` ('transient:h:p'). The draw for (worker, step) comes from a numpy
generator seeded with ``(seed, worker, step)``, so every policy run with the same seed meets the
same stragglers at the same steps. A compute longer than the target is not padded (that step is
slower than emulated; `ReplicaStep.compute_s` shows it).
"""

from __future__ import annotations

import dataclasses
import numbers
import time

import numpy as np

from hetjax._errors import ConfigError
from hetjax.pipeline._groups import positive_seconds
from hetjax.pipeline._virtual_sdpipe import Straggler, parse_straggler


@dataclasses.dataclass(frozen=True)
class StragglerPause:
  """``pause(step, compute_s)`` for `ReplicaDriver` (module docstring).

  Example::

    pause = StragglerPause(parse_straggler('transient:3'), worker=1, step_s=0.06)
    slept = pause(step, compute_s=0.012)   # 0.048 s, or 0.228 s on an injected step

  Attributes:
    straggler: the injection (`Straggler` or its string form).
    worker: this worker's id.
    step_s: a healthy worker's emulated step time, in seconds.
    seed: seeds the transient draws.
  """

  straggler: Straggler | str
  worker: int
  step_s: float
  seed: int = 0

  def __post_init__(self):
    object.__setattr__(self, 'straggler', parse_straggler(self.straggler))
    positive_seconds(self.step_s, 'step_s')
    for what in ('worker', 'seed'):
      value = getattr(self, what)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f'{what} must be an int >= 0, got {value!r}')
      object.__setattr__(self, what, int(value))

  @property
  def factor(self) -> float:
    """This worker's slowdown (transient sleeps apart)."""
    s = self.straggler
    return float(s.factor) if s.kind == 'persistent' and s.worker == self.worker else 1.0

  def transient_s(self, step: int) -> float:
    """The transient sleep injected at ``step`` (0.0 unless drawn)."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
      raise ConfigError(f'step must be an int >= 0, got {step!r}')
    s = self.straggler
    if s.kind != 'transient':
      return 0.0
    draw = np.random.default_rng([self.seed, self.worker, step]).random()
    return s.h * self.step_s if draw < s.p else 0.0

  def target_s(self, step: int) -> float:
    """How long ``step`` should take in all: factor × step_s plus its transient sleep."""
    return self.factor * self.step_s + self.transient_s(step)

  def __call__(self, step: int, compute_s: float) -> float:
    seconds = self.target_s(step) - compute_s
    if seconds <= 0:
      return 0.0
    start = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - start
