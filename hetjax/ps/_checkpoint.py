"""A server's checkpoints: its leaves, their optimizer state and its version, with orbax.

Each server writes its own directory (``DIRECTORY/server-S``) with an orbax `CheckpointManager`
limited to its own process (``MultiprocessingOptions(active_processes={this process})``), so no
other process joins its barriers. Arrays are saved as host copies (orbax refuses arrays that
live on one process of several); a save is atomic (orbax renames a finished step into place),
so a server killed while saving leaves the previous step as its latest.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class ServerCheckpointer:
  """Saves and restores one server's state at its version."""

  def __init__(self, directory: str | os.PathLike, server: int, *, max_to_keep: int = 2):
    me = jax.process_index()
    self.directory = os.path.abspath(os.path.join(os.fspath(directory), f'server-{server}'))
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=False, enable_async_checkpointing=False,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            primary_host=me, active_processes={me},
            barrier_sync_key_prefix=f'hetjax-ps-server-{server}'))
    os.makedirs(self.directory, exist_ok=True)  # orbax will not, for a subset of processes
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_version(self) -> int | None:
    return self._manager.latest_step()

  def save(self, version: int, state: Any, meta: dict) -> None:
    host = jax.tree.map(np.asarray, state)
    self._manager.save(version, args=ocp.args.Composite(
        state=ocp.args.StandardSave(host), meta=ocp.args.JsonSave(dict(meta))))
    self._manager.wait_until_finished()

  def restore(self, template: Any, version: int | None = None) -> tuple[Any, dict]:
    """The state at ``version`` (default: the latest) shaped like ``template``, and its meta."""
    version = self.latest_version() if version is None else version
    target = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), template)
    out = self._manager.restore(version, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    return out.state, out.meta

  def close(self) -> None:
    self._manager.close()
