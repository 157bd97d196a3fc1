"""Placing host batches on a mesh: the leading axis of every array is the logical ``'batch'``.

On a mesh of one process's devices a batch is one `jax.device_put`. On a mesh over several
processes' devices (one jitted step over every worker, `make_mesh`) each process holds only some
rows of the global batch: every process has the same host global batch (it is a function of the
seed and the step only), takes the rows its own devices hold (`process_rows`) and assembles the
global array with `jax.make_array_from_process_local_data`. `jax.device_put` would accept the
whole host batch too, but first checks across processes that every one passed the same value:
an all-gather of the batch every step.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding

from hetjax.sharding._rules import LogicalRules


@functools.lru_cache(maxsize=256)
def batch_sharding(mesh: Mesh, rules: LogicalRules, ndim: int) -> NamedSharding:
  """Sharding of a rank-``ndim`` batch array: dimension 0 is ``'batch'``, the rest replicated."""
  return NamedSharding(mesh, rules.spec(('batch',) + (None,) * (ndim - 1)))


@functools.lru_cache(maxsize=256)
def process_rows(sharding: Sharding, shape: tuple[int, ...]) -> tuple[slice, ...]:
  """The row ranges of a ``shape`` array under ``sharding`` that this process's devices hold,
  in order, without repeats, adjacent ones merged: what `jax.make_array_from_process_local_data`
  takes, stacked.

  Example: a batch of 16 rows on ``make_mesh((4, 2))`` over two processes of four devices,
  split over ``'data'``: process 0 holds ``(slice(0, 8),)``, process 1 ``(slice(8, 16),)``; a
  batch split over ``'model'`` only (which stays inside a process) is held whole by both.
  """
  held = sharding.addressable_devices_indices_map(shape).values()
  merged: list[list[int]] = []
  for lo, hi in sorted({index[0].indices(shape[0])[:2] for index in held}):
    if merged and merged[-1][1] == lo:  # adjacent devices' rows: one range
      merged[-1][1] = hi
    else:
      merged.append([lo, hi])
  return tuple(slice(lo, hi) for lo, hi in merged)


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh, rules: LogicalRules) -> dict[str, jax.Array]:
  """Places a host global batch on ``mesh``, split along the batch axis.

  One transfer call when this process holds the whole mesh; otherwise each array is assembled
  from the rows this process's devices hold (module docstring), the same host batch in every
  process.
  """
  shardings = {k: batch_sharding(mesh, rules, np.ndim(v)) for k, v in batch.items()}
  if mesh.is_multi_process:
    return {k: _from_process_rows(np.asarray(v), shardings[k]) for k, v in batch.items()}
  return jax.device_put(batch, shardings)


def _from_process_rows(rows: np.ndarray, sharding: Sharding) -> jax.Array:
  held = process_rows(sharding, rows.shape)
  local = rows[held[0]] if len(held) == 1 else np.concatenate([rows[s] for s in held])
  return jax.make_array_from_process_local_data(sharding, local, rows.shape)
