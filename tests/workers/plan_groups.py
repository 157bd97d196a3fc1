"""A worker of tests/test_planner_groups_multiprocess.py: a grouped plan across the processes.

  python tests/workers/plan_groups.py OUT_DIR MODEL PLAN_JSON MICRO_BATCHES

Every worker compiles the same plan (`hetjax.planner.compile_plan`: stages on the plan's groups
of workers, some spanning several processes), trains `STEPS` steps in the one loop and writes
``OUT_DIR/w{worker}.npz``: the stages it has devices in (``stages``), their final parameters
(``params/<path>``, from the first process of each stage) and, on worker 0, the losses.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))


def main(out_dir: str, model: str, plan_json: str, micro: int) -> None:
  from hetjax import runtime

  ctx = runtime.initialize(init_timeout_s=60)

  import jax

  from hetjax import models
  from hetjax.planner import Plan, compile_plan
  from hetjax.sharding import submodel_names
  from hetjax.train import training_steps
  from tests.workers.common import MODELS, OPTIMIZER, STEPS

  kwargs, batch = MODELS[model]
  task = models.make_task(model, **kwargs)
  plan = Plan.from_json(json.loads(plan_json), submodel_names(task.make_model))
  compiled = compile_plan(plan, task, OPTIMIZER, batch, micro_batches=micro)
  trainer = compiled.trainer
  losses, state = [], trainer.init_state()
  for info in training_steps(trainer, state, STEPS):
    state = info.state
    if ctx.is_chief:
      losses.append(float(info.stats.loss))
  out: dict[str, np.ndarray] = {'stages': np.asarray(trainer.local_stages, dtype=np.int32)}
  if ctx.is_chief:
    out['losses'] = np.asarray(losses)
  for s in trainer.local_stages:  # every process of a stage gathers; its first one writes
    whole = jax.jit(lambda t: t, out_shardings=jax.sharding.NamedSharding(
        trainer.meshes[s], jax.sharding.PartitionSpec()))(state.params[s])
    if trainer.processes[s][0] != ctx.worker:
      continue
    for name, tree in whole.items():
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key = '/'.join([*map(str, trainer.paths[name]), *(str(p.key) for p in path)])
        out[f'params/{key}'] = np.asarray(leaf.addressable_data(0))
  np.savez(pathlib.Path(out_dir) / f'w{ctx.worker}.npz', **out)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
