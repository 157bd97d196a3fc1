"""`Shotgun`: P coordinates drawn uniformly each round, all updated from the same β, with no
dependency check (Bradley, Kyrola, Bickson & Guestrin, ICML 2011) — SchMP's parallel baseline.

Shotgun's analysis: with columns normalised, P coordinates at once speed coordinate descent up
almost P-fold while P < P* ≈ d / ρ(XᵀX) (ρ the spectral radius); beyond it correlated
coordinates overshoot together and the objective can grow without bound. The state is the
round number; the draw of round t is seeded by ``(seed, t)``, so a resumed run repeats it.

Example::

  >>> policy = Shotgun(blocks=100, size=8)
  >>> schedule, state = policy.update(policy.init(), None)
  >>> schedule.picked.size, len(set(schedule.picked.tolist()))
  (8, 8)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hetjax._errors import ConfigError
from hetjax.core import StepStats
from hetjax.schmp._schedule import Schedule


@dataclasses.dataclass(frozen=True)
class Shotgun:
  """``min(size, blocks)`` distinct coordinates drawn uniformly per round (module docstring)."""

  blocks: int
  size: int
  seed: int = 0
  name: str = 'shotgun'

  def __post_init__(self):
    if self.blocks < 1 or self.size < 1:
      raise ConfigError(f'shotgun needs blocks and size >= 1, got {self.blocks} and '
                        f'{self.size}')

  def init(self) -> dict[str, Any]:
    return {'round': 0}

  def update(self, state: dict[str, Any], stats: StepStats | None
             ) -> tuple[Schedule, dict[str, Any]]:
    following = state['round'] if stats is None else int(stats.step) + 1
    rng = np.random.default_rng([self.seed, following])
    picked = rng.choice(self.blocks, min(self.size, self.blocks), replace=False)
    return Schedule.of(picked, self.size), {'round': following}
