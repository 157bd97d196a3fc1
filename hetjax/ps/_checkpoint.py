"""A server's checkpoints: its leaves, their optimizer state and its version, verified on restore.

Each server writes its own directory (``DIRECTORY/server-S``), by its process alone, so no
other process joins its saves (`hetjax.checkpoint.ArraysCheckpointer`: an orbax step directory
per version, renamed into place when complete, ``state/arrays.npz`` and the record ``meta``
with the checksums; a server killed while saving leaves the previous version as its latest).
The step of a checkpoint is the server's version; the record holds the version, the workers'
clocks and the protocol besides.

A restore verifies the checksums. A bad latest checkpoint is not skipped: the servers and the
workers resume from what every server restored (its version, the workers' clocks), and a server
that went back alone would break that, so it is a one-line `ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax

from hetjax.checkpoint import ArraysCheckpointer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ServerState:
  """What a server checkpoints: its leaves and their optimizer state at version ``step``."""

  step: int = dataclasses.field(metadata={'static': True})
  params: list
  opt_state: Any


class ServerCheckpointer(ArraysCheckpointer):
  """One server's checkpoints (the `hetjax.checkpoint.CheckpointerProtocol`, module docstring).

  Example::

    ckpt = ServerCheckpointer(workdir / 'checkpoints', server=0)
    ckpt.save(ServerState(version, params, opt_state), {'version': version, 'clocks': clocks})
    state, meta = ckpt.restore(ServerState(0, params, opt_state))   # state.step == version
  """

  def __init__(self, directory: str | os.PathLike, server: int, *, max_to_keep: int = 2):
    super().__init__(os.path.join(os.fspath(directory), f'server-{server}'), alone=True,
                     max_to_keep=max_to_keep, fallback=False)

  def _join(self, parts: Mapping[str, Any], abstract_state: ServerState,
            meta: Mapping[str, Any]) -> ServerState:
    return dataclasses.replace(parts['arrays'], step=int(meta['step']))

  def _no_fallback_reason(self) -> str:
    return ('a server does not go back to an older version alone (the other servers and the '
            'workers would not)')
