"""Placing host batches on a mesh: the leading axis of every array is the logical ``'batch'``."""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from hetjax.sharding._rules import LogicalRules


@functools.lru_cache(maxsize=256)
def batch_sharding(mesh: Mesh, rules: LogicalRules, ndim: int) -> NamedSharding:
  """Sharding of a rank-``ndim`` batch array: dimension 0 is ``'batch'``, the rest replicated."""
  return NamedSharding(mesh, rules.spec(('batch',) + (None,) * (ndim - 1)))


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh, rules: LogicalRules) -> dict[str, jax.Array]:
  """Places a host batch on ``mesh``, split along the batch axis, in one transfer call."""
  return jax.device_put(batch, {k: batch_sharding(mesh, rules, np.ndim(v)) for k, v in batch.items()})
