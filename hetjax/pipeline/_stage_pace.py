"""Hosts of known speed for pipeline stages: each action a worker takes part in, padded by sleep.

A `hetjax.emulation.KnownSpeedHost` pads a share step to rows × a calibrated cost per row × the
worker's slowdown. A pipeline whose stages span workers (a grouped plan) has no one step per
worker: a worker runs the forward and backward of every stage it has devices in, once per
micro-batch, and each stage's update. So its host is defined per action: stage s's ``kind``
(``'forward'``, ``'backward'``, ``'update'``) takes ``nominal_s[s, kind]`` on an undisturbed
host — calibrated by timing the real actions (`ActionTimes`, `calibrated_costs`) — and
``(factor + delay) × nominal`` on this worker's host at that step (its `SlowdownTrace` row).
The worker runs the action for real (the pipeline waits for each action when a stage spans
processes) and sleeps the rest; the collectives of the next action make the other members of
its groups wait for it, as they would for a slower host. An action that ran longer than its
target is not padded and counts as past its time (``overruns``): on a fast worker this is
mostly waiting for a slow peer inside the action's collective.

Example::

  pace = StagePace(parse_trace('static:1,3', 2), worker=1, nominal_s={(0, 'forward'): 0.01})
  pace.pad(step=0, stage=0, kind='forward', measured_s=0.004)   # sleeps 26 ms
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from hetjax._errors import ConfigError

Action = tuple[int, str]  # (stage, kind)


class ActionPace(Protocol):
  """What `PipelineTrainer` calls after each of this worker's actions (`PipelineTrainer.pace`)."""

  def pad(self, step: int, stage: int, kind: str, measured_s: float) -> tuple[float, float]:
    """Sleeps as the host says after an action of ``measured_s``; (slept, overrun) seconds."""
    ...


@dataclasses.dataclass
class ActionTimes:
  """Records every action's measured seconds and sleeps nothing (calibration)."""

  seconds: dict[Action, list[float]] = dataclasses.field(
      default_factory=lambda: collections.defaultdict(list))

  def pad(self, step: int, stage: int, kind: str, measured_s: float) -> tuple[float, float]:
    del step
    self.seconds[stage, kind].append(measured_s)
    return 0.0, 0.0

  def medians(self) -> dict[Action, float]:
    return {action: float(np.median(times)) for action, times in self.seconds.items()}


@dataclasses.dataclass
class StagePace:
  """This worker's host for its stage actions (module docstring).

  Attributes:
    trace: every worker's slowdowns; this host reads row ``worker``.
    worker: this worker.
    nominal_s: an undisturbed host's seconds per action of the stages this worker is in.
    sleep, clock: injectable for tests.
    slept_s, overruns, overrun_s: what the padding did so far.
  """

  trace: object
  worker: int
  nominal_s: Mapping[Action, float]
  sleep: Callable[[float], None] = time.sleep
  clock: Callable[[], float] = time.perf_counter
  slept_s: float = 0.0
  overruns: int = 0
  overrun_s: float = 0.0

  def target_s(self, step: int, stage: int, kind: str) -> float:
    """Seconds the action takes on this host at ``step``: (factor + delay) × nominal."""
    try:
      nominal = self.nominal_s[stage, kind]
    except KeyError:
      raise ConfigError(f'no calibrated cost for stage {stage} {kind} on worker '
                        f'{self.worker}') from None
    return (self.trace.factor(self.worker, step) + self.trace.delay(self.worker, step)) * nominal

  def pad(self, step: int, stage: int, kind: str, measured_s: float) -> tuple[float, float]:
    rest = self.target_s(step, stage, kind) - measured_s
    if rest <= 0:
      self.overruns += 1
      self.overrun_s -= rest
      return 0.0, -rest
    start = self.clock()
    self.sleep(rest)
    slept = self.clock() - start
    self.slept_s += slept
    return slept, 0.0


def calibrated_costs(local: Mapping[Action, float], everyone: list[Mapping[str, float]],
                     margin: float) -> dict[Action, float]:
  """One nominal cost per action for every worker: the largest median any worker measured for
  it (the workers of a stage run it together, so they share its cost), times ``margin``.

  Args:
    local: this worker's medians (only to name the actions it needs).
    everyone: every worker's medians, keyed ``'stage/kind'`` (as they travel as JSON).
    margin: how much slower than the slowest measurement the host is (> 1 leaves room for
      noise; an action past its host's time is an overrun).
  """
  out = {}
  for stage, kind in local:
    seen = [m[f'{stage}/{kind}'] for m in everyone if f'{stage}/{kind}' in m]
    out[stage, kind] = margin * max(seen)
  return out
