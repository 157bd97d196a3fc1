"""Moving micro-batches, carries and cotangents between pipeline stages, across processes too.

Every value that crosses a stage boundary is split by rows only (its leading, ``'batch'``
dimension, as the receiving stage's `StageLayout.rules` say), so a move is a matter of which
rows go from which device to which. Three cases, from cheapest:

* **Within one process** (both stages' devices are this process's): ``jax.device_put(x,
  dst_sharding)``, whatever the two layouts.
* **Same layout, one process to another** (meshes of one shape, one partition spec, each
  stage on one process): one ``jax.device_put`` over the cross-host transfer socket
  (``jax_cross_host_transfer_socket_address``, set per process by `hetjax.runtime.initialize`:
  loopback under `hetjax.launch`; a port taken by then is a `ConfigError`, `_cross_host_put`),
  shard for shard. This is the classic pipeline of one stage per process.
* **Anything else** (groups of different sizes, stages that span processes or share some):
  an exchange program. One jitted program over the devices of both stages (`_exchange`) takes
  every device's block of rows stacked along a leading device axis (zeros on the devices that
  hold none) and returns every destination device's rows the same way; which rows go where is
  `piece_plan`, a pure function of the two shardings and the shape. XLA moves them with
  collectives among those processes only, and each receiving process builds its shards of the
  global array from its devices' blocks (``jax.make_array_from_single_device_arrays``).
  Cross-host ``device_put``, of single-device pieces or of whole same-layout values, hangs on
  the CPU backend when its receiver asks for a value while the sender runs a multi-device
  program spanning processes (processes of 2 devices; of 1 device it did not hang), so a
  pipeline with such a stage moves every value between processes this way.

The cross-host ``jax.device_put`` of the second case is called by *every* process, in the same
order (all walk the same global dispatch order): the sender with the real array, every other
process with a placeholder of the same shape and dtype on the *source* sharding that holds no
local shards (`jax.make_array_from_single_device_arrays` with no arrays). JAX keys each
cross-host transfer by a per-process counter that every process advances on every such call
("the transfer key must be incremented in all processes, regardless of whether they
participate", XLA's ``PjRtTransferServer::CopyArraysForCrossHost``): with only the two ends
calling, the keys of a process talking to two others drift apart and the transfers hang (seen
with 4 processes). An exchange program is called by the processes of its two stages only.

Every process knows each value's shapes without any message: the carries' come from
`jax.eval_shape` of the stage programs on abstract parameters and a micro-batch, the same on
every process; a cotangent has its carry's shape and dtype.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from hetjax._errors import ConfigError
from hetjax.runtime import port_in_use

PyTree = Any


class CarrySpecs:
  """Per stage, the abstract carry it receives (``None`` for stage 0), by `jax.eval_shape` of the
  stages' forwards; computed once per micro-batch signature.

  Args:
    apply: ``apply(stage, params, carry, batch) -> carry``, a stage's forward.
    params: per stage, its parameters (abstract: only shapes and dtypes are read).
    micro_rows: rows per micro-batch.
  """

  def __init__(self, apply: Callable[[int, PyTree, PyTree, Any], PyTree],
               params: Sequence[PyTree], micro_rows: int):
    self.apply, self.params, self.micro_rows = apply, tuple(params), micro_rows
    self._cache: dict[tuple, tuple[PyTree, ...]] = {}

  def __call__(self, host_batch: Mapping[str, Any]) -> tuple[PyTree, ...]:
    """The specs for micro-batches of ``host_batch`` (the same on every process)."""
    part = {k: v[:self.micro_rows] for k, v in host_batch.items()}
    key = tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in part.items()))
    if key not in self._cache:
      specs: list[PyTree] = [None]
      for s in range(len(self.params) - 1):
        specs.append(jax.eval_shape(lambda p, c, b, s=s: self.apply(s, p, c, b),
                                    self.params[s], specs[-1], part))
      self._cache[key] = tuple(specs)
    return self._cache[key]


@dataclasses.dataclass(frozen=True)
class Piece:
  """Rows that one source device sends to one destination device.

  Attributes:
    src: the device holding the rows.
    dst: the device receiving them.
    start: where the rows begin in the source device's shard.
    offset: where they go in the destination device's shard.
    rows: how many.
  """

  src: jax.Device
  dst: jax.Device
  start: int
  offset: int
  rows: int


def _row_range(index: tuple[slice, ...], shape: tuple[int, ...], what: str) -> tuple[int, int]:
  for dim, (s, size) in enumerate(zip(index[1:], shape[1:], strict=True), start=1):
    if s.indices(size) != (0, size, 1):
      raise ConfigError(f'{what} splits dimension {dim}; stages exchange values split by rows '
                        'only')
  start, stop, _ = index[0].indices(shape[0]) if index else (0, 1, 1)
  return start, stop


@functools.lru_cache(maxsize=1024)
def piece_plan(shape: tuple[int, ...], src: NamedSharding, dst: NamedSharding
               ) -> tuple[Piece, ...]:
  """The pieces that move an array of ``shape`` from ``src`` to ``dst`` (module docstring).

  Each row range the source holds is sent from the first device holding it (in mesh order);
  every destination device receives the pieces of its rows, in row order.

  Example: 8 rows from 2 devices (4 each) to 4 devices (2 each) are 4 pieces of 2 rows;
  from 4 devices to 2, 4 pieces of 2 rows, two per destination.
  """
  def ranges(sharding: NamedSharding) -> dict[jax.Device, tuple[int, int]]:
    index = sharding.devices_indices_map(shape)
    return {d: _row_range(index[d], shape, str(sharding.spec)) for d in sharding.mesh.devices.flat}

  holders: dict[tuple[int, int], jax.Device] = {}
  for device, rows in ranges(src).items():
    holders.setdefault(rows, device)
  blocks = sorted(holders.items())
  pieces = []
  for device, (a, b) in ranges(dst).items():
    for (c, e), holder in blocks:
      lo, hi = max(a, c), min(b, e)
      if lo < hi:
        pieces.append(Piece(holder, device, lo - c, lo - a, hi - lo))
  return tuple(pieces)


def _same_layout(src: NamedSharding, dst: NamedSharding) -> bool:
  """Whether JAX moves ``src`` → ``dst`` across hosts in one transfer: meshes of one shape and
  axis names, one spec, each side on one process, not the same one (with a side spanning
  processes jax 0.10 fails: "PjRtArray has different number of buffers than buffer_idxs")."""
  processes = [{d.process_index for d in s.mesh.devices.flat} for s in (src, dst)]
  return (src.mesh.axis_names == dst.mesh.axis_names and src.mesh.devices.shape ==
          dst.mesh.devices.shape and src.spec == dst.spec and len(processes[0]) == 1 and
          len(processes[1]) == 1 and processes[0] != processes[1])


def _placeholder(spec: jax.ShapeDtypeStruct, sharding) -> jax.Array:
  """An array of ``spec``'s shape on ``sharding`` with no local shards (module docstring)."""
  return jax.make_array_from_single_device_arrays(spec.shape, sharding, [], dtype=spec.dtype)


