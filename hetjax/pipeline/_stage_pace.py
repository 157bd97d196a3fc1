"""Hosts of known speed for pipeline stages: each action a worker takes part in, padded by sleep.

A `hetjax.emulation.KnownSpeedHost` pads a share step to rows × a calibrated cost per row × the
worker's slowdown. A pipeline whose stages span workers (a grouped plan) has no one step per
worker: a worker runs the forward and backward of every stage it has devices in, once per
micro-batch, and each stage's update. So its host is defined per action: stage s's ``kind``
(``'forward'``, ``'backward'``, ``'update'``) takes ``nominal_s[s, kind]`` on an undisturbed
host — its compiled program's work at measured rates (`roofline_costs`) — and
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

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from hetjax._errors import ConfigError

Action = tuple[int, str]  # (stage, kind)


class ActionPace(Protocol):
  """What `PipelineTrainer` calls after each of this worker's actions (`PipelineTrainer.pace`)."""

  def pad(self, step: int, stage: int, kind: str, measured_s: float) -> tuple[float, float]:
    """Sleeps as the host says after an action of ``measured_s``; (slept, overrun) seconds."""
    ...


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


def roofline_costs(programs: Mapping[str, object], flops_per_s: float, bytes_per_s: float,
                   margin: float) -> dict[Action, float]:
  """Nominal costs from each compiled stage program's own work: ``margin × max(FLOPs /
  flops_per_s, bytes accessed / bytes_per_s)`` per device (XLA's ``cost_analysis()`` of the
  partitioned program is per device), with rates measured while every device of the job was
  busy (`hetjax.planner.measure_cluster`).

  Why not time the actions: on a machine whose cores every worker shares, an action runs
  faster while other workers idle. A plan that leaves some workers idle would
  calibrate cheaper hosts than one that keeps all busy, and the comparison between plans would
  measure the machine's sharing, not the plans. Priced from their work at one set of rates,
  every plan's hosts are equally fast. The price is circularity: the planner's cost model uses
  the same FLOPs, bytes and rates, so the padded compute agrees with its predictions by
  construction; what stays measured is everything else (collectives, moves between groups,
  dispatch) and any action that runs past its time.

  Args:
    programs: ``{'s<stage>/<kind>': jax.stages.Compiled}`` (`hetjax.planner.CompiledPlan`).
    flops_per_s, bytes_per_s: one device's rates.
    margin: > 1 leaves room for what the roofline does not see (dispatch, small kernels).
  """
  out = {}
  for key, compiled in programs.items():
    stage, kind = key.split('/')
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    work = max(analysis.get('flops', 0.0) / flops_per_s,
               analysis.get('bytes accessed', 0.0) / bytes_per_s)
    out[int(stage.removeprefix('s')), kind] = margin * work
  return out
