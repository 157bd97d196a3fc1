"""Orbax checkpoints of the train state plus a JSON record of everything needed to resume."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
from absl import flags

from hetjax.checkpoint._checksum import checksums
from hetjax.checkpoint._record import make_record, verify
from hetjax.checkpoint._steps import StepCheckpointer, orbax
from hetjax.train import TrainState


class Checkpointer(StepCheckpointer):
  """Saves and restores `TrainState` with orbax, atomically, verified on restore.

  A checkpoint is one orbax step directory holding two items: ``state`` (the arrays) and
  ``meta`` (JSON: task, data position, room for plan and shares, and ``'checksums'``: a
  checksum per leaf of the state, `hetjax.checkpoint._checksum`).

  What we rely on from orbax (0.12, ``CheckpointManager`` on a POSIX file system), read in its
  source and tested in ``tests/test_checkpoint_verify.py``:

  - Atomic save: a step is written into ``<step>.orbax-checkpoint-tmp…`` and renamed to
    ``<step>`` only once every process's writes are committed (``AtomicRenameTemporaryPath``).
    A process killed during a save leaves only the temporary, which `latest_step`, `all_steps`
    and `restore` ignore.
  - Deletion after finalize: with ``max_to_keep`` the steps to delete are chosen when a save
    starts, counting the new step, and deleted in the save's finalize, after the rename and
    only if the commit succeeded. So the newest complete checkpoint is never deleted before a
    newer one is complete (``max_to_keep >= 2`` keeps an older one to fall back to as well).

  Orbax does not check what it reads (flipped bytes in a data chunk restore silently), so
  `restore` compares the checksums. A checkpoint that does not read back or fails that check
  is skipped, with one warning line, for the one before it — in every process of a job alike.
  The record, the verified restore and the rest of `CheckpointerProtocol` are
  `StepCheckpointer`'s, shared with the checkpointers of the other states.

  Restoring takes an abstract target (`Trainer.abstract_state`) whose shardings may differ from
  the ones saved: a run saved on a 4x2 mesh restores onto 8x1 or onto one device.

  Example::

    ckpt = Checkpointer(workdir / 'checkpoints')
    ckpt.save(state, meta={'task': 'mlp'})
    state, meta = ckpt.restore(trainer.abstract_state())
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
               asynchronous: bool = True):
    """``asynchronous``: a save returns once the arrays are copied and is written in the
    background (orbax's default); False: `save` returns once the checkpoint is complete, so a
    job killed at any later step loses at most the steps since this save."""
    _barriers_for_unequal_workers()
    ocp = orbax()
    names = ocp.step.standard_name_format()
    manager = ocp.CheckpointManager(
        os.path.abspath(os.fspath(directory)),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             step_name_format=names,
                                             enable_async_checkpointing=asynchronous))
    super().__init__(directory, manager, names, agree=True)

  def save(self, state: TrainState, meta: Mapping[str, Any], policy_state: Any = None) -> None:
    """Starts saving ``state`` at its step (asynchronously; the arrays are copied first).

    ``policy_state`` (a policy's state after that step, e.g. the LB-BSP shares and predictor
    history) is saved in the JSON record under ``'policy'`` (`hetjax.core.encode_state`);
    `policy_state` reads it back. The state's checksums go in the record under
    ``'checksums'``, computed before this returns (in a job of several processes, a collective:
    every process calls `save`, as orbax needs anyway).
    """
    step, ocp = int(state.step), orbax()
    record = make_record(meta, step, checksums(state), policy_state)
    self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(record)))

  def _restore_args(self, abstract_state: TrainState) -> Any:
    return orbax().args.StandardRestore(abstract_state)

  def _verify(self, state: TrainState, meta: Mapping[str, Any], abstract_state: TrainState
              ) -> str | None:
    # A collective over the restored global arrays: every process computes it (`_agree` let
    # all of them read the checkpoint first).
    return verify(meta.get('checksums'), checksums(state))


def _barriers_for_unequal_workers() -> None:
  """Orbax's default barrier is a JAX collective that lays the devices out as a (processes x
  local devices) grid (`jax.experimental.multihost_utils`), which fails for workers of different
  device counts (``launch --devices 2,1,1``: "cannot reshape array of size 4 into shape (3,2)").
  Its barrier on the coordination service does not, so such a job turns that one on (set as if
  given on the command line: orbax reads it as an absl flag, parsed or not)."""
  counts = {sum(d.process_index == p for d in jax.devices()) for p in range(jax.process_count())}
  if len(counts) > 1:
    orbax()  # orbax defines the flag when it is first imported (lazily: `_steps.orbax`)
    flag = flags.FLAGS['experimental_orbax_use_distributed_barrier']
    flag.value, flag.present = True, max(flag.present, 1)
