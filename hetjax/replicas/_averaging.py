"""Averaging one pipeline stage's parameters among a group of its replicas (SDPipe).

SDPipe runs several replicas of a pipeline; the replicas of one stage stay close by averaging
their parameters, not with an all-reduce over every replica each step, but among a *group* of
replicas that are ready at the time, groups changing from step to step (decentralised
synchronisation: a slow replica does not hold up the groups it is not in). Here a replica is a
process, and `GroupAverager` averages one replica's copy of a stage's parameters with the
copies of the other processes of a group::

  averager = GroupAverager(stage_devices, params)          # once, per stage
  params = averager.average(params, members=(0, 2, 3))     # on processes 0, 2 and 3 only

Design:

* **A mesh per group.** The collective runs on a mesh made of exactly the members' devices,
  shape ``(len(members), devices per process)`` with axes ``('replica', 'local')``, so only the
  members take part: groups of disjoint processes run concurrently and never wait for each
  other. Member ``p``'s row holds the devices of process ``p`` at the positions this process's
  ``local_devices`` have among its own local devices (a stage sits on the same local devices
  in every replica); every member must have as many devices as this process.
* **No host round trip.** The local copy (replicated on the 1-D local mesh) is packed into one
  flat float32 buffer of shape ``(1, size)``; its per-device buffers become the member's row of
  a ``(members, size)`` global array sharded ``P('replica')``
  (`jax.make_array_from_single_device_arrays`, no copy). A `jax.shard_map` program sums the rows
  with `lax.psum` over ``'replica'`` and scales by ``1/members``; the result, replicated on the
  group mesh, is read back as an array on the local mesh from its local shards (again no copy)
  and unpacked into the tree. One buffer means one collective per call, however many leaves.
* **Compiled once per group.** The pack and unpack programs depend only on the template (and
  are jitted once for all groups); the collective program depends on the group and is compiled ahead of
  time on first use and kept by ``tuple(members)`` (`compiles` counts them). A group of one
  returns the tree unchanged, with no program and no collective.
* **Dtypes.** Floating leaves of at most 32 bits (float32, bfloat16, float16) are averaged in
  float32 and cast back to their dtype; any other dtype (integers, bool, float64, complex) is a
  `ConfigError` at construction: averaging them is either meaningless or would lose precision.

`consensus_distance` measures how far replicas have drifted apart (on host copies), the metric
SDPipe uses to judge the effect of group scheduling on convergence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.sharding import make_mesh

PyTree = Any
REPLICA = 'replica'
LOCAL = 'local'


def _local_order(process: int) -> list[jax.Device]:
  """Process ``process``'s devices by id: the positions replicas' devices are matched by."""
  return sorted((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)


class GroupAverager:
  """Averages one replica's copy of a pytree of arrays with the copies of a group of processes.

  Example (on every process, each with its own ``params`` on its own devices)::

    averager = GroupAverager(jax.local_devices(), params)
    if jax.process_index() in (0, 1):
      params = averager.average(params, (0, 1))      # processes 0 and 1 agree on the mean
    else:
      params = averager.average(params, (2, 3))      # concurrently, 2 and 3 do the same

  Args:
    local_devices: this replica's devices, all of this process; the tree given to `average`
      lives on them, replicated (the local mesh is 1-D over them, in this order).
    template: the tree's structure, shapes and dtypes: arrays or `jax.ShapeDtypeStruct`s.

  Raises:
    ConfigError: no devices, devices of another process or repeated, or a leaf whose dtype is
      not a floating type of at most 32 bits.
  """

  def __init__(self, local_devices: Sequence[jax.Device], template: PyTree):
    self.process = jax.process_index()
    devices = list(local_devices)
    own = _local_order(self.process)
    if not devices or len(set(devices)) != len(devices) or not set(devices) <= set(own):
      ids = [d.id for d in devices]
      raise ConfigError(f'local devices {ids} must be distinct devices of this process '
                        f'{self.process} (its devices: {[d.id for d in own]})')
    self.local_mesh = make_mesh((len(devices),), (LOCAL,), devices)
    self._positions = [own.index(d) for d in devices]
    self._own_count = len(own)

    leaves, self._treedef = jax.tree.flatten(template)
    self._shapes = [tuple(leaf.shape) for leaf in leaves]
    self._dtypes = [jnp.dtype(leaf.dtype) for leaf in leaves]
    for path, dtype in zip(self._paths(template), self._dtypes, strict=True):
      if not jnp.issubdtype(dtype, jnp.floating) or dtype.itemsize > 4:
        raise ConfigError(f'cannot average leaf {path} of dtype {dtype}: only floating leaves of '
                          'at most 32 bits (float32, bfloat16, float16) are averaged, in float32')
    self._sizes = [math.prod(s) for s in self._shapes]
    self.size = sum(self._sizes)
    self._replicated = NamedSharding(self.local_mesh, PartitionSpec())
    self._pack = jax.jit(self._pack_leaves, out_shardings=self._replicated)
    self._unpack = jax.jit(self._unpack_flat, out_shardings=self._replicated)
    self._programs: dict[tuple[int, ...], tuple[Mesh, NamedSharding, Any]] = {}

  @property
  def compiles(self) -> int:
    """Group programs compiled so far: one per distinct group of two or more members."""
    return len(self._programs)

  def _paths(self, tree: PyTree) -> list[str]:
    return [jax.tree_util.keystr(path) or '<root>'
            for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]

  # -- programs ----------------------------------------------------------------------------------

  def _pack_leaves(self, leaves: list[jax.Array]) -> jax.Array:
    parts = [leaf.astype(jnp.float32).ravel() for leaf in leaves]
    return jnp.concatenate(parts or [jnp.zeros((0,), jnp.float32)])[None, :]

  def _unpack_flat(self, flat: jax.Array) -> list[jax.Array]:
    out, offset = [], 0
    for shape, dtype, size in zip(self._shapes, self._dtypes, self._sizes, strict=True):
      out.append(flat[0, offset:offset + size].reshape(shape).astype(dtype))
      offset += size
    return out

  def _program(self, members: tuple[int, ...]) -> tuple[Mesh, NamedSharding, Any]:
    """The group's mesh, the stacked input sharding and the compiled averaging program."""
    if members in self._programs:
      return self._programs[members]
    rows = []
    for p in members:
      theirs = _local_order(p)
      if len(theirs) != self._own_count:
        raise ConfigError(f'process {p} has {len(theirs)} devices but process {self.process} has '
                          f'{self._own_count}; replicas of a stage need equal device counts')
      rows.append([theirs[i] for i in self._positions])
    mesh = Mesh(np.array(rows, dtype=object), (REPLICA, LOCAL), axis_types=(AxisType.Auto,) * 2)
    stacked = NamedSharding(mesh, PartitionSpec(REPLICA))
    scale = np.float32(1.0 / len(members))

    def mean(rows_block):
      return lax.psum(rows_block, REPLICA) * scale

    average = jax.shard_map(mean, mesh=mesh, in_specs=PartitionSpec(REPLICA),
                            out_specs=PartitionSpec())
    compiled = jax.jit(average, out_shardings=NamedSharding(mesh, PartitionSpec())).lower(
        jax.ShapeDtypeStruct((len(members), self.size), jnp.float32, sharding=stacked)).compile()
    self._programs[members] = (mesh, stacked, compiled)
    return self._programs[members]

  # -- the call ----------------------------------------------------------------------------------

  def check_members(self, members: Sequence[int]) -> tuple[int, ...]:
    """``members`` as a tuple, or a `ConfigError` if it is not a valid group for this process."""
    group = tuple(int(p) for p in members)
    if not group or len(set(group)) != len(group) or list(group) != sorted(group):
      raise ConfigError(f'group members {list(group)} must be distinct process indices in '
                        'increasing order')
    if group[0] < 0 or group[-1] >= jax.process_count():
      raise ConfigError(f'group members {list(group)} must be process indices in '
                        f'0..{jax.process_count() - 1}')
    if self.process not in group:
      raise ConfigError(f'group members {list(group)} do not include this process '
                        f'{self.process}; only members call average')
    return group

  def average(self, tree: PyTree, members: Sequence[int]) -> PyTree:
    """The mean of ``tree`` over the processes ``members`` (a collective among them only).

    Every member calls this with the same ``members``; other processes do not call it. The
    result has the template's structure, shapes and dtypes and lives on the local mesh,
    replicated; a group of one returns ``tree`` itself.

    Args:
      tree: this replica's copy, leaves on ``local_devices``, matching the template.
      members: the group's process indices, increasing, including this process.

    Raises:
      ConfigError: bad ``members``, a tree that does not match the template, or a member with
        a different device count.
    """
    group = self.check_members(members)
    leaves, treedef = jax.tree.flatten(tree)
    if treedef != self._treedef:
      raise ConfigError(f'tree structure {treedef} does not match the template {self._treedef}')
    for path, leaf, shape, dtype in zip(self._paths(tree), leaves, self._shapes, self._dtypes,
                                        strict=True):
      if tuple(leaf.shape) != shape or jnp.dtype(leaf.dtype) != dtype:
        raise ConfigError(f'leaf {path} is {jnp.dtype(leaf.dtype)}{list(leaf.shape)} but the '
                          f'template has {dtype}{list(shape)}')
    if len(group) == 1 or self.size == 0:
      return tree
    _, stacked, program = self._program(group)
    flat = self._pack(leaves)
    rows = jax.make_array_from_single_device_arrays(
        (len(group), self.size), stacked, [s.data for s in flat.addressable_shards])
    mean = program(rows)
    local = jax.make_array_from_single_device_arrays(
        (1, self.size), self._replicated, [s.data for s in mean.addressable_shards])
    return self._treedef.unflatten(self._unpack(local))


