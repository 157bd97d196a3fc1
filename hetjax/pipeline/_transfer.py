"""Where pipeline stages live, and moving carries and cotangents between them across processes.

A stage is owned by the process of its devices (a stage's device group never straddles
processes). A value crossing between two stages of one process is a plain
``jax.device_put(x, dst_sharding)`` on that process; the others skip it.

A value crossing between two processes goes over the cross-host transfer socket
(``jax_cross_host_transfer_socket_address``, set per process by `hetjax.runtime.initialize`),
and *every* process calls `jax.device_put` for it, in the same order (all walk the same global
dispatch order): the sender with the real array, every other process with a placeholder of the
same shape and dtype on the *source* sharding that holds no local shards
(`jax.make_array_from_single_device_arrays` with no arrays). The receiver gets the value; a
bystander, owning neither stage, discards its shard-less result. Bystanders must take part
because JAX keys each cross-host transfer by a per-process counter that every process advances
on every such `jax.device_put` ("the transfer key must be incremented in all processes,
regardless of whether they participate", XLA's ``PjRtTransferServer::CopyArraysForCrossHost``):
with only the two ends calling, the keys of a process talking to two others drift apart and the
transfers hang (seen with 4 processes). Source and destination use the same partition spec,
``P('batch')`` on equally sized meshes, so the layouts match shard for shard.

Every process knows each value's shapes without any message: the carries' come from
`jax.eval_shape` of the stage programs on abstract parameters and a micro-batch, the same on
every process; a cotangent has its carry's shape and dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from hetjax._errors import ConfigError
from hetjax.sharding import make_mesh

PyTree = Any


def stage_meshes(devices: Sequence[jax.Device], stages: int,
                 axis: str) -> tuple[tuple[Mesh, ...], tuple[int, ...]]:
  """Per stage, a 1-D mesh over ``axis`` on the next equal contiguous group of ``devices``, and
  the index of the process owning that group.

  Raises:
    ConfigError: if the devices do not split evenly, or a group would span processes.
  """
  devices = list(devices)
  if not devices or len(devices) % stages:
    raise ConfigError(f'{len(devices)} devices do not split evenly over {stages} stages')
  per = len(devices) // stages
  groups = [devices[s * per:(s + 1) * per] for s in range(stages)]
  owners = []
  for s, group in enumerate(groups):
    processes = sorted({d.process_index for d in group})
    if len(processes) != 1:
      raise ConfigError(f'stage {s} would span processes {processes}; a stage\'s devices must '
                        'belong to one process')
    owners.append(processes[0])
  return tuple(make_mesh((per,), (axis,), g) for g in groups), tuple(owners)


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


class StepTransfers:
  """What moves during one step: micro-batch rows from the host onto the stages that use them,
  carries forward and cotangents back (module docstring). Holds the values in flight on this
  process.

  Args:
    rows: per stage, the sharding of its rows and carries (``NamedSharding(mesh, P('batch'))``).
    owners: per stage, the owning process (`stage_meshes`).
    specs: per stage, the abstract carry it receives (`CarrySpecs`; read only for values that
      another process sends).
    host_batch: the step's global batch on the host.
    micro_rows: rows per micro-batch.
  """

  def __init__(self, rows: Sequence[NamedSharding], owners: Sequence[int],
               specs: Sequence[PyTree], host_batch: Mapping[str, Any], micro_rows: int):
    self.rows, self.owners, self.specs = tuple(rows), tuple(owners), tuple(specs)
    self.host_batch, self.micro_rows = host_batch, micro_rows
    self.process = jax.process_index()
    self.inputs: dict[tuple[int, int], PyTree] = {}  # (stage, micro) → carry in, until backward
    self.cotangents: dict[tuple[int, int], PyTree] = {}  # (stage, micro) → d carry out
    self._batches: dict[tuple[int, int], PyTree] = {}

  def local(self, stage: int) -> bool:
    """Whether this process owns ``stage``."""
    return self.owners[stage] == self.process

  def batch(self, s: int, m: int, last_use: bool = False) -> PyTree:
    """Micro-batch ``m``'s rows on stage ``s`` (placed once, dropped after ``last_use``)."""
    if (s, m) not in self._batches:
      part = {k: v[m * self.micro_rows:(m + 1) * self.micro_rows]
              for k, v in self.host_batch.items()}
      self._batches[s, m] = jax.device_put(part, self.rows[s])
    return self._batches.pop((s, m)) if last_use else self._batches[s, m]

  def carry(self, out: PyTree, s: int, m: int) -> None:
    """Stage ``s``'s output for micro-batch ``m`` becomes stage ``s + 1``'s input."""
    received = self._move(out, s, s + 1, self.specs[s + 1])
    if received is not None:
      self.inputs[s + 1, m] = received

  def cotangent(self, d_in: PyTree, s: int, m: int) -> None:
    """Stage ``s``'s input cotangent for micro-batch ``m`` goes back to stage ``s − 1``."""
    received = self._move(d_in, s, s - 1, self.specs[s])
    if received is not None:
      self.cotangents[s - 1, m] = received

  def _move(self, value: PyTree, src: int, dst: int, spec: PyTree) -> PyTree | None:
    """``value`` (stage ``src``'s, read only when local) on ``dst``, or ``None`` if ``dst`` is
    another process's. Every process calls this for every move, in the same order."""
    if self.owners[src] == self.owners[dst]:  # within one process: only that one moves it
      return jax.device_put(value, self.rows[dst]) if self.local(src) else None
    if not self.local(src):  # the receiver or a bystander (module docstring)
      source = self.rows[src]
      value = jax.tree.map(
          lambda a: jax.make_array_from_single_device_arrays(a.shape, source, [], dtype=a.dtype),
          spec)
    moved = jax.device_put(value, self.rows[dst])
    return moved if self.local(dst) else None
