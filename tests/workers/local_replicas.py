"""A worker of tests/test_local_replicas.py: runs of mode pipeline's replicas, one after another.

  python tests/workers/local_replicas.py OUT_DIR

Each run is `hetjax.run.train` of `CONFIG` with its own overrides (`RUNS`), in OUT_DIR/NAME: one
launch pays the start-up once, and each run has its own keys on the coordination service (its
channel is named by its run directory). After the run ``half`` worker 0 copies its directory to
``resumed`` (a run directory of its own, so its keys are fresh too), which then resumes to the
step ``whole`` ran to in one go.
"""

import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import run, runtime

ctx = runtime.initialize(init_timeout_s=60)

#: Two 2-stage replicas of the small MLP (each worker's 2 devices), a loss line every step.
CONFIG = ['mode=pipeline', 'model.args.hidden=32', 'model.args.width=16', 'data.global_batch=32',
          'pipeline.sync=periodic-average', 'logging.every=1']
#: Periodic averaging every 10 steps (the policy's default ``every``), and local SGD of 10
#: steps a round under outer SGD at rate 1; DiLoCo's Nesterov outer step every 4 steps, in one
#: go and stopped at step 4 (a round's end, checkpointed).
RUNS = {
    'average': ['optimizer.steps=20', 'checkpoint.every=10'],
    'sgd1': ['optimizer.steps=20', 'checkpoint.every=10', 'local.inner_steps=10',
             'local.outer=sgd', 'local.outer_lr=1.0'],
    'whole': ['optimizer.steps=8', 'checkpoint.every=4', 'local.inner_steps=4'],
    'half': ['optimizer.steps=4', 'checkpoint.every=4', 'local.inner_steps=4'],
}


def main(out: pathlib.Path) -> None:
  base = run.override(run.load_config('mlp'), CONFIG)
  for name, sets in RUNS.items():
    run.train(run.override(base, sets), out / name)
  channel = runtime.Channel(f'local-replicas-test/{out}')
  channel.barrier('half-done')
  if ctx.is_chief:
    shutil.copytree(out / 'half', out / 'resumed')
  channel.barrier('copied')
  run.train(run.override(base, RUNS['whole']), out / 'resumed', resume=True)


if __name__ == '__main__':
  main(pathlib.Path(sys.argv[1]))
