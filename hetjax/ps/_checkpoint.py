"""A server's checkpoints: its leaves, their optimizer state and its version, with orbax.

Each server writes its own directory (``DIRECTORY/server-S``) with an orbax `CheckpointManager`
limited to its own process (``MultiprocessingOptions(primary_host=this process,
active_processes={this process})``, for the manager and its JSON handler), so no other process
joins its barriers. Orbax keeps the steps (atomic: a step is written into a temporary directory
and renamed when complete, so a server killed while saving leaves the previous step as its
latest) and the retention. The arrays go through a small orbax handler of our own
(`ArraysHandler`: one ``arrays.npz``, read back without pickles): orbax's own handlers refuse
them here — a single-device `jax.Array` in a job of several processes is "host local", and its
numpy handler writes files on process 0 only, so a server's steps came out empty.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class ArraysHandler(ocp.CheckpointHandler):
  """Saves a list of arrays as ``arrays.npz`` in an orbax item directory (this process only)."""

  def save(self, directory, args: ArraysSave) -> None:
    with open(os.path.join(os.fspath(directory), 'arrays.npz'), 'wb') as f:
      np.savez(f, *[np.asarray(a) for a in args.arrays])

  def restore(self, directory, args: ArraysRestore | None = None) -> list[np.ndarray]:
    with np.load(os.path.join(os.fspath(directory), 'arrays.npz'), allow_pickle=False) as data:
      return [data[f'arr_{i}'] for i in range(len(data.files))]


@ocp.args.register_with_handler(ArraysHandler, for_save=True)
@dataclasses.dataclass
class ArraysSave(ocp.args.CheckpointArgs):
  arrays: list


@ocp.args.register_with_handler(ArraysHandler, for_restore=True)
@dataclasses.dataclass
class ArraysRestore(ocp.args.CheckpointArgs):
  pass


class ServerCheckpointer:
  """Saves and restores one server's state at its version."""

  def __init__(self, directory: str | os.PathLike, server: int, *, max_to_keep: int = 2):
    me = jax.process_index()
    self.directory = os.path.abspath(os.path.join(os.fspath(directory), f'server-{server}'))
    alone = ocp.options.MultiprocessingOptions(  # this process writes, waits for no other
        primary_host=me, active_processes={me},
        barrier_sync_key_prefix=f'hetjax-ps-server-{server}')
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=False, enable_async_checkpointing=False,
        multiprocessing_options=alone)
    os.makedirs(self.directory, exist_ok=True)  # orbax will not, for a subset of processes
    handlers = {'state': ArraysHandler(),
                'meta': ocp.JsonCheckpointHandler(multiprocessing_options=alone)}
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=('state', 'meta'), item_handlers=handlers)

  def latest_version(self) -> int | None:
    return self._manager.latest_step()

  def save(self, version: int, state: Any, meta: dict) -> None:
    leaves = [np.asarray(x) for x in jax.tree.leaves(state)]
    self._manager.save(version, args=ocp.args.Composite(
        state=ArraysSave(leaves), meta=ocp.args.JsonSave(dict(meta))))
    self._manager.wait_until_finished()

  def restore(self, template: Any, version: int | None = None) -> tuple[Any, dict]:
    """The state at ``version`` (default: the latest) shaped like ``template``, and its meta."""
    version = self.latest_version() if version is None else version
    out = self._manager.restore(version, args=ocp.args.Composite(
        state=ArraysRestore(), meta=ocp.args.JsonRestore()))
    leaves, treedef = jax.tree.flatten(template)
    if len(out.state) != len(leaves) or any(
        a.shape != np.shape(b) for a, b in zip(out.state, leaves, strict=True)):
      raise ValueError(f'checkpoint {self.directory}/{version} does not hold this server\'s '
                       'leaves (another model or layout?)')
    return jax.tree.unflatten(treedef, list(out.state)), out.meta

  def close(self) -> None:
    self._manager.close()
