"""Pipeline schedules as data: which passes each stage runs, in which order, and how long it takes.

A `Schedule` lists per stage the `Action`s that stage runs in order, an action being the forward
or the backward pass of one micro-batch through that stage. `gpipe` and `one_f_one_b` build the
two classic synchronous schedules (both flush at the end of the step, so both compute the same
gradients as one large batch), `Schedule.validate` checks that a schedule runs every pass once
without deadlock, and `time_schedule` times it with fixed per-pass costs: its makespan, its bubble and
how many micro-batches' activations each stage holds at most.

Dependencies (transfers take no time): forward(s, m) needs forward(s − 1, m); backward(s, m)
needs forward(s, m) and backward(s + 1, m); the last stage's backward needs only its forward.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

from hetjax._checks import integer, positive_int, positive_number
from hetjax._errors import ConfigError

FORWARD = 'forward'
BACKWARD = 'backward'
KINDS = (FORWARD, BACKWARD)


@dataclasses.dataclass(frozen=True)
class Action:
  """One pass of one micro-batch through one stage.

  Attributes:
    kind: 'forward' or 'backward'.
    stage: the stage that runs it, 0 … stages − 1 (stage 0 holds the first sub-models).
    micro: the micro-batch, 0 … micro_batches − 1.
  """

  kind: str
  stage: int
  micro: int

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ConfigError(f'action kind must be one of {", ".join(KINDS)}, got {self.kind!r}')
    for what in ('stage', 'micro'):
      integer(getattr(self, what), f'action {what}')

  def __str__(self) -> str:
    return f'{self.kind}(stage {self.stage}, micro {self.micro})'

  def needs(self, stages: int) -> tuple[Action, ...]:
    """The actions that must finish before this one starts, in a pipeline of ``stages``.

    Example::

      >>> Action('backward', 1, 0).needs(3)
      (Action(kind='forward', stage=1, micro=0), Action(kind='backward', stage=2, micro=0))
    """
    if self.kind == FORWARD:
      return () if self.stage == 0 else (Action(FORWARD, self.stage - 1, self.micro),)
    own = Action(FORWARD, self.stage, self.micro)
    if self.stage == stages - 1:
      return (own,)
    return (own, Action(BACKWARD, self.stage + 1, self.micro))


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The ordered actions each stage of a pipeline runs for one training step.

  Attributes:
    name: what built it, e.g. 'gpipe' or '1f1b' (only used in messages).
    stages: number of pipeline stages.
    micro_batches: number of micro-batches the step's batch is cut into.
    per_stage: per stage s, the actions stage s runs, in order; each must have ``stage == s``.
  """

  name: str
  stages: int
  micro_batches: int
  per_stage: tuple[tuple[Action, ...], ...]

  def validate(self) -> None:
    """Raises `ConfigError` unless every stage runs the forward and the backward of every
    micro-batch exactly once, in its own list, in an order that cannot deadlock."""
    stages = positive_int(self.stages, 'stages')
    micro = positive_int(self.micro_batches, 'micro_batches')
    where = f'schedule {self.name!r}'
    if len(self.per_stage) != stages:
      raise ConfigError(f'{where} has {len(self.per_stage)} action lists for {stages} stages')
    seen: set[Action] = set()
    for s, actions in enumerate(self.per_stage):
      for action in actions:
        if action.stage != s:
          raise ConfigError(f'{where} lists {action} under stage {s}')
        if action.micro >= micro:
          raise ConfigError(f'{where} runs {action}, but micro-batches are 0 … {micro - 1}')
        if action in seen:
          raise ConfigError(f'{where} runs {action} twice')
        seen.add(action)
    for s in range(stages):
      for kind in KINDS:
        for m in range(micro):
          if Action(kind, s, m) not in seen:
            raise ConfigError(f'{where} never runs {Action(kind, s, m)}')
    ones = (1.0,) * stages
    finish_times(self, ones, ones)  # raises if the order deadlocks


def gpipe(stages: int, micro_batches: int) -> Schedule:
  """GPipe: every stage runs all its forwards, then all its backwards.

  Backwards run in micro-batch order 0 … M − 1, as in 1F1B's cool-down (with equal costs per
  stage, reverse order gives the same makespan). Each stage holds the activations of all M
  micro-batches at its peak.

  Example::

    >>> [str(a) for a in gpipe(2, 2).per_stage[1]]
    ['forward(stage 1, micro 0)', 'forward(stage 1, micro 1)',
     'backward(stage 1, micro 0)', 'backward(stage 1, micro 1)']
  """
  stages = positive_int(stages, 'stages')
  micro = positive_int(micro_batches, 'micro_batches')
  per_stage = tuple(
      tuple(Action(FORWARD, s, m) for m in range(micro))
      + tuple(Action(BACKWARD, s, m) for m in range(micro))
      for s in range(stages))
  return Schedule('gpipe', stages, micro, per_stage)


