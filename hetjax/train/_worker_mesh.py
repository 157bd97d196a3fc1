"""The meshes of a multi-worker job: each worker's local mesh, and all of them as rows of one."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.sharding import ShardingRules, make_mesh

PROC = 'proc'


def worker_meshes(local_shape: tuple[int, int]) -> tuple[Mesh, Mesh]:
  """This worker's local mesh ``('data', 'model')`` and the job's ``('proc', 'data', 'model')``.

  Row ``p`` of the global mesh is worker ``p``'s local mesh, device for device, so an array on
  the global mesh that is replicated over ``'proc'`` has, on each worker, exactly the shards of
  an array on that worker's local mesh.

  Raises:
    ConfigError: if workers have different device counts or ``local_shape`` does not match.
  """
  workers = jax.process_count()
  per_worker = [[d for d in jax.devices() if d.process_index == p] for p in range(workers)]
  counts = {len(devices) for devices in per_worker}
  if len(counts) != 1:
    raise ConfigError(f'workers have different device counts: {[len(d) for d in per_worker]}')
  local = make_mesh(local_shape, devices=jax.local_devices())
  grid = np.array(per_worker, dtype=object).reshape((workers, *local_shape))
  return local, Mesh(grid, (PROC, *local.axis_names), axis_types=(AxisType.Auto,) * 3)


def local_batch_degree(rules: ShardingRules, local_shape: tuple[int, int] | None = None) -> int:
  """How many ways a worker's rows are split over its local mesh: every share (and bucket) must
  be a multiple of it. ``local_shape`` defaults to all local devices on ``'data'``."""
  shape = dict(zip(('data', 'model'), local_shape or (jax.local_device_count(), 1), strict=True))
  return math.prod(shape[a] for a in rules.compute.mesh_axes(('batch',))[0])


def stacked_spec(spec: PartitionSpec, ndim: int) -> PartitionSpec:
  """The spec of every worker's copy stacked along dimension 0 (rank 0 becomes shape (1,))."""
  entries = list(spec) + [None] * (ndim - len(spec))
  if ndim == 0:
    return PartitionSpec(PROC)
  first = entries[0]
  first = () if first is None else (first,) if isinstance(first, str) else tuple(first)
  return PartitionSpec((PROC, *first), *entries[1:])
