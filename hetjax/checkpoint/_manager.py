"""Orbax checkpoints of the train state plus a JSON record of everything needed to resume."""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import flags
from etils import epath

from hetjax._errors import ConfigError
from hetjax.checkpoint._checksum import checksums, first_difference
from hetjax.core import decode_state, encode_state
from hetjax.runtime import Channel
from hetjax.train import Hook, StepInfo, TrainState

AGREE_TIMEOUT_S = 300.0  # how long a process waits for the others' verdict on a checkpoint
# Agreement rounds so far per checkpoint directory, the same count in every process of a job
# (they restore in lockstep), so that each round's keys are new.
_ROUNDS: collections.Counter[str] = collections.Counter()


class Checkpointer:
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
    self.directory = os.fspath(directory)
    _barriers_for_unequal_workers()
    self._names = ocp.step.standard_name_format()
    self._manager = ocp.CheckpointManager(
        os.path.abspath(self.directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             step_name_format=self._names,
                                             enable_async_checkpointing=asynchronous))

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or ``None``."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, state: TrainState, meta: Mapping[str, Any], policy_state: Any = None) -> None:
    """Starts saving ``state`` at its step (asynchronously; the arrays are copied first).

    ``policy_state`` (a policy's state after that step, e.g. the LB-BSP shares and predictor
    history) is saved in the JSON record under ``'policy'`` (`hetjax.core.encode_state`);
    `policy_state` reads it back. The state's checksums go in the record under
    ``'checksums'``, computed before this returns (in a job of several processes, a collective:
    every process calls `save`, as orbax needs anyway).
    """
    step = int(state.step)
    meta = {**meta, 'step': step, 'checksums': checksums(state)}
    if policy_state is not None:
      meta['policy'] = encode_state(policy_state)
    self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))))

  def read_meta(self, step: int | None = None) -> dict[str, Any]:
    """The JSON record of checkpoint ``step`` (default: the latest) without loading arrays.

    Raises:
      ConfigError: no such checkpoint, or its record does not read back (one line).
    """
    step = self._require(step)
    try:
      return self._manager.restore(step,
                                   args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    except Exception as e:  # a corrupt record: one line, not orbax's traceback
      raise ConfigError(f'the record of checkpoint step {step} in {self.directory} is '
                        f'unreadable ({_first_line(e)})') from None

  def restore(
      self, abstract_state: TrainState, step: int | None = None
  ) -> tuple[TrainState, dict[str, Any]]:
    """Loads checkpoint ``step`` (default: the latest good one) into the layout of
    ``abstract_state``.

    A checkpoint is good if its files read back (flipped bytes, a truncated file: orbax and
    tensorstore fail with DATA_LOSS, a decode error, …) and the restored state has the
    checksums in its record (one without any, saved before there were checksums, is not
    checked). A bad latest one is skipped with one warning line naming it and why, and the one
    before it is used::

      warning: checkpoint step 2 in ckpt failed verification (leaf 'params/w' checksum
      differs); using step 1

    In a job of several processes every process reports each attempt on the coordination
    service and all skip if any failed, so they resume from the same step.

    Raises:
      ConfigError: no complete checkpoint, the asked ``step`` bad, or none good (one line).
    """
    candidates = [self._require(step)] if step is not None else \
        sorted(self._manager.all_steps(), reverse=True) or [self._require(None)]
    for i, candidate in enumerate(candidates):
      restored, problem = self._read(candidate, abstract_state)
      problem = self._agree(problem)  # the checksum is a collective: only if all could read
      if problem is None:
        problem = self._agree(self._verify(restored))
      if problem is None:
        return restored.state, restored.meta
      where = f'checkpoint step {candidate} in {self.directory} {problem}'
      if step is not None or i + 1 == len(candidates):
        raise ConfigError(where + ('' if step is not None else '; no older one is good'))
      print(f'warning: {where}; using step {candidates[i + 1]}', file=sys.stderr, flush=True)
    raise AssertionError('unreachable')

  @staticmethod
  def policy_state(meta: Mapping[str, Any], template: Any) -> Any:
    """The policy state saved with a checkpoint, in the structure of ``template`` (the
    policy's ``init()``), or None if the checkpoint holds none.

    Raises:
      ConfigError: a saved state that does not fit the template (another policy saved it).
    """
    saved = meta.get('policy')
    return None if saved is None else decode_state(template, saved)

  def hook(self, meta: Mapping[str, Any], every: int) -> Hook:
    """A loop hook that saves every ``every`` steps and after the last one, the policy's
    state included."""
    def save(info: StepInfo) -> None:
      if info.step not in self._manager.all_steps():
        self.save(info.state, meta, info.policy_state)

    return Hook(save, every=every, at_end=True)

  def wait(self) -> None:
    """Blocks until every started save is on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def _read(self, step: int, abstract_state: TrainState) -> tuple[Any, str | None]:
    """Checkpoint ``step`` as read by this process, or why it does not read back.

    Read by orbax's handler, not the manager: the manager's restore ends in a barrier across
    processes, where a process whose read succeeded would wait for one whose read failed while
    that one waits in `_agree` for its verdict.
    """
    handler = ocp.CompositeCheckpointHandler()
    try:
      path = epath.Path(self._manager.directory) / self._names.build_name(step)
      return handler.restore(path, ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())), None
    except Exception as e:  # corrupt files fail in many ways; the caller names the step
      return None, f'is unreadable ({_first_line(e)})'
    finally:
      handler.close()

  @staticmethod
  def _verify(restored: Any) -> str | None:
    saved = restored.meta.get('checksums')
    if saved is None:  # saved before checkpoints had checksums
      return None
    difference = first_difference(saved, checksums(restored.state))
    return None if difference is None else f'failed verification ({difference})'

  def _agree(self, problem: str | None) -> str | None:
    """This process's problem with this attempt, else another's (naming it), else None.

    In a job of several processes each one publishes its verdict before reading the others',
    so none waits for a process that failed; a single process needs no coordination service
    and uses none.
    """
    if jax.process_count() == 1:
      return problem
    _ROUNDS[self.directory] += 1  # as given: every process names the directory alike
    channel = Channel(f'hetjax/checkpoint:{self.directory}/round{_ROUNDS[self.directory]}')
    channel.set(f'process{jax.process_index()}', problem)
    if problem is not None:
      return problem
    for process in range(jax.process_count()):
      try:
        theirs = channel.get(f'process{process}', AGREE_TIMEOUT_S)
      except Exception:  # a process gone or stuck: no verdict to agree on
        raise ConfigError(f'restoring from {self.directory}: process {process} did not say '
                          f'whether it read the checkpoint within {AGREE_TIMEOUT_S:.0f} s') \
            from None
      if theirs is not None:
        return f'{theirs} in process {process}'
    return None

  def _require(self, step: int | None) -> int:
    if step is None:
      step = self.latest_step()
    if step is None or step not in self._manager.all_steps():
      raise ConfigError(f'no complete checkpoint{"" if step is None else f" at step {step}"} '
                        f'in {self.directory}')
    return step


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def _barriers_for_unequal_workers() -> None:
  """Orbax's default barrier is a JAX collective that lays the devices out as a (processes x
  local devices) grid (`jax.experimental.multihost_utils`), which fails for workers of different
  device counts (``launch --devices 2,1,1``: "cannot reshape array of size 4 into shape (3,2)").
  Its barrier on the coordination service does not, so such a job turns that one on (set as if
  given on the command line: orbax reads it as an absl flag, parsed or not)."""
  counts = {sum(d.process_index == p for d in jax.devices()) for p in range(jax.process_count())}
  if len(counts) > 1:
    flag = flags.FLAGS['experimental_orbax_use_distributed_barrier']
    flag.value, flag.present = True, max(flag.present, 1)
