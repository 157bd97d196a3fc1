"""Orbax checkpoints of the train state plus a JSON record of everything needed to resume."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import flags

from hetjax._errors import ConfigError
from hetjax.core import decode_state, encode_state
from hetjax.train import Hook, StepInfo, TrainState


class Checkpointer:
  """Saves and restores `TrainState` with orbax, atomically.

  A checkpoint is one orbax step directory holding two items: ``state`` (the arrays) and
  ``meta`` (JSON: task, data position, and room for plan and shares). Orbax writes a step into
  a temporary directory and renames it when complete, so a process killed during a save leaves
  no step that `latest_step` would return; unfinished temporaries are ignored.

  Restoring takes an abstract target (`Trainer.abstract_state`) whose shardings may differ from
  the ones saved: a run saved on a 4x2 mesh restores onto 8x1 or onto one device.

  Example::

    ckpt = Checkpointer(workdir / 'checkpoints')
    ckpt.save(state, meta={'task': 'mlp'})
    state, meta = ckpt.restore(trainer.abstract_state())
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3):
    self.directory = os.fspath(directory)
    _barriers_for_unequal_workers()
    self._manager = ocp.CheckpointManager(
        os.path.abspath(self.directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or ``None``."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, state: TrainState, meta: Mapping[str, Any], policy_state: Any = None) -> None:
    """Starts saving ``state`` at its step (asynchronously; the arrays are copied first).

    ``policy_state`` (a policy's state after that step, e.g. the LB-BSP shares and predictor
    history) is saved in the JSON record under ``'policy'`` (`hetjax.core.encode_state`);
    `policy_state` reads it back.
    """
    step = int(state.step)
    meta = {**meta, 'step': step}
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
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
      raise ConfigError(f'the record of checkpoint step {step} in {self.directory} is '
                        f'unreadable ({reason})') from None

  def restore(
      self, abstract_state: TrainState, step: int | None = None
  ) -> tuple[TrainState, dict[str, Any]]:
    """Loads checkpoint ``step`` (default: the latest readable one) into the layout of
    ``abstract_state``.

    A checkpoint whose files do not read back (flipped bytes, a truncated file: orbax and
    tensorstore fail with DATA_LOSS, a decode error, …) is skipped with one warning line naming
    it, and the one before it is used — in a single process. In a job of several processes a
    process cannot skip alone (they would resume from different steps): the unreadable step is
    a one-line `ConfigError` instead of orbax's traceback.

    Raises:
      ConfigError: no complete checkpoint, the asked ``step`` unreadable, or none readable.
    """
    candidates = [self._require(step)] if step is not None else \
        sorted(self._manager.all_steps(), reverse=True) or [self._require(None)]
    for i, candidate in enumerate(candidates):
      try:
        restored = self._manager.restore(
            candidate,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        return restored.state, restored.meta
      except Exception as e:  # corrupt files fail in many ways; ConfigError below names it
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        where = f'checkpoint step {candidate} in {self.directory} is unreadable ({reason})'
        if step is not None or jax.process_count() > 1 or i + 1 == len(candidates):
          more = '' if step is not None or jax.process_count() > 1 else '; no older one reads'
          raise ConfigError(where + more) from None
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

  def _require(self, step: int | None) -> int:
    if step is None:
      step = self.latest_step()
    if step is None or step not in self._manager.all_steps():
      raise ConfigError(f'no complete checkpoint{"" if step is None else f" at step {step}"} '
                        f'in {self.directory}')
    return step


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
