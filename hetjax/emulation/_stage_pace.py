"""Hosts of known speed for pipeline stages: each action a worker takes part in, padded by sleep.

A `KnownSpeedHost` pads a share step to rows × a calibrated cost per row × the worker's
slowdown. A pipeline whose stages span workers (a grouped plan) has no one step per worker: a
worker runs the forward and backward of every stage it has devices in, once per micro-batch,
and each stage's update. So its host is defined per action: stage s's ``kind`` (``'forward'``,
``'backward'``, ``'update'``) takes ``nominal_s[s, kind]`` on an undisturbed host — its
compiled program's work at measured rates (`hetjax.pipeline.roofline_costs`) — and
``(factor + delay) × nominal`` on this worker's host at that step (its `SlowdownTrace` row).
The worker runs the action for real (the pipeline waits for each action when a stage spans
processes) and sleeps the rest (`pad_action`, what `hetjax.core.Pace` asks after an action);
the collectives of the next action make the other members of its groups wait for it, as they
would for a slower host. An action that ran longer than its target is not padded and counts as
past its time (``overruns``): on a fast worker this is mostly waiting for a slow peer inside
the action's collective.

Example::

  pace = StagePace(parse_trace('static:1,3', 2), worker=1, nominal_s={(0, 'forward'): 0.01})
  pace.pad_action(step=0, stage=0, kind='forward', measured_s=0.004)   # sleeps 26 ms
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping

from hetjax._errors import ConfigError
from hetjax._links import Collective
from hetjax.emulation._traces import SlowdownTrace

Action = tuple[int, str]  # (stage, kind)


@dataclasses.dataclass
class StagePace:
  """This worker's host for its stage actions (module docstring): a `hetjax.core.Pace` that
  pads actions, not steps of rows, and leaves transfers as they are.

  Attributes:
    trace: every worker's slowdowns; this host reads row ``worker``.
    worker: this worker.
    nominal_s: an undisturbed host's seconds per action of the stages this worker is in.
    sleep, clock: injectable for tests.
    slept_s, overruns, overrun_s: what the padding did so far.
  """

  trace: SlowdownTrace
  worker: int
  nominal_s: Mapping[Action, float]
  sleep: Callable[[float], None] = time.sleep
  clock: Callable[[], float] = time.perf_counter
  slept_s: float = 0.0
  overruns: int = 0
  overrun_s: float = 0.0

  def factor(self, step: int) -> float:
    """This host's slowdown at ``step``."""
    return self.trace.factor(self.worker, step)

  def load(self, step: int) -> float:
    """The host-load input of ``step``: its slowdown (`hetjax.core.Pace.load`)."""
    return self.factor(step)

  def target_s(self, step: int, stage: int, kind: str) -> float:
    """Seconds the action takes on this host at ``step``: (factor + delay) × nominal."""
    try:
      nominal = self.nominal_s[stage, kind]
    except KeyError:
      raise ConfigError(f'no calibrated cost for stage {stage} {kind} on worker '
                        f'{self.worker}') from None
    return (self.trace.factor(self.worker, step) + self.trace.delay(self.worker, step)) * nominal

  def pad_action(self, step: int, stage: int, kind: str, measured_s: float
                 ) -> tuple[float, float]:
    """Sleeps the rest of the action's target after ``measured_s``; (slept, overrun) seconds."""
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

  def pad(self, step: int, rows: int, measured_s: float) -> tuple[float, float]:
    """Refused in one line: roofline costs per action price no step of rows."""
    raise ConfigError(f"a plan's stage host (worker {self.worker}) paces stage actions, not "
                      f'steps of {rows} rows: give a share, token, round or replica step a '
                      'hetjax.emulation.KnownSpeedHost')

  def exchange(self, nbytes: int, collective: Collective = Collective.GRADIENT
               ) -> contextlib.AbstractContextManager[None]:
    """No links: the moves between stages take the machine's time."""
    return contextlib.nullcontext()
