"""Checkpoints of a pipeline whose stages live on different processes: one file per stage.

Orbax's array format refuses arrays that live on one process of several ("Cannot serialize
host local jax.Array"), and a stage of a grouped plan lives on its group's processes only. So
each stage is saved on its own, into one orbax step directory that every process of the job
writes together (`hetjax.checkpoint.ArraysCheckpointer`): every process of a stage gathers
the stage's parameters and optimizer state (a jitted identity onto the stage's mesh,
replicated: all of them take part), and the stage's first process writes
``STEP/state/stage-S.npz`` (the leaves in `jax.tree` order) and computes the stage's
checksums on that copy. Process 0 writes the record ``STEP/meta`` (the same as
`hetjax.checkpoint.Checkpointer`'s: every stage's checksums, the policy state, and the links
each stage covers under ``'stages'``); orbax renames the directory once every process has
written, so a step is complete or absent.

Restoring, each process reads its own stages' files, checks their checksums and places every
leaf on the target's sharding (`jax.make_array_from_callback`), so a stage may come back on
another layout of the same devices or not — but the stages must cover the same links as when
saved. The processes agree on every attempt: a bad latest checkpoint (in any stage) is
skipped by all of them for the one before it, with one warning line.

Example (every process)::

  ckpt = StageCheckpointer(workdir / 'checkpoints', trainer)
  for info in training_steps(trainer, state, 100, [ckpt.hook(meta, every=50)]):
    state = info.state
  state, meta = ckpt.restore(trainer.abstract_state())
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.checkpoint import ArraysCheckpointer
from hetjax.pipeline._executor import PipelineState, PipelineTrainer


class StageCheckpointer(ArraysCheckpointer):
  """The `hetjax.checkpoint.CheckpointerProtocol` for a `PipelineTrainer` over processes.

  Args:
    directory: where the step directories go (the same path on every process).
    trainer: the pipeline (its stages, meshes and processes).
    barrier: unused: orbax synchronizes the processes on the coordination service. (Accepted
      while callers still pass the job's ``channel.barrier``.)
    max_to_keep: complete steps kept; older ones are deleted once a newer one is complete.
  """

  def __init__(self, directory: str | os.PathLike, trainer: PipelineTrainer,
               barrier: Callable[[str], None] | None = None, *, max_to_keep: int = 3):
    del barrier
    super().__init__(directory, alone=False, max_to_keep=max_to_keep)
    self.trainer = trainer
    self._ranges = [list(r) for r in trainer.ranges]

  def save(self, state: PipelineState, meta: Mapping[str, Any], policy_state: Any = None
           ) -> None:
    """Writes step ``state.step`` (every process calls this; module docstring)."""
    super().save(state, {**meta, 'stages': self._ranges}, policy_state)

  def _parts(self, state: PipelineState) -> dict[str, PipelineState]:
    trainer, me, parts = self.trainer, jax.process_index(), {}
    for s in trainer.local_stages:
      replicated = NamedSharding(trainer.meshes[s], PartitionSpec())
      whole = jax.jit(lambda t: t, out_shardings=replicated)((state.params[s],
                                                                state.opt_state[s]))
      if trainer.processes[s][0] == me:
        params, opt_state = jax.tree.map(lambda leaf: np.asarray(leaf.addressable_data(0)), whole)
        parts[f'stage-{s}'] = self._only(state.step, s, params, opt_state)
    return parts

  def _targets(self, abstract_state: PipelineState) -> dict[str, PipelineState]:
    return {f'stage-{s}': self._only(abstract_state.step, s, abstract_state.params[s],
                                     abstract_state.opt_state[s])
            for s in self.trainer.local_stages}

  def _join(self, parts: Mapping[str, PipelineState], abstract_state: PipelineState,
            meta: Mapping[str, Any]) -> PipelineState:
    params, opt_state = list(abstract_state.params), list(abstract_state.opt_state)
    for s in self.trainer.local_stages:
      part = parts[f'stage-{s}']
      params[s], opt_state[s] = part.params[s], part.opt_state[s]
    return PipelineState(int(meta['step']), tuple(params), tuple(opt_state))

  def _check(self, step: int, meta: Mapping[str, Any]) -> None:
    if meta.get('stages') != self._ranges:
      raise ConfigError(f'checkpoint {step} in {self.directory} was saved with stages over links '
                        f'{meta.get("stages")}; this run\'s stages cover {self._ranges}')

  def _only(self, step: int, s: int, params: Any, opt_state: Any) -> PipelineState:
    """The state with stage ``s``'s values only (the others None): its leaves' paths are the
    whole state's (``'params/1/…'``), so each stage's checksums fit in one record."""
    none = (None,) * self.trainer.stages
    return PipelineState(step, (*none[:s], params, *none[s + 1:]),
                         (*none[:s], opt_state, *none[s + 1:]))
