"""A worker of tests/test_workers.py: trains 5 steps with given shares, writes the losses.

  python tests/workers/train_shares.py OUT.json MODEL LOCAL_SHAPE SHARES_JSON [STRATEGY [BUCKET
      [ACCUMULATE]]]

With a BUCKET, new share sizes may run as sums of piece programs while their own compile in
the background (which of the two happens depends on timing; both must give the same numbers).
With ACCUMULATE, each worker computes its share in micro-batches (a bucket of 0: none).
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import runtime

ctx = runtime.initialize(init_timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from hetjax import models  # noqa: E402
from hetjax.core import Work  # noqa: E402
from hetjax.train import Strategy, WorkerTrainer  # noqa: E402
from tests.workers.common import MODELS, OPTIMIZER, STEPS  # noqa: E402

out, name, local_shape, schedule = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
strategy = Strategy(sys.argv[5] if len(sys.argv) > 5 else 'data_parallel')
bucket = int(sys.argv[6]) if len(sys.argv) > 6 and int(sys.argv[6]) else None
accumulate = int(sys.argv[7]) if len(sys.argv) > 7 else 1
kwargs, batch = MODELS[name]
trainer = WorkerTrainer(models.make_task(name, **kwargs), OPTIMIZER, batch,
                        local_shape=tuple(int(x) for x in local_shape.split('x')),
                        rules=strategy.rules(), bucket=bucket, accumulate=accumulate)
state, losses = trainer.init_state(), []
for step in range(STEPS):
  work = Work(step, trainer.global_batch_at(step))
  state, stats = trainer.step(state, work, tuple(schedule[step % len(schedule)]))
  losses.append(float(stats.loss))
trainer.close()
params = [np.asarray(x).tolist() for x in jax.tree.leaves(trainer.local_view(state.params))]
if ctx.is_chief:
  pathlib.Path(out).write_text(json.dumps({'losses': losses, 'params': params}))
