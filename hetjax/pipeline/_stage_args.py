"""Checking a pipeline's stage ranges and schedule (`PipelineTrainer`'s arguments)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.pipeline._schedule import Schedule, gpipe, one_f_one_b
from hetjax.pipeline._split import split_stages

SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {'gpipe': gpipe, '1f1b': one_f_one_b}

def stage_ranges(stages: int | Sequence[tuple[int, int]], links: int) -> tuple[tuple[int, int], ...]:
  """Contiguous non-empty link ranges covering ``0 … links − 1``, or a `ConfigError`."""
  if isinstance(stages, (int, np.integer)) and not isinstance(stages, bool):
    return split_stages([1.0] * links, int(stages))
  ranges = tuple(tuple(r) for r in stages)
  edges = [0]
  for r in ranges:
    if len(r) != 2 or r[0] != edges[-1] or r[1] <= r[0]:
      raise ConfigError(f'stage ranges {ranges} are not contiguous non-empty (start, stop) pairs '
                        f'from 0 to {links}')
    edges.append(r[1])
  if not ranges or edges[-1] != links:
    raise ConfigError(f'stage ranges {ranges} do not cover the {links} links of the chain')
  return ranges


def checked_schedule(schedule: str | Schedule, stages: int, micro: int) -> Schedule:
  """The schedule for ``stages`` and ``micro`` micro-batches, by name or checked as given."""
  if isinstance(schedule, str):
    if schedule not in SCHEDULES:
      raise ConfigError(f'unknown schedule {schedule!r}; choose one of: {", ".join(SCHEDULES)}')
    return SCHEDULES[schedule](stages, micro)
  if (schedule.stages, schedule.micro_batches) != (stages, micro):
    raise ConfigError(f'schedule {schedule.name!r} is for {schedule.stages} stages and '
                      f'{schedule.micro_batches} micro-batches, not {stages} and {micro}')
  schedule.validate()
  return schedule