def one_f_one_b(stages: int, micro_batches: int) -> Schedule:
  """1F1B (PipeDream-Flush, Megatron-LM's non-interleaved schedule).

  Stage s runs w = min(S − s − 1, M) warm-up forwards, then alternates the forward of
  micro-batch w + i with the backward of micro-batch i, then runs the remaining backwards. With
  equal costs per stage it takes as long as GPipe, but stage s holds at most min(S − s, M)
  micro-batches' activations instead of M.

  Example::

    >>> [str(a) for a in one_f_one_b(2, 3).per_stage[0]]
    ['forward(stage 0, micro 0)', 'forward(stage 0, micro 1)', 'backward(stage 0, micro 0)',
     'forward(stage 0, micro 2)', 'backward(stage 0, micro 1)', 'backward(stage 0, micro 2)']
  """
  stages = positive_int(stages, 'stages')
  micro = positive_int(micro_batches, 'micro_batches')
  per_stage = []
  for s in range(stages):
    warmup = min(stages - s - 1, micro)
    actions = [Action(FORWARD, s, m) for m in range(warmup)]
    for i in range(micro - warmup):
      actions += [Action(FORWARD, s, warmup + i), Action(BACKWARD, s, i)]
    actions += [Action(BACKWARD, s, m) for m in range(micro - warmup, micro)]
    per_stage.append(tuple(actions))
  return Schedule('1f1b', stages, micro, tuple(per_stage))


@dataclasses.dataclass(frozen=True)
class SimResult:
  """How a schedule runs with fixed per-pass costs.

  Attributes:
    makespan_s: seconds from the first forward's start to the last backward's end.
    bubble_fraction: 1 − busy / (stages · makespan): the share of stage-time spent idle.
    peak_in_flight: per stage, the most micro-batches whose forward has run there but whose
      backward has not (the activations the stage must keep).
  """

  makespan_s: float
  bubble_fraction: float
  peak_in_flight: tuple[int, ...]


def time_schedule(schedule: Schedule, forward_s: float | Sequence[float] = 1.0,
             backward_s: float | Sequence[float] = 2.0) -> SimResult:
  """Times ``schedule``: each stage runs its list in order, an action starting as soon as its
  stage is free and the actions it needs are done (transfers take no time).

  Args:
    schedule: a schedule; it is validated first (`ConfigError` if it is invalid or deadlocks).
    forward_s: seconds of one micro-batch's forward on a stage: one value for all stages, or one
      per stage.
    backward_s: the same for the backward.

  Example::

    >>> time_schedule(gpipe(4, 8), 1.0, 2.0)
    SimResult(makespan_s=33.0, bubble_fraction=0.2727..., peak_in_flight=(8, 8, 8, 8))
  """
  schedule.validate()
  forward = _per_stage(forward_s, schedule.stages, 'forward_s')
  backward = _per_stage(backward_s, schedule.stages, 'backward_s')
  finish = finish_times(schedule, forward, backward)
  makespan = max(finish.values())
  busy = schedule.micro_batches * (math.fsum(forward) + math.fsum(backward))
  bubble = 1.0 - busy / (schedule.stages * makespan)
  return SimResult(makespan, bubble, tuple(_peak_in_flight(a) for a in schedule.per_stage))


def _per_stage(value: float | Sequence[float], stages: int, what: str) -> tuple[float, ...]:
  """One positive finite cost per stage from a scalar or a per-stage sequence."""
  values = [value] * stages if isinstance(value, numbers.Real) else list(value)
  if len(values) != stages:
    raise ConfigError(f'{what} has {len(values)} values for {stages} stages')
  return tuple(positive_number(v, f'{what} of stage {s}') for s, v in enumerate(values))


def finish_times(schedule: Schedule, forward: Sequence[float],
                  backward: Sequence[float]) -> dict[Action, float]:
  """The finish time of every action, or a `ConfigError` if the order deadlocks.

  Every action starts at the latest of its stage's previous finish and its dependencies'
  finishes, so the result does not depend on the order in which stages are advanced here.
  """
  stages = schedule.stages
  finish: dict[Action, float] = {}
  free = [0.0] * stages
  pos = [0] * stages
  progressed = True
  while progressed:
    progressed = False
    for s, actions in enumerate(schedule.per_stage):
      while pos[s] < len(actions):
        action = actions[pos[s]]
        needs = action.needs(stages)
        if any(d not in finish for d in needs):
          break
        start = max([free[s], *(finish[d] for d in needs)])
        cost = forward[s] if action.kind == FORWARD else backward[s]
        finish[action] = free[s] = start + cost
        pos[s] += 1
        progressed = True
  stuck = [(s, actions[pos[s]]) for s, actions in enumerate(schedule.per_stage)
           if pos[s] < len(actions)]
  if stuck:
    waits = '; '.join(
        f'stage {s} waits at {a} for '
        + ', '.join(str(d) for d in a.needs(stages) if d not in finish)
        for s, a in stuck)
    raise ConfigError(f'schedule {schedule.name!r} deadlocks: {waits}')
  return finish


def _peak_in_flight(actions: Sequence[Action]) -> int:
  """The most micro-batches forwarded but not yet backwarded at one point of a stage's list."""
  held = peak = 0
  for action in actions:
    held += 1 if action.kind == FORWARD else -1
    peak = max(peak, held)
  return peak
