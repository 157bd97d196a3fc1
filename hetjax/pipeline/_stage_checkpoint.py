"""Checkpoints of a pipeline whose stages live on different processes: one file per stage.

Orbax refuses arrays that live on one process of several ("Cannot serialize host local
jax.Array"), and a stage of a grouped plan lives on its group's processes only. So each stage
is saved on its own: every process of the stage gathers the stage's parameters and optimizer
state (a jitted identity onto the stage's mesh, replicated: all of them take part), and the
stage's first process writes ``STEP/stage-S.npz`` (the leaves in `jax.tree` order) into a
temporary directory. When every process has written (``barrier``), process 0 adds
``meta.json`` (the same record as `hetjax.checkpoint.Checkpointer`'s, the policy state under
``'policy'``) and renames the directory: a step is complete or absent. Restoring, each process
reads its own stages' files and places every leaf on the target's sharding
(`jax.make_array_from_callback`), so a stage may come back on another layout of the same
devices count or not — but the stages must cover the same links as when saved.

Example (every process)::

  ckpt = StageCheckpointer(workdir / 'checkpoints', trainer, barrier=channel.barrier)
  for info in training_steps(trainer, state, 100, [ckpt.hook(meta, every=50)]):
    state = info.state
  state, meta = ckpt.restore(trainer.abstract_state(step), step)
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.core import encode_state
from hetjax.pipeline._executor import PipelineState, PipelineTrainer
from hetjax.pipeline._step_directories import StepDirectories


class StageCheckpointer(StepDirectories):
  """`hetjax.checkpoint.Checkpointer`'s interface for a `PipelineTrainer` over processes.

  Args:
    directory: where the step directories go (the same path on every process).
    trainer: the pipeline (its stages, meshes and processes).
    barrier: ``barrier(name)`` returns once every process called it with ``name`` (the job's
      `hetjax.runtime.Channel.barrier`); a no-op in one process.
    max_to_keep: complete steps kept; older ones are deleted once a newer one is complete.
  """

  def __init__(self, directory: str | os.PathLike, trainer: PipelineTrainer,
               barrier: Callable[[str], None] = lambda name: None, *, max_to_keep: int = 3):
    super().__init__(directory, max_to_keep)
    self.trainer, self.barrier = trainer, barrier
    self._ranges = [list(r) for r in trainer.ranges]

  def save(self, state: PipelineState, meta: Mapping[str, Any], policy_state: Any = None
           ) -> None:
    """Writes step ``state.step`` (every process calls this; module docstring)."""
    step, trainer, me = int(state.step), self.trainer, jax.process_index()
    temporary = os.path.join(self.directory, f'.{step}.partial')
    os.makedirs(temporary, exist_ok=True)
    for s in trainer.local_stages:
      whole = jax.jit(lambda t: t, out_shardings=NamedSharding(trainer.meshes[s],
                                                               PartitionSpec()))(
          (state.params[s], state.opt_state[s]))
      if trainer.processes[s][0] == me:
        leaves = [np.asarray(leaf.addressable_data(0)) for leaf in jax.tree.leaves(whole)]
        np.savez(os.path.join(temporary, f'stage-{s}.npz'), *leaves)
    self.barrier(f'checkpoint-{step}-written')
    if me == 0:
      record = {**meta, 'step': step, 'stages': self._ranges}
      if policy_state is not None:
        record['policy'] = encode_state(policy_state)
      with open(os.path.join(temporary, 'meta.json'), 'w') as f:
        json.dump(record, f)
      final = os.path.join(self.directory, str(step))
      if os.path.exists(final):
        shutil.rmtree(final)
      os.rename(temporary, final)
      for old in self.all_steps()[:-self.max_to_keep]:
        shutil.rmtree(os.path.join(self.directory, str(old)))
    self.barrier(f'checkpoint-{step}-done')

  def restore(self, abstract_state: PipelineState, step: int | None = None
              ) -> tuple[PipelineState, dict]:
    """Checkpoint ``step`` (default: the latest) on ``abstract_state``'s shardings (this
    process's stages; ``None`` elsewhere)."""
    step = self._require(step)
    meta = self.read_meta(step)
    if meta.get('stages') != self._ranges:
      raise ConfigError(f'checkpoint {step} in {self.directory} was saved with stages over links '
                        f'{meta.get("stages")}; this run\'s stages cover {self._ranges}')
    params, opt_state = list(abstract_state.params), list(abstract_state.opt_state)
    for s in self.trainer.local_stages:
      target = (abstract_state.params[s], abstract_state.opt_state[s])
      leaves, treedef = jax.tree.flatten(target)
      with np.load(os.path.join(self.directory, str(step), f'stage-{s}.npz'),
                   allow_pickle=False) as saved:
        host = [saved[f'arr_{i}'] for i in range(len(saved.files))]
      if len(host) != len(leaves) or any(h.shape != a.shape
                                         for h, a in zip(host, leaves, strict=True)):
        raise ConfigError(f'checkpoint {step}: stage {s} does not fit this pipeline '
                          f'({len(host)} arrays saved, {len(leaves)} expected)')
      placed = [jax.make_array_from_callback(a.shape, a.sharding,
                                             lambda index, h=h, a=a: h[index].astype(a.dtype))
                for h, a in zip(host, leaves, strict=True)]
      params[s], opt_state[s] = treedef.unflatten(placed)
    return PipelineState(step, tuple(params), tuple(opt_state)), meta
