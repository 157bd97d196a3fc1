"""`ArraysHandler`: an orbax item of host arrays written by the process that holds them,
``NAME.npz`` files (`hetjax.checkpoint.ArraysCheckpointer`'s ``state`` item).

Its own module, imported when a checkpointer is first made: importing orbax configures
Python's root logger (an absl log call at import runs ``logging.basicConfig``), which changes
how every later warning of a process prints; importing `hetjax.checkpoint` (and so
`hetjax.pipeline`, `hetjax.ps`) does not.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import numpy as np
import orbax.checkpoint as ocp


class ArraysHandler(ocp.CheckpointHandler):
  """Saves lists of host arrays as ``NAME.npz`` in an orbax item directory (this process's).

  Example::

    ArraysHandler().save(item_dir, ArraysSave({'arrays': [np.ones(3), np.zeros(2)]}))
    ArraysHandler().restore(item_dir, ArraysRestore(['arrays']))   # {'arrays': [...]}
  """

  def save(self, directory, args: ArraysSave) -> None:
    for name, arrays in args.files.items():
      with open(os.path.join(os.fspath(directory), f'{name}.npz'), 'wb') as f:
        np.savez(f, *[np.asarray(a) for a in arrays])

  def restore(self, directory, args: ArraysRestore | None = None) -> dict[str, list[np.ndarray]]:
    names = args.names if args is not None and args.names is not None else sorted(
        p[:-len('.npz')] for p in os.listdir(os.fspath(directory)) if p.endswith('.npz'))
    out = {}
    for name in names:
      with np.load(os.path.join(os.fspath(directory), f'{name}.npz'), allow_pickle=False) as data:
        out[name] = [data[f'arr_{i}'] for i in range(len(data.files))]
    return out


@ocp.args.register_with_handler(ArraysHandler, for_save=True)
@dataclasses.dataclass
class ArraysSave(ocp.args.CheckpointArgs):
  """The files this process writes: ``{name: arrays}`` (names without ``.npz``)."""

  files: Mapping[str, Sequence[np.ndarray]]


@ocp.args.register_with_handler(ArraysHandler, for_restore=True)
@dataclasses.dataclass
class ArraysRestore(ocp.args.CheckpointArgs):
  """The files to read (None: every ``.npz`` file of the item)."""

  names: Sequence[str] | None = None
