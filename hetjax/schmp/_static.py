"""`StaticRotation`: a schedule fixed before running, as a policy value.

STRADS's static schedules (matrix factorisation, LDA) split a table into P blocks and give
worker p block (p + s) mod P in sub-round s, so no two workers touch the same block and every
block meets every worker once per P sub-rounds; the blocks then move one worker on
(`lax.ppermute`). The decision of round t is the rotation's offset, t mod P; every slot is
picked. The state is the round count, so a resumed run continues the rotation where it was.

Example::

  >>> policy = StaticRotation(blocks=4)
  >>> schedule, state = policy.update(policy.init(), None)
  >>> schedule.offset, schedule.picked.tolist()
  (0, [0, 1, 2, 3])
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hetjax._errors import ConfigError
from hetjax.core import StepStats
from hetjax.schmp._schedule import Schedule


@dataclasses.dataclass(frozen=True)
class StaticRotation:
  """Round t works on every block, rotated by t mod ``blocks`` (module docstring)."""

  blocks: int
  name: str = 'static'

  def __post_init__(self):
    if isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 1:
      raise ConfigError(f'a rotation needs at least one block, got {self.blocks!r}')

  def init(self) -> dict[str, Any]:
    return {'round': 0}

  def update(self, state: dict[str, Any], stats: StepStats | None
             ) -> tuple[Schedule, dict[str, Any]]:
    done = state['round'] if stats is None else int(stats.step) + 1
    schedule = Schedule.of(range(self.blocks), self.blocks, offset=done % self.blocks)
    return schedule, {'round': done}
