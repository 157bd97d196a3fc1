"""SDPipe: pipeline replicas, one per worker, averaging each stage within the groups that a
central scheduler forms from the replicas that are ready. Run it under the launcher:

  .venv/bin/python -m hetjax.launch --workers 2 --devices-per-worker 2 --timeout 300 -- \\
      .venv/bin/python examples/sdpipe_replicas.py

Each worker is one replica (a 2-stage pipeline of the MLP on its own 2 devices); worker 0 also
runs the group scheduler in a thread. The lines between the markers are docs/pipeline.md's snippet.
`experiments/train.py --mode=pipeline --sync=sdpipe` under the launcher runs the same, with
checkpoints (the scheduler's state in them), ``--resume`` and ``--slowdown``.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# --- docs/pipeline.md snippet: start
import jax
import optax

from hetjax import models, runtime
from hetjax.pipeline import PipelineTrainer
from hetjax.replicas import ReplicaDriver, SyncClient, SyncPolicy, start_service

ctx = runtime.initialize()                             # one process per replica
channel = runtime.Channel('run0')
task = models.make_task('mlp', hidden=64, width=32)
trainer = PipelineTrainer(task, optax.sgd(0.05, momentum=0.9), 64, stages=2,
                          devices=jax.local_devices())
if ctx.is_chief:                                       # worker 0 runs the group scheduler
  service = start_service(channel, SyncPolicy('sdpipe', ctx.workers), 'run0')
driver = ReplicaDriver(trainer, SyncClient(channel, 'run0', ctx.worker), ctx.workers)
state, steps = driver.run(trainer.init_state(), steps=20)
print(f'replica {ctx.worker}: {len(steps)} steps, loss {steps[-1].loss:.4f}, '
      f'last group {steps[-1].members}')
# --- docs/pipeline.md snippet: end
if ctx.is_chief:
  service.join(60)
channel.barrier('done')
