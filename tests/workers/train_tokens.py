"""A worker of tests/test_tokens.py: 5 token-scheduled steps of the small MLP, under a slowdown.

  python tests/workers/train_tokens.py OUT.json TOKEN_ROWS   (with HETJAX_SLOWDOWN set)

The chief writes the losses, the final parameters, the rows every worker did per step (from
the shared history) and every worker's compile count.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import runtime

ctx = runtime.initialize(init_timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import models  # noqa: E402
from hetjax.train import WorkerTrainer  # noqa: E402
from hetjax.train._tokens import TokenRules, token_steps  # noqa: E402
from tests.workers.common import MODELS, OPTIMIZER, STEPS  # noqa: E402

out, token_rows = sys.argv[1], int(sys.argv[2])
kwargs, batch = MODELS['mlp']
trainer = WorkerTrainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch)
trace = runtime.parse_slowdown(ctx.slowdown or 'none', ctx.workers)
dilation = runtime.TimeDilation(trace, ctx.worker)
channel = runtime.Channel('test-tokens')
rules = TokenRules(batch, token_rows, trainer.local_batch_degree)
state, losses, history = trainer.init_state(), [], []
for info in token_steps(trainer, state, STEPS, rules, channel, dilation, history=history):
  state = info.state
  losses.append(float(info.metrics['loss']))
trainer.close()
channel.set(f'compiles/{ctx.worker}', trainer.compiles)
params = [np.asarray(x).tolist() for x in jax.tree.leaves(trainer.local_view(state.params))]
if ctx.is_chief:
  compiles = [channel.get(f'compiles/{w}') for w in range(ctx.workers)]
  pathlib.Path(out).write_text(json.dumps({
      'losses': losses, 'params': params, 'rows': [list(h.shares) for h in history],
      'compiles': compiles}))
channel.barrier('done')  # the chief reads every worker's count before anyone leaves
