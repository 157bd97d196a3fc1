"""`FusedLayout`: where each gradient leaf travels in a step's all-reduce (tensor fusion).

Every gradient that is replicated inside a worker, and the step's head (`StepHead`: the loss
and each worker's timing slots), travel in one flat float32 buffer, so a step costs one
all-reduce instead of one per parameter; gradients split over a worker's devices (tensor
parallel) travel on their own. Layout of the buffer::

  [head | fused leaf 0 (raveled) | fused leaf 1 | …]      (fused leaves in tree-leaf order)

`bucket_bounds` cuts that buffer into buckets of at most a threshold of bytes, earliest leaves
first, for programs that reduce each bucket as its own collective (`hetjax.train.OverlapTrainer`).

Example::

  >>> bucket_bounds((9, 4, 100, 3), bucket_bytes=64)   # the head, then leaves of 4, 100, 3
  ((0, 13), (13, 113), (113, 116))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hetjax._errors import ConfigError

PyTree = Any


@dataclasses.dataclass(frozen=True)
class FusedLayout:
  """The fused buffer of a parameter tree's gradients.

  Attributes:
    treedef: the gradient tree's structure: the trainable parameters'
      (`hetjax.train._trainable.split_trainable`), ``None`` where a leaf is held fixed.
    shapes: every leaf's shape, in leaf order.
    fused: the leaves in the flat buffer (replicated inside a worker), in leaf order.
    separate: the leaves that travel on their own (split over a worker's devices).
    head: float32 slots in front of the fused leaves (`StepHead.size`).
    separate_bytes: bytes of the separate leaves.
  """

  treedef: Any
  shapes: tuple[tuple[int, ...], ...]
  fused: tuple[int, ...]
  separate: tuple[int, ...]
  head: int
  separate_bytes: int

  @classmethod
  def of(cls, abstract_params: PyTree, specs: PyTree, head: int,
         axis_sizes: Mapping[str, int] | None = None) -> FusedLayout:
    """The layout of ``abstract_params`` whose leaves are laid out by ``specs``.

    A leaf is fused when it is replicated inside a worker: its spec names no mesh axis, or only
    axes of size 1 in ``axis_sizes`` (every worker's largest size of each local mesh axis), as
    hybrid rules on a one-device worker do. Such a leaf would otherwise cost an all-reduce of
    its own each step, and each pays a collective's fixed cost: a small GPT's leaves reduced one
    by one cost a step many times what one all-reduce of the same bytes does.
    """
    leaves, treedef = jax.tree.flatten(abstract_params)
    flat_specs = treedef.flatten_up_to(specs)
    sizes = dict(axis_sizes or {})

    def replicated(entry) -> bool:
      names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
      return all(sizes.get(name, 0) == 1 for name in names)

    fused = tuple(i for i, spec in enumerate(flat_specs) if all(replicated(e) for e in spec))
    separate = tuple(i for i in range(len(leaves)) if i not in fused)
    return cls(treedef, tuple(tuple(leaf.shape) for leaf in leaves), fused, separate, head,
               sum(_numel(leaves[i].shape) * leaves[i].dtype.itemsize for i in separate))

  @property
  def size(self) -> int:
    """Float32 elements of the fused buffer (head included)."""
    return self.head + sum(_numel(self.shapes[i]) for i in self.fused)

  def pack(self, loss: jax.Array, grads: PyTree) -> tuple[jax.Array, list[jax.Array]]:
    """``(flat [loss, 0…, fused grads…], [separate grads…])``: what crosses workers."""
    leaves = self.treedef.flatten_up_to(grads)
    head = jnp.zeros((self.head,), jnp.float32).at[0].set(loss)
    fused = jnp.concatenate([head] + [leaves[i].ravel() for i in self.fused])
    return fused, [leaves[i] for i in self.separate]

  def unpack(self, fused: jax.Array, separate: Sequence[jax.Array]) -> tuple[jax.Array, PyTree]:
    """``(head, grads)`` from a fused buffer and the separate leaves (`pack`'s inverse)."""
    leaves: list[jax.Array | None] = [None] * len(self.shapes)
    offset = self.head
    for i in self.fused:
      size = _numel(self.shapes[i])
      leaves[i] = fused[offset:offset + size].reshape(self.shapes[i])
      offset += size
    for i, leaf in zip(self.separate, separate, strict=True):
      leaves[i] = leaf
    return fused[:self.head], self.treedef.unflatten(leaves)

  def buckets(self, bucket_bytes: int | None) -> tuple[tuple[int, int], ...]:
    """`bucket_bounds` of this buffer: the head and the fused leaves, in leaf order."""
    return bucket_bounds((self.head, *(_numel(self.shapes[i]) for i in self.fused)),
                         bucket_bytes)


def bucket_bounds(sizes: Sequence[int], bucket_bytes: int | None,
                  itemsize: int = 4) -> tuple[tuple[int, int], ...]:
  """Cuts a flat buffer of consecutive pieces of ``sizes`` elements into buckets.

  Pieces are never split: a bucket takes pieces in order while it stays within
  ``bucket_bytes``; a piece larger than the threshold is a bucket of its own. None: one
  bucket (the whole buffer).

  Returns:
    ``(start, stop)`` element offsets of each bucket, in order, covering the buffer.

  Raises:
    ConfigError: a threshold that is not a positive number of bytes.
  """
  total = sum(sizes)
  if bucket_bytes is None:
    return ((0, total),)
  if bucket_bytes <= 0:
    raise ConfigError(f'bucket_bytes {bucket_bytes} must be a positive number of bytes')
  bounds, start, offset = [], 0, 0
  for size in sizes:
    if offset > start and (offset + size - start) * itemsize > bucket_bytes:
      bounds.append((start, offset))
      start = offset
    offset += size
  if offset > start:
    bounds.append((start, offset))
  return tuple(bounds)


def _numel(shape: Sequence[int]) -> int:
  return int(np.prod(shape, dtype=np.int64))