def _cross_host_put(value: PyTree, dst: NamedSharding) -> PyTree:
  """``jax.device_put(value, dst)`` across processes; JAX binds this process's transfer socket
  on the first one, so a port taken since `hetjax.runtime.initialize` checked it is a
  `ConfigError` here."""
  try:
    return jax.device_put(value, dst)
  except jax.errors.JaxRuntimeError as e:  # 'FAILED_PRECONDITION: bind: Address already in use'
    if 'Address already in use' not in str(e):
      raise
    address = os.environ.get('HETJAX_TRANSFER_ADDRESS', '(unknown address)')
    raise ConfigError(port_in_use(address, "this process's transfer socket, "
                                  'jax_cross_host_transfer_socket_address')) from None


def move(value: PyTree | None, spec: PyTree, src: NamedSharding, dst: NamedSharding,
         direct: bool = True) -> PyTree | None:
  """``value`` (held on ``src``; ``None`` on a process holding none of it) on ``dst``, or
  ``None`` on a process with no device of ``dst``. Every process calls this for every move, in
  the same order; ``spec`` (a tree of `jax.ShapeDtypeStruct`) is read for values held
  elsewhere. ``direct=False`` never uses a cross-host ``device_put`` (a pipeline with stages
  spanning processes: module docstring)."""
  me = jax.process_index()
  src_processes = {d.process_index for d in src.mesh.devices.flat}
  dst_processes = {d.process_index for d in dst.mesh.devices.flat}
  if len(src_processes) == 1 and src_processes == dst_processes:
    if me not in src_processes:  # both stages on one other process: nothing to do here
      return None
    return jax.device_put(value, dst)
  if direct and _same_layout(src, dst):
    if me not in src_processes:
      value = jax.tree.map(lambda a: _placeholder(a, src), spec)
    moved = _cross_host_put(value, dst)
    return moved if me in dst_processes else None
  leaves, tree = jax.tree.flatten(spec)
  held = [None] * len(leaves) if me not in src_processes else tree.flatten_up_to(value)
  out = [_exchange_rows(v, s, src, dst, me) for v, s in zip(held, leaves, strict=True)]
  return tree.unflatten(out) if me in dst_processes else None


