"""What a step program needs of the host it runs as: its slowdown and the padding of a step."""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable


@runtime_checkable
class EmulatedHost(Protocol):
  """A host of known speed (`hetjax.emulation.KnownSpeedHost`)."""

  def factor(self, step: int) -> float:
    """The host's slowdown at ``step`` (1.0: an undisturbed host)."""
    ...

  def pad(self, step: int, rows: int, measured_s: float) -> tuple[float, float]:
    """Sleeps until ``rows`` rows took the host's time; returns (slept_s, overrun_s)."""
    ...


def host_load(host: EmulatedHost | None, step: int) -> float:
  """The host-load input of a step: the emulated slowdown when the host is emulated (sleeping
  loads no CPU, so no OS counter would see it), else the 1-minute load average per core."""
  if host is not None:
    return float(host.factor(step))
  try:
    return os.getloadavg()[0] / (os.cpu_count() or 1)
  except OSError:
    return 0.0
