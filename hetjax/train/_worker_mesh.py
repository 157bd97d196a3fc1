"""The meshes of a multi-worker job: each worker's local mesh, and one mesh over all of them.

Workers of equal device counts form a ``('proc', 'data', 'model')`` grid, row ``p`` worker
``p``'s local mesh. Workers of different device counts (``launch --devices 2,1,1``) cannot form
a grid: their job mesh is one axis, ``'devices'``, over every device of every worker in worker
order, and their parameters must be replicated inside each worker (`replicated_layout`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
import optax
from jax.sharding import AbstractMesh, AxisType, Mesh, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.sharding import (
  LogicalRules,
  ShardingRules,
  abstract_model,
  make_mesh,
  param_shardings,
  submodel_prefixes,
)
from hetjax.train._state_layout import StateLayout, state_layout
from hetjax.train._task import Task

PROC = 'proc'
DEVICES = 'devices'


def worker_devices() -> list[list[jax.Device]]:
  """Every worker's devices, in worker order (`jax.devices()`: every process sees all)."""
  return [[d for d in jax.devices() if d.process_index == p] for p in range(jax.process_count())]


def device_counts() -> tuple[int, ...]:
  """Every worker's number of devices, e.g. ``(2, 1, 1)`` under ``launch --devices 2,1,1``."""
  return tuple(len(devices) for devices in worker_devices())


