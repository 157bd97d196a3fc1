"""`Cyclic`: sequential coordinate descent, one coordinate a round in order 0, 1, …, d − 1, 0 …
— the baseline that every parallel schedule is measured against (it cannot diverge, and it is
what scikit-learn's ``Lasso`` does with ``selection='cyclic'``).

The schedule may have more slots than one (a program shared with the parallel schedulers); the
others are masked, so a round still updates one coordinate. The state is the round number.

Example::

  >>> policy = Cyclic(blocks=3, size=2)
  >>> schedule, state = policy.update({'round': 4}, None)
  >>> schedule.picked.tolist(), schedule.mask.tolist()
  ([1], [True, False])
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hetjax._errors import ConfigError
from hetjax.core import StepStats
from hetjax.schmp._schedule import Schedule


@dataclasses.dataclass(frozen=True)
class Cyclic:
  """Round t updates coordinate t mod ``blocks`` (module docstring)."""

  blocks: int
  size: int = 1
  name: str = 'cyclic'

  def __post_init__(self):
    if self.blocks < 1 or self.size < 1:
      raise ConfigError(f'cyclic needs blocks and size >= 1, got {self.blocks} and {self.size}')

  def init(self) -> dict[str, Any]:
    return {'round': 0}

  def update(self, state: dict[str, Any], stats: StepStats | None
             ) -> tuple[Schedule, dict[str, Any]]:
    following = state['round'] if stats is None else int(stats.step) + 1
    return Schedule.of([following % self.blocks], self.size), {'round': following}
