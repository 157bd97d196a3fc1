"""`Pace`: what a step program calls at its phase boundaries when its host and links are emulated.

A program computes and communicates for real; where a host or a link is emulated
(`hetjax.emulation`: a host of known speed, a plan's stage costs, a replica's step, each
worker's link), the program hands each phase to its pace as the phase ends, and the pace sleeps
the rest of the time that host or link would take. So the program never asks what kind of host
it runs on, and one emulator serves every program:

* after a compute phase of ``rows`` rows (a share step, a token, a SchMP round's units, a
  replica's step): ``pad(step, rows, measured_s)``;
* after a stage action of a plan's pipeline: ``pad_action(step, stage, kind, measured_s)``;
* around a transfer of ``nbytes``: ``with pace.exchange(nbytes, collective): …``, which
  sleeps before it (a worker's own push and pull through a server) or after it (a ring
  collective paced by the slowest link);
* ``factor(step)`` and ``load(step)``: the host's slowdown, for the telemetry and for a
  policy's host-load input.

A program given no pace (None) runs at the machine's own pace. A pace that cannot price a
phase (a plan's stage costs asked for a step of rows, links through a server asked for a ring
collective) raises a one-line `hetjax.ConfigError` naming what it paces instead.

Example (a share step's compute, then its exchange)::

  start = time.perf_counter()
  grads = compute(rows)
  slept, overrun = pace.pad(step, rows, time.perf_counter() - start)
  with pace.exchange(nbytes, Collective.GRADIENT):
    grads = all_reduce(grads)
"""

from __future__ import annotations

import contextlib
import os
from typing import Protocol

from hetjax._links import Collective


class Pace(Protocol):
  """The emulated host and links a step program runs at (module docstring), from
  `hetjax.core.StepProgram.use_host`."""

  def factor(self, step: int) -> float:
    """The host's slowdown at ``step`` (1.0: an undisturbed host, or a host not emulated)."""
    ...

  def load(self, step: int) -> float | None:
    """The host-load input of ``step`` where the host is emulated: its slowdown (a sleeping
    host loads no CPU, so no OS counter would see it); None where only the links are."""
    ...

  def pad(self, step: int, rows: int, measured_s: float) -> tuple[float, float]:
    """After a compute phase of ``rows`` rows that took ``measured_s``: sleeps the rest of the
    host's time; returns (slept_s, overrun_s), the overrun being how far the compute ran past
    that time (then nothing is slept)."""
    ...

  def pad_action(self, step: int, stage: int, kind: str, measured_s: float
                 ) -> tuple[float, float]:
    """After stage ``stage``'s action ``kind`` ('forward', 'backward', 'update') of a plan's
    pipeline that took ``measured_s``: as `pad`, (slept_s, overrun_s)."""
    ...

  def exchange(self, nbytes: int, collective: Collective = Collective.GRADIENT
               ) -> contextlib.AbstractContextManager[None]:
    """A context around a transfer of ``nbytes`` (each worker's part, for an all-gather) as
    ``collective``: the time the links take is slept before or after the transfer."""
    ...


def host_load(pace: Pace | None, step: int) -> float:
  """The host-load input of a step: the emulated slowdown when the host is emulated
  (`Pace.load`), else the 1-minute load average per core."""
  load = None if pace is None else pace.load(step)
  if load is not None:
    return float(load)
  try:
    return os.getloadavg()[0] / (os.cpu_count() or 1)
  except OSError:
    return 0.0
