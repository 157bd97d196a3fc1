"""Which server holds which parameters: leaves dealt to K servers by size, largest first.

A parameter server shards the model by whole tensors (leaves of the parameter tree), as
classic parameter servers do: each leaf goes to the server holding the fewest bytes so far,
largest leaves first, so K servers carry nearly equal traffic. Every process derives the same
layout from the abstract parameters, so no message carries it.

Example::

  >>> layout = ServerLayout.of(params, servers=2)
  >>> shards = layout.split(grads)          # [leaves of server 0, leaves of server 1]
  >>> grads_again = layout.merge(shards)    # the same tree
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from hetjax._checks import positive_int
from hetjax._errors import ConfigError

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ServerLayout:
  """Leaf ``i`` of the flattened parameters lives on server ``owner[i]``.

  Attributes:
    owner: per leaf (in `jax.tree.flatten` order), its server.
    shapes: per leaf, its shape; ``dtypes``: its dtype name.
    servers: K.
  """

  owner: tuple[int, ...]
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[str, ...]
  servers: int
  treedef: Any = dataclasses.field(compare=False, repr=False)

  @classmethod
  def of(cls, params: PyTree, servers: int) -> ServerLayout:
    """Deals ``params``'s leaves (arrays or `jax.ShapeDtypeStruct`) over ``servers``."""
    leaves, treedef = jax.tree.flatten(params)
    positive_int(servers, 'servers')
    if servers > len(leaves):
      raise ConfigError(f'{servers} servers for a model of {len(leaves)} parameter tensors: '
                        f'give at most {len(leaves)} (a server holds whole tensors)')
    sizes = [int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves]
    load, owner = [0] * servers, [0] * len(leaves)
    for i in sorted(range(len(leaves)), key=lambda i: (-sizes[i], i)):
      owner[i] = min(range(servers), key=lambda s: (load[s], s))
      load[owner[i]] += sizes[i]
    return cls(tuple(owner), tuple(tuple(x.shape) for x in leaves),
               tuple(np.dtype(x.dtype).name for x in leaves), servers, treedef)

  def leaves_of(self, server: int) -> tuple[int, ...]:
    """The leaf indices server ``server`` holds, in flatten order."""
    return tuple(i for i, s in enumerate(self.owner) if s == server)

  def nbytes(self, server: int | None = None) -> int:
    """Bytes of the parameters on ``server`` (all servers: None)."""
    ids = range(len(self.owner)) if server is None else self.leaves_of(server)
    return sum(int(np.prod(self.shapes[i])) * np.dtype(self.dtypes[i]).itemsize for i in ids)

  def specs(self, server: int) -> list[tuple[tuple[int, ...], str]]:
    """``(shape, dtype)`` of each of ``server``'s leaves: what a push to it must carry."""
    return [(self.shapes[i], self.dtypes[i]) for i in self.leaves_of(server)]

  def split(self, tree: PyTree) -> list[list[Any]]:
    """``tree``'s leaves, one list per server."""
    leaves = self.treedef.flatten_up_to(tree)
    return [[leaves[i] for i in self.leaves_of(s)] for s in range(self.servers)]

  def merge(self, shards: Sequence[Sequence[Any]]) -> PyTree:
    """The tree from one list of leaves per server (the inverse of `split`)."""
    leaves: list[Any] = [None] * len(self.owner)
    for s, shard in enumerate(shards):
      for i, leaf in zip(self.leaves_of(s), shard, strict=True):
        leaves[i] = leaf
    return self.treedef.unflatten(leaves)
