"""A worker of tests/test_local.py: local SGD with given shares, writes losses and parameters.

  python tests/workers/train_local.py OUT.json STEPS_PER_ROUND SHARES_JSON OUTER
    OUTER: 'sgd1' (outer SGD at rate 1: with one inner step a round, synchronous training)
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import runtime

ctx = runtime.initialize(init_timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from hetjax import models  # noqa: E402
from hetjax.core import Work  # noqa: E402
from hetjax.train import LocalTrainer  # noqa: E402
from tests.workers.common import MODELS, OPTIMIZER, STEPS  # noqa: E402

out, h, schedule = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
outer = {'sgd1': optax.sgd(1.0)}[sys.argv[4]]
kwargs, batch = MODELS['mlp']
trainer = LocalTrainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch, local_shape=(1, 1),
                       steps_per_round=h, outer=outer)
state, losses = trainer.init_state(), []
for step in range(STEPS * h):
  state, stats = trainer.step(state, Work(step, trainer.global_batch_at(step)),
                              tuple(schedule[step // h % len(schedule)]))
  if (step + 1) % h == 0:
    losses.append(float(stats.loss))
trainer.close()
params = [np.asarray(x).tolist() for x in jax.tree.leaves(trainer.local_view(state.params))]
if ctx.is_chief:
  pathlib.Path(out).write_text(json.dumps({'losses': losses, 'params': params}))
