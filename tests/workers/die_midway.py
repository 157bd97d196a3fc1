"""A worker of tests/test_workers.py: trains; worker 1 kills itself at step 3."""

import os
import pathlib
import signal
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import runtime

ctx = runtime.initialize(init_timeout_s=30)

from hetjax import models  # noqa: E402
from hetjax.core import Work  # noqa: E402
from hetjax.train import WorkerTrainer  # noqa: E402
from tests.workers.common import MODELS, OPTIMIZER  # noqa: E402

kwargs, batch = MODELS['mlp']
trainer = WorkerTrainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch)
state = trainer.init_state()
shares = (batch // ctx.workers + batch % ctx.workers,) + (batch // ctx.workers,) * (ctx.workers - 1)
for step in range(1000):
  if step == 3 and ctx.worker == 1:
    os.kill(os.getpid(), signal.SIGKILL)
  state, _ = trainer.step(state, Work(step, trainer.global_batch_at(step)), shares)
