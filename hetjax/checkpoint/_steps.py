"""`StepCheckpointer`: what every checkpointer shares — orbax step directories of a ``state``
and a ``meta`` item, the record, and a restore that verifies the checksums and skips a bad
latest checkpoint.

A checkpoint is an orbax step directory::

  DIRECTORY/STEP/state/...        the arrays: orbax's format (`Checkpointer`) or
                                  ``NAME.npz`` files (`ArraysCheckpointer`)
  DIRECTORY/STEP/meta/metadata    the record (`hetjax.checkpoint._record`), JSON

written into a temporary directory and renamed when complete (orbax's
``AtomicRenameTemporaryPath``), old steps deleted only after a newer one is complete. The
subclasses say how the ``state`` item is written and read and who writes it: every process of
the job (`Checkpointer`, `hetjax.pipeline.StageCheckpointer`) or this process alone
(`ArraysCheckpointer` with ``alone``: a pipeline replica, a parameter server).
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
from etils import epath

from hetjax._errors import ConfigError
from hetjax.checkpoint import _fit, _record
from hetjax.checkpoint._drain import draining_event_loops
from hetjax.runtime import Channel
from hetjax.train import Hook, StepInfo

if TYPE_CHECKING:
  import orbax.checkpoint as ocp

AGREE_TIMEOUT_S = 300.0  # how long a process waits for the others' verdict on a checkpoint
# Rounds on the coordination service so far per checkpoint directory, the same count in every
# process of a job (they save and restore in lockstep), so that each round's keys are new.
_ROUNDS: collections.Counter[str] = collections.Counter()


def orbax() -> Any:
  """``orbax.checkpoint``, imported when a checkpointer first needs it: importing orbax
  configures Python's root logger (an absl log call at its import runs ``logging.basicConfig``)
  and so changes how every later warning of the process prints; importing `hetjax.checkpoint`,
  `hetjax.pipeline` or `hetjax.ps` does not."""
  import orbax.checkpoint as ocp
  return ocp


class StepCheckpointer:
  """The shared part of the checkpointers (module docstring); subclasses add `save` and say
  how the ``state`` item is read (`_restore_args`), checked (`_verify`) and placed (`_finish`).

  Args:
    directory: where the step directories are.
    manager: the orbax manager of ``directory`` (its options say who writes).
    names: the manager's step name format.
    agree: the processes of a job restore one checkpoint together: each reports its verdict
      on every attempt on the coordination service and all skip if any failed. False: this
      process decides alone.
    fallback: a bad latest checkpoint is skipped for the one before it. False: it is a
      `ConfigError` (processes that must restore the same step but cannot agree on one).
  """

  def __init__(self, directory: str | os.PathLike, manager: ocp.CheckpointManager,
               names: ocp.step.NameFormat, *, agree: bool, fallback: bool = True):
    self.directory = os.fspath(directory)
    self._manager, self._names = manager, names
    self._agree_in_job, self._fallback = agree, fallback

  # -- the protocol ------------------------------------------------------------------------------

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or ``None``."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, state: Any, meta: Mapping[str, Any], policy_state: Any = None) -> None:
    raise NotImplementedError

  def read_meta(self, step: int | None = None) -> dict[str, Any]:
    """The record of checkpoint ``step`` (default: the latest) without loading arrays.

    Raises:
      ConfigError: no such checkpoint, or its record does not read back (one line).
    """
    step, ocp = self._require(step), orbax()
    handler = ocp.CompositeCheckpointHandler()
    try:
      return handler.restore(self._path(step), ocp.args.Composite(meta=ocp.args.JsonRestore())
                             ).meta
    except Exception as e:  # a corrupt record: one line, not orbax's traceback
      raise ConfigError(f'the record of checkpoint step {step} in {self.directory} is '
                        f'unreadable ({_first_line(e)})') from None
    finally:
      handler.close()

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Loads checkpoint ``step`` (default: the latest good one) into the layout of
    ``abstract_state``, and its record.

    A checkpoint is good if its files read back (flipped bytes, a truncated file: a decode
    error, DATA_LOSS, a bad zip CRC, …) and the restored arrays have the checksums in its
    record (one without any, saved before there were checksums, is not checked). A bad latest
    one is skipped with one warning line naming it and why, and the one before it is used::

      warning: checkpoint step 2 in ckpt failed verification (leaf 'params/w' checksum
      differs); using step 1

    Where the processes of a job restore together (``agree``) every process reports each
    attempt on the coordination service and all skip if any failed, so they resume from the
    same step.

    A checkpoint that fails because its record lists other leaves or shapes than
    ``abstract_state`` (the model changed since it was saved, `_refuse_other_tree`) is not
    skipped: the run's older checkpoints hold the same tree. The restore stops at once::

      checkpoint step 30 in runs/mine/checkpoints holds other parameters than this model (was
      the model changed since it was saved?): 2 not in the checkpoint ('params/l3/bias' [1];
      'params/l3/kernel' [1, 1]); 1 changed ('params/l1/kernel' [8, 16] saved, [8, 32] now);
      the run's older checkpoints hold the same, so none is restored

    Raises:
      ConfigError: no complete checkpoint, the asked ``step`` bad, none good, one of another
        tree, or (without ``fallback``) the latest bad (one line naming the checkpoint).
    """
    candidates = [self._require(step)] if step is not None else \
        sorted(self._manager.all_steps(), reverse=True) or [self._require(None)]
    for i, candidate in enumerate(candidates):
      restored, problem = self._read(candidate, abstract_state)
      problem = self._agree(problem)  # a checksum may be a collective: only if all could read
      if problem is None:
        self._check(candidate, restored.meta)
        problem = self._agree(self._verify(restored.state, restored.meta, abstract_state))
      if problem is None:
        return self._finish(restored.state, restored.meta, abstract_state), restored.meta
      self._refuse_other_tree(candidate, abstract_state)  # another model's: older ones too
      where = f'checkpoint step {candidate} in {self.directory} {problem}'
      if step is not None:
        raise ConfigError(where)
      if not self._fallback:
        raise ConfigError(f'{where}; {self._no_fallback_reason()}')
      if i + 1 == len(candidates):
        raise ConfigError(f'{where}; no older one is good')
      print(f'warning: {where}; using step {candidates[i + 1]}', file=sys.stderr, flush=True)
    raise AssertionError('unreachable')

  @staticmethod
  def policy_state(meta: Mapping[str, Any], template: Any) -> Any:
    """The policy state saved with a checkpoint, in the structure of ``template`` (the
    policy's ``init()``), or None if the checkpoint holds none.

    Raises:
      ConfigError: a saved state that does not fit the template (another policy saved it).
    """
    return _record.policy_state(meta, template)

  def hook(self, meta: Mapping[str, Any], every: int) -> Hook:
    """A loop hook that saves every ``every`` steps and after the last one, the policy's
    state included.

    A background save (`Checkpointer`'s default) is written while the next step runs, and that
    step's hook waits until it is committed: so a job that fails at any later step loses at
    most ``every`` steps, as with saves that complete before the next step, while the write
    still overlaps one step's compute.
    """
    started: list[int] = []

    def save(info: StepInfo) -> None:
      if started:  # the step after a save: on disk before the loop goes further
        self._manager.wait_until_finished()
        started.clear()
      due = info.step % every == 0 or info.step == info.until
      if due and info.step not in self._manager.all_steps():
        self.save(info.state, meta, info.policy_state)
        started.append(info.step)

    return Hook(save, every=1)

  def wait(self) -> None:
    """Blocks until every started save is on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  # -- for the subclasses ------------------------------------------------------------------------

  def _restore_args(self, abstract_state: Any) -> ocp.args.CheckpointArgs:
    """How the ``state`` item is read for ``abstract_state``."""
    raise NotImplementedError

  def _check(self, step: int, meta: Mapping[str, Any]) -> None:
    """Raises `ConfigError` if checkpoint ``step`` (record ``meta``) cannot be this state's."""

  def _verify(self, state: Any, meta: Mapping[str, Any], abstract_state: Any) -> str | None:
    """Why the ``state`` item as read is not what was saved (`_record.verify`), or None."""
    raise NotImplementedError

  def _finish(self, state: Any, meta: Mapping[str, Any], abstract_state: Any) -> Any:
    """The restored state from the ``state`` item as read."""
    return state

  def _no_fallback_reason(self) -> str:
    return 'an older one is not restored in its place'

  def _round(self, what: str) -> Channel:
    """A new namespace on the coordination service for one round of this directory's
    processes (every process of the job must call this alike)."""
    _ROUNDS[self.directory] += 1  # as given: every process names the directory alike
    return Channel(f'hetjax/checkpoint:{self.directory}/{what}{_ROUNDS[self.directory]}')

  def _path(self, step: int) -> epath.Path:
    return epath.Path(self._manager.directory) / self._names.build_name(step)

  def _read(self, step: int, abstract_state: Any) -> tuple[Any, str | None]:
    """Checkpoint ``step`` as read by this process, or why it does not read back.

    Read by orbax's handler, not the manager: the manager's restore ends in a barrier across
    processes, where a process whose read succeeded would wait for one whose read failed while
    that one waits in `_agree` for its verdict.
    """
    ocp = orbax()
    handler = ocp.CompositeCheckpointHandler()
    try:
      with draining_event_loops():  # a failed read leaves no read running behind it
        return handler.restore(self._path(step), ocp.args.Composite(
            state=self._restore_args(abstract_state), meta=ocp.args.JsonRestore())), None
    except Exception as e:  # corrupt files fail in many ways; the caller names the step
      return None, f'is unreadable ({_first_line(e)})'
    finally:
      handler.close()

  def _refuse_other_tree(self, step: int, abstract_state: Any) -> None:
    """Raises `ConfigError` if checkpoint ``step``, which failed to restore, holds a tree of
    other leaves, shapes or dtypes than ``abstract_state`` by its record (`_fit.difference`):
    the model or optimizer changed since it was saved, and no older step of the run fits
    either. A record that does not read back or lists no checksums says nothing: the step is
    then bad, and may be skipped. Processes restoring together agree (`_agree`): a process
    that holds only some stages may be the only one to see the difference.
    """
    try:
      saved = self.read_meta(step).get('checksums')
    except ConfigError:
      saved = None
    difference = self._agree(None if saved is None else _fit.difference(saved, abstract_state))
    if difference is not None:
      raise ConfigError(f'checkpoint step {step} in {self.directory} {difference}; the run\'s '
                        'older checkpoints hold the same, so none is restored')

  def _agree(self, problem: str | None) -> str | None:
    """This process's problem with this attempt, else another's (naming it), else None.

    In a job of several processes restoring together each one publishes its verdict before
    reading the others', so none waits for a process that failed; a process deciding alone
    needs no coordination service and uses none.
    """
    if not self._agree_in_job or jax.process_count() == 1:
      return problem
    channel = self._round('round')
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
