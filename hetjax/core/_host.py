"""What a step program needs of the host it runs as: its slowdown and the padding of a step."""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

from hetjax._errors import ConfigError


@runtime_checkable
class EmulatedHost(Protocol):
  """A host of known speed (`hetjax.emulation.KnownSpeedHost`)."""

  def factor(self, step: int) -> float:
    """The host's slowdown at ``step`` (1.0: an undisturbed host)."""
    ...

  def pad(self, step: int, rows: int, measured_s: float) -> tuple[float, float]:
    """Sleeps until ``rows`` rows took the host's time; returns (slept_s, overrun_s)."""
    ...


def known_speed_host(host, program: str) -> EmulatedHost | None:
  """``host`` when it is a host of known speed or None (what a share, token, SchMP or
  parameter-server step pads to); a one-line error naming ``program`` otherwise."""
  if host is None or isinstance(host, EmulatedHost):
    return host
  raise ConfigError(f'{program} pads each step to a host of known speed (factor and pad per '
                    f'step and rows, hetjax.emulation.KnownSpeedHost), got {type(host).__name__}')


def host_load(host: EmulatedHost | None, step: int) -> float:
  """The host-load input of a step: the emulated slowdown when the host is emulated (sleeping
  loads no CPU, so no OS counter would see it), else the 1-minute load average per core."""
  if host is not None:
    return float(host.factor(step))
  try:
    return os.getloadavg()[0] / (os.cpu_count() or 1)
  except OSError:
    return 0.0