def local_shapes(local_shape: tuple[int, int] | None = None,
                 counts: Sequence[int] | None = None) -> tuple[tuple[int, int], ...]:
  """Every worker's local mesh shape over ``('data', 'model')``, so each worker knows all.

  None: all of a worker's devices on ``'data'``. Given, with equal device counts: that shape on
  every worker. Given, with different counts: its model size on every worker and the rest of
  each worker's devices on ``'data'`` (a mesh fixes one shape, and workers of 2 and 1 devices
  cannot share one).

  Example::

    >>> local_shapes((4, 1), counts=(2, 1, 1))   # the data size follows each worker's devices
    ((2, 1), (1, 1), (1, 1))

  Raises:
    ConfigError: the model size does not divide some worker's device count.
  """
  counts = tuple(device_counts() if counts is None else counts)
  if local_shape is None:
    return tuple((k, 1) for k in counts)
  local_shape = tuple(local_shape)
  if len(set(counts)) == 1:
    return (local_shape,) * len(counts)
  model = local_shape[1]
  for p, k in enumerate(counts):
    if k % model:
      raise ConfigError(f'mesh {local_shape[0]}x{model}: worker {p} has {k} device(s), not a '
                        f'multiple of the model size {model} (workers of different device counts '
                        f'{counts} keep the model size, and each puts the rest on data)')
  return tuple((k // model, model) for k in counts)


def worker_meshes(local_shape: tuple[int, int] | None = None) -> tuple[Mesh, Mesh]:
  """This worker's local mesh ``('data', 'model')`` and the job's mesh.

  Equal device counts: the job mesh is ``('proc', 'data', 'model')``, row ``p`` worker ``p``'s
  local mesh, device for device, so an array on it that is replicated over ``'proc'`` has, on
  each worker, exactly the shards of an array on that worker's local mesh. Different counts:
  the job mesh is ``('devices',)`` over every device in worker order; an array replicated on it
  has, on each worker, the shards of a replicated array on the local mesh.

  Args:
    local_shape: see `local_shapes` (None: all local devices on ``'data'``).

  Raises:
    ConfigError: a shape that does not fit the devices.
  """
  per_worker = worker_devices()
  shapes = local_shapes(local_shape, [len(d) for d in per_worker])
  local = make_mesh(shapes[jax.process_index()], devices=jax.local_devices())
  if len(set(shapes)) > 1:
    flat = np.array([d for devices in per_worker for d in devices], dtype=object)
    return local, Mesh(flat, (DEVICES,), axis_types=(AxisType.Auto,))
  grid = np.array(per_worker, dtype=object).reshape((len(per_worker), *shapes[0]))
  return local, Mesh(grid, (PROC, *local.axis_names), axis_types=(AxisType.Auto,) * 3)


def batch_degrees(rules: ShardingRules, local_shape: tuple[int, int] | None = None
                  ) -> tuple[int, ...]:
  """How many ways each worker's rows are split over its local mesh: worker ``i``'s every share
  must be a multiple of entry ``i``. ``local_shape``: see `local_shapes`.

  Example::

    batch_degrees(Strategy.DATA_PARALLEL.rules())   # under launch --devices 2,1,1: (2, 1, 1)
  """
  axes = rules.compute.mesh_axes(('batch',))[0]
  return tuple(math.prod(dict(zip(('data', 'model'), shape, strict=True))[a] for a in axes)
               for shape in local_shapes(local_shape))


def local_batch_degree(rules: ShardingRules, local_shape: tuple[int, int] | None = None,
                       worker: int | None = None) -> int:
  """Worker ``worker``'s entry of `batch_degrees` (default: this worker's)."""
  return batch_degrees(rules, local_shape)[jax.process_index() if worker is None else worker]


def replicated_layout(task: Task, optimizer: optax.GradientTransformation, mesh: Mesh,
                      rules: ShardingRules, shapes: Sequence[tuple[int, int]], strategy: str,
                      seed: int = 0) -> StateLayout:
  """The state replicated on ``mesh``, once every worker's local layout is checked to replicate
  every parameter: what workers of different device counts need, since their job mesh
  (`worker_meshes`) has no local axes to shard over.

  A parameter is replicated inside a worker when every mesh axis its rules split it over has
  size 1 there: data parallel on any mesh, hybrid of model size 1, FSDP and tensor parallel
  on one device. Every worker checks every worker's shape, so all of them fail alike.

  Example::

    replicated_layout(task, opt, mesh, Strategy.FSDP.rules(), [(2, 1), (1, 1), (1, 1)],
                      'strategy fsdp')
    # ConfigError: workers of different device counts (2, 1, 1) need every parameter
    # replicated inside a worker, but fsdp on worker 0's 2x1 mesh splits 'up/kernel' over
    # data: use strategy data_parallel

  Args:
    task, optimizer, seed: the model and its optimizer.
    mesh: the job mesh (``('devices',)``).
    rules: the layout inside each worker.
    shapes: every worker's local mesh shape over ``('data', 'model')`` (`local_shapes`).
    strategy: what to call ``rules`` in the error (e.g. ``'strategy fsdp'``).

  Raises:
    ConfigError: naming the first parameter a worker's layout splits, one line.
  """
  _, params, names = abstract_model(task.make_model, seed)
  prefixes = submodel_prefixes(task.make_model) if rules.params.scopes else None
  for shape in dict.fromkeys(shapes):
    local = AbstractMesh(shape, ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
    shardings = param_shardings(params, names, local, rules.params, prefixes)
    for path, sharding in jax.tree_util.tree_flatten_with_path(shardings)[0]:
      axes = [a for entry in sharding.spec if entry is not None
              for a in ((entry,) if isinstance(entry, str) else entry) if local.shape[a] > 1]
      if axes:
        worker = list(shapes).index(shape)
        name = '/'.join(str(getattr(k, 'key', k)) for k in path)
        raise ConfigError(
            f'workers of different device counts {tuple(math.prod(s) for s in shapes)} need '
            f'every parameter replicated inside a worker, but {strategy} on worker {worker}\'s '
            f'{shape[0]}x{shape[1]} mesh splits {name!r} over {"x".join(axes)}: use strategy '
            'data_parallel')
  return state_layout(task, optimizer, mesh, LogicalRules(), seed)


def stacked_spec(spec: PartitionSpec, ndim: int) -> PartitionSpec:
  """The spec of every worker's copy stacked along dimension 0 (rank 0 becomes shape (1,))."""
  entries = list(spec) + [None] * (ndim - len(spec))
  if ndim == 0:
    return PartitionSpec(PROC)
  first = entries[0]
  first = () if first is None else (first,) if isinstance(first, str) else tuple(first)
  return PartitionSpec((PROC, *first), *entries[1:])
