"""What a scheduler decides for a round, and what a round tells the scheduler back.

A scheduler (`Scheduler`, a `hetjax.core.Policy` of `Schedule`s) decides each round. A round
updates a *set of parameter blocks* (Lasso: coordinates; matrix factorisation: column
factor blocks; LDA: vocabulary shards). Its size is fixed (`Schedule.size`), so every round runs
the one compiled program; when a scheduler picks fewer blocks, the rest of the slots are masked
off. Both records are plain values: a `Schedule` is the loop's decision for a step, a
`RoundInfo` the step's `StepStats.local`.

Example::

  >>> s = Schedule.of([7, 3], size=4)
  >>> s.blocks.tolist(), s.mask.tolist()
  ([7, 3, 0, 0], [True, True, False, False])
  >>> s.picked.tolist()
  [7, 3]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.core import Policy


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """The blocks one round updates.

  Attributes:
    blocks: int32[size], the block of each slot (masked slots hold 0).
    mask: bool[size], which slots are picked.
    offset: for static rotations, the round's shift (worker p works on block (p + offset) mod
      P); 0 otherwise.
  """

  blocks: np.ndarray
  mask: np.ndarray
  offset: int = 0

  @classmethod
  def of(cls, picked: Sequence[int], size: int, offset: int = 0) -> Schedule:
    """``picked`` blocks (at most ``size``) padded to ``size`` slots."""
    picked = np.asarray(picked, np.int32).reshape(-1)
    if size < 1:
      raise ConfigError(f'a schedule needs at least one slot, got size {size}')
    if picked.size > size:
      raise ConfigError(f'{picked.size} blocks picked for a schedule of {size} slots')
    blocks = np.zeros(size, np.int32)
    blocks[:picked.size] = picked
    mask = np.zeros(size, bool)
    mask[:picked.size] = True
    return cls(blocks, mask, int(offset))

  @property
  def size(self) -> int:
    return int(self.blocks.size)

  @property
  def picked(self) -> np.ndarray:
    return self.blocks[self.mask]


@dataclasses.dataclass(frozen=True, eq=False)
class RoundInfo:
  """What a finished round reports to its scheduler (`StepStats.local` of a SchMP step).

  With staleness k the record is round t − k's while round t runs: the scheduler of round t + 1
  then works from information k rounds old, and scheduling overlaps the device's work.

  Attributes:
    round: the round this record describes (0-based).
    schedule: what that round updated.
    delta: float[size], per slot, how much its block changed (Lasso: Δβⱼ; 0 where masked).
    priority: float[blocks], per block, how far it would move if updated after this round, for
      apps that compute it (the coordinate apps with ``priority='current'``), else None.
  """

  round: int
  schedule: Schedule
  delta: np.ndarray
  priority: np.ndarray | None = None


#: A SchMP scheduler: the loop's policy deciding each round's `Schedule` from its state and the
#: `RoundInfo` in ``stats.local`` (the last round reported: its picks and how far each moved,
#: and the current priorities where the app computes them). `DynamicScheduler`, `Shotgun`,
#: `Cyclic` and `StaticRotation` are ones; an app names its own (`App.policy`).
Scheduler = Policy[Schedule]