@functools.lru_cache(maxsize=256)
def _exchange(shape: tuple[int, ...], dtype: Any, src: NamedSharding, dst: NamedSharding):
  """``(union mesh, its devices, source block rows, program)``: one jitted program over the
  devices of both shardings that takes every device's block of rows (zeros where a device holds
  none) stacked along a leading device axis, and returns every destination device's rows the
  same way (module docstring). Its collectives run among the two stages' processes only."""
  rows = shape[0] if shape else 1
  rest = shape[1:]
  pieces = piece_plan(shape, src, dst)
  union = list(src.mesh.devices.flat) + [d for d in dst.mesh.devices.flat
                                          if d not in set(src.mesh.devices.flat)]
  mesh = jax.sharding.Mesh(np.array(union, dtype=object), ('exchange',))
  src_block = rows // math.prod(src.mesh.shape[a] for a in _row_axes(src))
  dst_block = rows // math.prod(dst.mesh.shape[a] for a in _row_axes(dst))
  index = {d: i for i, d in enumerate(union)}
  by_dst: dict[jax.Device, list[Piece]] = collections.defaultdict(list)
  for piece in pieces:
    by_dst[piece.dst].append(piece)

  def run(stacked):
    out = []
    for device in union:
      parts = [stacked[index[p.src], p.start:p.start + p.rows]
               for p in sorted(by_dst.get(device, ()), key=lambda p: p.offset)]
      out.append(jnp.concatenate(parts) if parts else jnp.zeros((dst_block, *rest), dtype))
    return jnp.stack(out)

  blocks = NamedSharding(mesh, jax.sharding.PartitionSpec('exchange'))
  return mesh, union, src_block, jax.jit(run, out_shardings=blocks)


def _row_axes(sharding: NamedSharding) -> tuple[str, ...]:
  """The mesh axes a sharding splits its first dimension over (none for a scalar)."""
  if not sharding.spec:
    return ()
  first = sharding.spec[0]
  return () if first is None else (first,) if isinstance(first, str) else tuple(first)