def consensus_distance(trees: Sequence[PyTree]) -> float:
  """SDPipe's consensus distance of replicas: ``mean_i ‖xᵢ − x̄‖₂``.

  ``xᵢ`` is replica ``i``'s parameters flattened into one vector (all leaves, in tree order)
  and ``x̄`` the replicas' mean; the result is 0 when all replicas agree and grows as they drift
  apart between synchronisations. Computed on host copies in float64 (pure numpy; pass
  `jax.device_get` results or numpy arrays).

  Example::

    >>> consensus_distance([{'w': np.zeros(2)}, {'w': np.full(2, 2.0)}])   # x̄ = (1, 1)
    1.4142135623730951

  Raises:
    ConfigError: no trees, or trees of different structures or sizes.
  """
  if not trees:
    raise ConfigError('consensus distance needs at least one replica')
  structure = jax.tree.structure(trees[0])
  vectors = []
  for i, tree in enumerate(trees):
    leaves, treedef = jax.tree.flatten(tree)
    if treedef != structure:
      raise ConfigError(f'replica {i} has tree structure {treedef}, replica 0 has {structure}')
    parts = [np.asarray(leaf, dtype=np.float64).ravel() for leaf in leaves]
    vectors.append(np.concatenate(parts) if parts else np.zeros(0))
  sizes = {v.size for v in vectors}
  if len(sizes) != 1:
    raise ConfigError(f'replicas have different parameter counts: {[v.size for v in vectors]}')
  # Offsets from replica 0 first: identical replicas give exactly 0 (x̄ itself is rounded).
  offsets = np.stack(vectors) - vectors[0]
  return float(np.mean(np.linalg.norm(offsets - offsets.mean(axis=0), axis=1)))
