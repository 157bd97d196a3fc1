"""`ArraysCheckpointer`: checkpoints of states that orbax's array format cannot write — those
that live on some processes of a job only — in orbax step directories, verified the same way.

Orbax's own handlers refuse them: a `jax.Array` on one process's devices is "host local" in a
job of several processes ("Cannot serialize host local jax.Array"), and its numpy handler
writes on process 0 only. A pipeline replica and a parameter server live on one process, a
stage of a grouped plan on its group's processes. So the ``state`` item of their step
directories is written by an orbax handler of our own (`_arrays_handler.ArraysHandler`): each
process writes the parts of the state it holds as host copies, ``NAME.npz`` (``numpy.savez``,
read back without pickles)::

  DIRECTORY/STEP/state/arrays.npz      one process's whole state (a replica, a server)
  DIRECTORY/STEP/state/stage-1.npz     or one part per file (a pipeline's stages)
  DIRECTORY/STEP/meta/metadata         the record, with the checksums of every part

The rest is orbax's and `StepCheckpointer`'s, as for `Checkpointer`: the atomic rename, the
retention, the record, restores verified against the checksums, a bad latest one skipped.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hetjax.checkpoint._checksum import checksums
from hetjax.checkpoint._record import make_record, verify
from hetjax.checkpoint._steps import AGREE_TIMEOUT_S, StepCheckpointer, orbax


class ArraysCheckpointer(StepCheckpointer):
  """Checkpoints whose arrays each process writes as host copies of the parts it holds.

  Saves are synchronous. By default the whole state is one part, ``'arrays'``; a state split
  over processes overrides `_parts`, `_targets` and `_join` (`hetjax.pipeline.StageCheckpointer`).
  Each part's checksums are computed on the host copy that is written and checked on the copy
  read back, before it is put on the restore target's shardings; their paths are the whole
  state's (``'params/1/w'`` for stage 1's ``w``), so the record reads as `Checkpointer`'s.

  Args:
    directory: where the step directories go.
    alone: this process writes and restores its own checkpoints, waiting for no other (a
      pipeline replica, a parameter server); False: every process of the job saves and
      restores together, each its parts (process 0 writes the record), and they agree on the
      step to restore.
    max_to_keep: complete steps kept; older ones are deleted once a newer one is complete.
    fallback: a bad latest checkpoint is skipped for the one before it (False: a
      `ConfigError`, `StepCheckpointer`).

  Example (one process's state)::

    ckpt = ArraysCheckpointer(workdir / 'replica-0', alone=True)
    ckpt.save(state, {'task': 'mlp'})
    state, meta = ckpt.restore(abstract_state)
  """

  def __init__(self, directory: str | os.PathLike, *, alone: bool, max_to_keep: int = 3,
               fallback: bool = True):
    ocp, handlers = orbax(), _handlers()
    me, count = jax.process_index(), jax.process_count()
    processes = {me} if alone else (set(range(count)) if count > 1 else None)
    # Naming the processes makes orbax's barriers run on the coordination service among them
    # (not as a collective over every device, which would wait for processes outside the set
    # and fails for workers of different device counts).
    multiprocessing = ocp.options.MultiprocessingOptions(
        primary_host=me if alone else 0, active_processes=processes,
        barrier_sync_key_prefix=f'hetjax-ckpt-{zlib.crc32(os.fspath(directory).encode()):08x}')
    names = ocp.step.standard_name_format()
    os.makedirs(directory, exist_ok=True)  # orbax does not, for a subset of processes
    manager = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=False, step_name_format=names,
            enable_async_checkpointing=False, multiprocessing_options=multiprocessing),
        item_names=('state', 'meta'),
        item_handlers={'state': handlers.ArraysHandler(),
                       'meta': ocp.JsonCheckpointHandler(multiprocessing_options=multiprocessing)})
    super().__init__(directory, manager, names, agree=not alone, fallback=fallback)
    self._alone = alone

  def save(self, state: Any, meta: Mapping[str, Any], policy_state: Any = None) -> None:
    """Writes checkpoint ``state.step`` (and returns once it is complete); in a job saving
    together, every process calls this."""
    step = int(state.step)
    parts = self._parts(state)
    sums: dict[str, Any] = {}
    for part in parts.values():
      sums |= checksums(part)
    record = make_record(meta, step, self._gather(sums), policy_state)
    files = {name: jax.tree.leaves(part) for name, part in parts.items()}
    self._manager.save(step, args=orbax().args.Composite(
        state=_handlers().ArraysSave(files), meta=orbax().args.JsonSave(record)))
    self._manager.wait_until_finished()

  # -- what a state split over processes overrides ----------------------------------------------

  def _parts(self, state: Any) -> dict[str, Any]:
    """The parts of ``state`` this process writes, as trees of host arrays, by file name."""
    return {'arrays': jax.device_get(state)}

  def _targets(self, abstract_state: Any) -> dict[str, Any]:
    """The parts this process restores, as subtrees of ``abstract_state``, by file name."""
    return {'arrays': abstract_state}

  def _join(self, parts: Mapping[str, Any], abstract_state: Any, meta: Mapping[str, Any]) -> Any:
    """The restored state from its restored parts."""
    return parts['arrays']

  # -- StepCheckpointer --------------------------------------------------------------------------

  def _restore_args(self, abstract_state: Any) -> Any:
    return _handlers().ArraysRestore(list(self._targets(abstract_state)))

  def _verify(self, files: Mapping[str, list[np.ndarray]], meta: Mapping[str, Any],
              abstract_state: Any) -> str | None:
    saved = meta.get('checksums')
    for name, target in self._targets(abstract_state).items():
      host, treedef = files[name], jax.tree.structure(target)
      misfit = _misfit(host, target)
      if misfit is not None:
        return f'does not fit this state ({misfit})'
      restored = checksums(treedef.unflatten(host))
      problem = verify(None if saved is None else
                       {path: saved[path] for path in restored if path in saved}, restored)
      if problem is not None:
        return problem
    return None

  def _finish(self, files: Mapping[str, list[np.ndarray]], meta: Mapping[str, Any],
              abstract_state: Any) -> Any:
    parts = {}
    for name, target in self._targets(abstract_state).items():
      targets, treedef = jax.tree.flatten(target)
      parts[name] = treedef.unflatten([_place(h, t) for h, t in zip(files[name], targets,
                                                                      strict=True)])
    return self._join(parts, abstract_state, meta)

  def _gather(self, sums: dict[str, Any]) -> dict[str, Any]:
    """Every process's checksums on process 0, which writes the record (a job saving
    together); this process's own otherwise."""
    if self._alone or jax.process_count() == 1:
      return sums
    channel = self._round('save')
    channel.set(f'process{jax.process_index()}', sums)
    if jax.process_index() != 0:
      return sums
    merged: dict[str, Any] = {}
    for process in range(jax.process_count()):
      merged |= channel.get(f'process{process}', AGREE_TIMEOUT_S)
    return merged


def _handlers() -> Any:
  """`hetjax.checkpoint._arrays_handler`, imported with orbax on first use (`orbax`)."""
  from hetjax.checkpoint import _arrays_handler
  return _arrays_handler


def _misfit(host: Sequence[np.ndarray], target: Any) -> str | None:
  """How the arrays read back differ in number or shape from ``target``'s leaves, or None."""
  flat = jax.tree_util.tree_flatten_with_path(target)[0]
  if len(host) != len(flat):
    return f'{len(host)} arrays saved, {len(flat)} expected'
  for h, (path, t) in zip(host, flat, strict=True):
    if h.shape != tuple(t.shape):
      name = jax.tree_util.keystr(path, simple=True, separator='/')
      return f"leaf '{name}' has shape {list(h.shape)} saved, {list(t.shape)} expected"
  return None


def _place(host: np.ndarray, target: Any) -> Any:
  """``host`` as ``target`` is: its dtype, on its sharding (a host array if it has none)."""
  sharding = getattr(target, 'sharding', None)
  if sharding is None:
    return np.asarray(host, dtype=target.dtype)
  return jax.make_array_from_callback(tuple(target.shape), sharding,
                                      lambda index: np.asarray(host[index], dtype=target.dtype))