def _exchange_rows(value: jax.Array | None, spec: jax.ShapeDtypeStruct, src: NamedSharding,
                   dst: NamedSharding, me: int) -> jax.Array | None:
  """One array through `_exchange`'s program, by the processes of either stage."""
  shape = tuple(spec.shape)
  mesh, union, src_block, program = _exchange(shape, np.dtype(spec.dtype), src, dst)
  if me not in {d.process_index for d in union}:
    return None
  rest = shape[1:]
  shards = {} if value is None else {s.device: s.data for s in value.addressable_shards}
  local = [d for d in union if d.process_index == me]
  blocks = [(shards[d] if shape else shards[d].reshape(1))[None] if d in shards else
            jnp.zeros((1, src_block, *rest), spec.dtype, device=d) for d in local]
  stacked = jax.make_array_from_single_device_arrays(
      (len(union), src_block, *rest), NamedSharding(mesh, jax.sharding.PartitionSpec('exchange')),
      blocks)
  out = program(stacked)
  mine = {s.device: s.data for s in out.addressable_shards}
  arrays = [mine[d][0] if shape else mine[d][0].reshape(())
            for d in dst.mesh.devices.flat if d.process_index == me]
  if not arrays:
    return None
  return jax.make_array_from_single_device_arrays(shape, dst, arrays)


class StepTransfers:
  """What moves during one step: micro-batch rows from the host onto the stages that use them,
  carries forward and cotangents back (module docstring). Holds the values in flight on this
  process.

  Args:
    rows: per stage, the sharding of its rows and carries.
    specs: per stage, the abstract carry it receives (`CarrySpecs`; read only for values that
      another process holds).
    host_batch: the step's global batch on the host (the same on every process).
    micro_rows: rows per micro-batch.
    settle: applied to every value received (e.g. waiting for it to arrive).
    direct: whether a move between stages of one process each may be a cross-host
      ``device_put`` (`move`).
  """

  def __init__(self, rows: Sequence[NamedSharding], specs: Sequence[PyTree],
               host_batch: Mapping[str, Any], micro_rows: int,
               settle: Callable[[PyTree], PyTree] = lambda value: value, direct: bool = True):
    self.rows, self.specs = tuple(rows), tuple(specs)
    self.host_batch, self.micro_rows, self.settle = host_batch, micro_rows, settle
    self.direct = direct
    self.inputs: dict[tuple[int, int], PyTree] = {}  # (stage, micro) → carry in, until backward
    self.cotangents: dict[tuple[int, int], PyTree] = {}  # (stage, micro) → d carry out
    self._batches: dict[tuple[int, int], PyTree] = {}

  def batch(self, s: int, m: int, last_use: bool = False) -> PyTree:
    """Micro-batch ``m``'s rows on stage ``s`` (placed once, dropped after ``last_use``);
    called only by processes of stage ``s``."""
    if (s, m) not in self._batches:
      part = {k: v[m * self.micro_rows:(m + 1) * self.micro_rows]
              for k, v in self.host_batch.items()}
      sharding = self.rows[s]
      if sharding.is_fully_addressable:
        self._batches[s, m] = jax.device_put(part, sharding)
      else:  # every process of the stage gives its own shards of the same host rows
        self._batches[s, m] = {k: jax.make_array_from_callback(
            v.shape, sharding, lambda index, v=v: np.asarray(v[index])) for k, v in part.items()}
    return self._batches.pop((s, m)) if last_use else self._batches[s, m]

  def carry(self, out: PyTree, s: int, m: int) -> None:
    """Stage ``s``'s output for micro-batch ``m`` becomes stage ``s + 1``'s input."""
    received = move(out, self.specs[s + 1], self.rows[s], self.rows[s + 1], self.direct)
    if received is not None:
      self.inputs[s + 1, m] = self.settle(received)

  def cotangent(self, d_in: PyTree, s: int, m: int) -> None:
    """Stage ``s``'s input cotangent for micro-batch ``m`` goes back to stage ``s − 1``."""
    received = move(d_in, self.specs[s], self.rows[s], self.rows[s - 1], self.direct)
    if received is not None:
      self.cotangents[s - 1, m] = self.settle(received)
