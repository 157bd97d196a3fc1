"""A worker of tests/test_pipeline_multiprocess.py: one pipeline whose stages span the processes.

  python tests/workers/pipeline_stages.py OUT_DIR STAGES MICRO_BATCHES SGD_STEPS

Every worker builds the same `PipelineTrainer` over all processes' devices, computes the
gradients of step 0's batch under GPipe and under 1F1B, then takes SGD_STEPS optimizer steps. It
writes ``OUT_DIR/w{worker}.npz``: its local stages, its stages' initial parameters
(``init/<path>``), gradients (``grads/<schedule>/<path>``) and final parameters
(``params/<path>``), the losses (``loss/<schedule>``, ``sgd_loss/<step>``) if it owns the last
stage, and the `ConfigError` of a one-stage pipeline over all processes (``straddle``).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
from flax import traverse_util

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

SMALL = {'d_model': 32, 'heads': 4, 'layers': 2, 'mlp': 64, 'seq_len': 16}  # 4 links
BATCH = 16
LR = 0.1
SCHEDULES = ('gpipe', '1f1b')


def flat(tree: dict, prefix: str) -> dict:
  """``{prefix/a/b: array}`` for a nested pure dict."""
  return {'/'.join([prefix, *map(str, k)]): np.asarray(v)
          for k, v in traverse_util.flatten_dict(tree).items()}


def main(out_dir: str, stages: int, micro: int, sgd_steps: int) -> None:
  from hetjax import runtime

  ctx = runtime.initialize(init_timeout_s=60)

  import jax
  import optax

  from hetjax import ConfigError, models
  from hetjax.pipeline import PipelineTrainer, gpipe, one_f_one_b

  task = models.make_task('transformer', **SMALL)
  out: dict[str, np.ndarray] = {}
  try:
    PipelineTrainer(task, optax.sgd(LR), BATCH, stages=1)
  except ConfigError as e:
    out['straddle'] = np.asarray(str(e))

  trainer = PipelineTrainer(task, optax.sgd(LR), BATCH, stages=stages, micro_batches=micro)
  local = trainer.local_stages
  assert set(trainer.programs) == set(local), (trainer.programs, local)
  owns_last = stages - 1 in local
  out['stages'] = np.asarray(local, dtype=np.int32)
  state = trainer.init_state()
  assert all((p is None) == (s not in local) for s, p in enumerate(state.params))
  out |= flat(trainer.merge_tree(state.params), 'init')

  host = trainer.global_batch_at(0)
  for name, build in zip(SCHEDULES, (gpipe, one_f_one_b), strict=True):
    grads, loss = trainer.gradients(state, host, build(stages, micro))
    assert (loss is not None) == owns_last, (ctx.worker, loss)
    for s, g in enumerate(grads):
      assert (g is None) == (s not in local), (ctx.worker, s)
      if g is not None:
        devices = {d for leaf in jax.tree.leaves(g) for d in leaf.sharding.device_set}
        assert devices == set(trainer.meshes[s].devices.flat), (s, devices)
    out |= flat(trainer.merge_tree(grads), f'grads/{name}')
    if owns_last:
      out[f'loss/{name}'] = np.asarray(loss)

  for step in range(sgd_steps):
    state, loss = trainer.train_step(state, trainer.global_batch_at(step))
    if owns_last:
      out[f'sgd_loss/{step}'] = np.asarray(loss)
  if sgd_steps:
    out |= flat(trainer.merge_tree(state.params), 'params')
  np.savez(pathlib.Path(out_dir) / f'w{ctx.worker}.npz', **out)


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
