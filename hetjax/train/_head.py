"""`StepHead`: the named per-worker slots that ride in front of a step's fused gradient.

Each worker writes its own slot of every field and the all-reduce sums them, so after one
collective every worker holds every worker's values: the inputs of a policy decision that comes
out identical everywhere, with no other message. Layout (float32, ``n`` workers)::

  [loss | busy_s × n | load × n | sampled × n | rows × n | compile_s × n | ready × n]

``compile_s`` is the seconds a worker spent compiling its programs during the step (waited for,
or on its background thread): what lets every worker see that a compile ran somewhere in the
job, and what a move of the shares cost. ``ready`` is 1 where the worker can run the share a
policy prepared (`hetjax.core.Shares.upcoming`) without waiting for a compile, or none was
prepared: a costly move waits for every worker's (`hetjax.balance.LBBSP`).

Example::

  >>> head = StepHead(workers=2)
  >>> head.size, head.slots(1)
  (13, (2, 4, 6, 8, 10, 12))
"""

from __future__ import annotations

import dataclasses

import numpy as np

FIELDS = ('busy_s', 'load', 'sampled', 'rows', 'compile_s', 'ready')


@dataclasses.dataclass(frozen=True)
class StepHead:
  """Where each worker's values sit in the head of the fused buffer."""

  workers: int

  @property
  def size(self) -> int:
    return 1 + len(FIELDS) * self.workers

  def slots(self, worker: int) -> tuple[int, ...]:
    """Worker ``worker``'s index in each field, in `FIELDS` order."""
    return tuple(1 + k * self.workers + worker for k in range(len(FIELDS)))

  def read(self, head: np.ndarray) -> dict[str, np.ndarray]:
    """``{'loss': scalar, field: per-worker array}`` from a summed head."""
    n = self.workers
    out = {'loss': head[0]}
    for k, name in enumerate(FIELDS):
      out[name] = head[1 + k * n:1 + (k + 1) * n]
    return out
