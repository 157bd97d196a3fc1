"""Steady-state throughput: the one definition the report, a run's ``summary.json`` and its
progress lines share.

A run's first step compiles its program, and a step that meets a new share size waits for
another compile, or runs beside one compiling in the background (as pieces, on cores the
compile shares: on hosts of known speed such a step overruns its host's time by seconds);
averaged in, a few such steps can make a run look ten times slower than it trains. Steady
throughput is the examples of the other steps over their time.

A step's time is the one its workers measured: with telemetry (modes shares and tokens), the slowest
worker's own ``step_s``, from the start of its step to the end of the combine
(`hetjax.report.telemetry_throughput`); the report, ``summary.json`` and, as the run goes, its
progress lines (`LiveThroughput`) read it. Only a run without telemetry (an SPMD program, a
pipeline, SchMP) times its steps by the chief's clock between two steps
(`hetjax.train.MetricsLogger.steady`). Why not that clock everywhere: it also holds what runs
between the steps (a checkpoint's save, an evaluation, publishing telemetry, the stall
watchdog's report, the policy's decision, and on one machine emulating a cluster, the other
processes' share of its cores), so the two clocks can give one run two throughputs far apart.
The steps' speed is what policies are compared on; where the rest of the wall time went is
goodput's split (`hetjax.report.goodput`). The clock gives the time a run has left (the
progress lines' ``eta``), a wall-clock time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

_LISTED = 6  # runs of compiling steps named in a description; more end in '…'


@dataclasses.dataclass(frozen=True)
class Throughput:
  """Samples per second over the steady steps, and which steps were left out.

  Attributes:
    samples_per_s: total examples over total seconds of the counted steps (inf if they took
      no time); None when no step is left to count.
    steps: the counted steps.
    warmup: the leading steps left out (the first compiles the program).
    compiling: later steps left out because they waited for a compile or ran beside one.
  """

  samples_per_s: float | None
  steps: tuple[int, ...]
  warmup: tuple[int, ...]
  compiling: tuple[int, ...]

  def describe(self) -> str:
    """Which steps the figure covers, e.g. ``'steps 2-20, 16 counted: 1 warm-up step and 3
    compiling steps (4, 7-8) excluded'``."""
    after = sorted(self.steps + self.compiling)
    head = f'steps {after[0]}-{after[-1]}' if after else 'no steps after the warm-up'
    left = []
    if self.warmup:
      left.append(_count(len(self.warmup), 'warm-up step'))
    if self.compiling:
      left.append(f'{_count(len(self.compiling), "compiling step")} ({_ranges(self.compiling)})')
    return f'{head}, {len(self.steps)} counted' + (f': {" and ".join(left)} excluded'
                                                   if left else '')

  def to_json(self) -> dict[str, Any]:
    """The fields a run's ``summary.json`` carries: the figure (1 decimal) and `describe`."""
    rate = self.samples_per_s
    return {'steady_samples_per_s': None if rate is None or math.isinf(rate) else round(rate, 1),
            'steady_steps': self.describe()}


def steady_throughput(
    steps: Sequence[int],
    samples: Sequence[float],
    seconds: Sequence[float],
    compiling: Sequence[float | bool],
    warmup: int = 1,
) -> Throughput:
  """Throughput without the first ``warmup`` steps and without any later step that compiled.

  Each sequence has one entry per step, in run order: the step's number, its examples, its
  wall time, and whether a compile held it up: the seconds it waited for compiles, or True
  when one ran beside it (any positive value, or True, leaves it out). An entry may also
  stand for an interval of steps (its last step's number), as `hetjax.train.MetricsLogger`
  measures them without syncing every step.

  Example::

    steady_throughput([1, 2, 3, 4], [128] * 4, [10.0, 1.0, 3.0, 1.0], [9.0, 0.0, 2.0, 0.0])
    # Throughput(samples_per_s=128.0, steps=(2, 4), warmup=(1,), compiling=(3,))
  """
  if not len(steps) == len(samples) == len(seconds) == len(compiling):
    raise ValueError('steps, samples, seconds and compiling need one entry per step')
  count = SteadyCount(warmup)
  for step, n, s, c in zip(steps, samples, seconds, compiling, strict=True):
    count.add(step, n, s, c)
  return count.throughput()


class SteadyCount:
  """`steady_throughput`, one step at a time: for a figure that grows with the run (the
  progress lines', `hetjax.report.LiveThroughput`), which must not go over every step again at
  each line. Steps are added in run order; the first ``warmup`` are the warm-up.

  Example::

    count = SteadyCount()
    for step, rows, seconds, compile_s in [(1, 128, 10.0, 9.0), (2, 128, 1.0, 0.0)]:
      count.add(step, rows, seconds, compile_s)
    count.throughput().samples_per_s   # 128.0: step 1 is the warm-up
  """

  def __init__(self, warmup: int = 1):
    if warmup < 0:
      raise ValueError(f'warmup must be >= 0, got {warmup}')
    self.warmup = warmup
    self._warmup: list[int] = []
    self._counted: list[int] = []
    self._held_up: list[int] = []
    self._examples = self._seconds = 0.0

  def add(self, step: int, samples: float, seconds: float, compiling: float | bool) -> None:
    """One step (or interval): its number, examples, wall time, and whether a compile held it
    up (seconds waited, or True; any positive value leaves it out)."""
    if len(self._warmup) < self.warmup:
      self._warmup.append(int(step))
    elif compiling > 0:
      self._held_up.append(int(step))
    else:
      self._counted.append(int(step))
      self._examples += float(samples)
      self._seconds += float(seconds)

  def throughput(self) -> Throughput:
    """The steps added so far as a `Throughput`."""
    rate = (None if not self._counted
            else self._examples / self._seconds if self._seconds > 0 else math.inf)
    return Throughput(rate, tuple(self._counted), tuple(self._warmup), tuple(self._held_up))

def _count(n: int, noun: str) -> str:
  return f'{n} {noun}' + ('' if n == 1 else 's')


def _ranges(steps: Sequence[int]) -> str:
  """``(3, 4, 5, 9)`` → ``'3-5, 9'``; after `_LISTED` runs, ``'…'``."""
  runs: list[list[int]] = []
  for step in sorted(steps):
    if runs and step == runs[-1][1] + 1:
      runs[-1][1] = step
    else:
      runs.append([step, step])
  text = [f'{a}' if a == b else f'{a}-{b}' for a, b in runs]
  return ', '.join(text[:_LISTED] + (['…'] if len(text) > _LISTED else []))
