"""A worker of tests/test_tokens.py: 5 token-scheduled steps of the small MLP on hosts of known
speed (0.1 ms per row, slowed by the launcher's trace).

  python tests/workers/train_tokens.py OUT.json TOKEN_ROWS   (with HETJAX_SLOWDOWN set)

The chief writes the losses, the final parameters, the rows every worker did per step (from
the steps' stats) and every worker's compile count.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import emulation, runtime

ctx = runtime.initialize(init_timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from hetjax import models  # noqa: E402
from hetjax.train import TokenRules, TokenTrainer, training_steps  # noqa: E402
from tests.workers.common import MODELS, OPTIMIZER, STEPS  # noqa: E402

out, token_rows = sys.argv[1], int(sys.argv[2])
kwargs, batch = MODELS['mlp']
trace = emulation.parse_trace(ctx.slowdown or 'none', ctx.workers)
host = emulation.KnownSpeedHost(trace, ctx.worker, row_s=1e-4)
channel = runtime.Channel('test-tokens')
rules = TokenRules(batch, token_rows)
trainer = TokenTrainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch, rules, channel,
                       host=host)
state, losses, rows = trainer.init_state(), [], []
for info in training_steps(trainer, state, STEPS, policy=rules):
  state = info.state
  losses.append(float(info.stats.loss))
  rows.append(list(info.stats.rows))
trainer.close()
channel.set(f'compiles/{ctx.worker}', trainer.compiles)
params = [np.asarray(x).tolist() for x in jax.tree.leaves(trainer.local_view(state.params))]
if ctx.is_chief:
  compiles = [channel.get(f'compiles/{w}') for w in range(ctx.workers)]
  pathlib.Path(out).write_text(json.dumps({
      'losses': losses, 'params': params, 'rows': rows,
      'compiles': compiles}))
channel.barrier('done')  # the chief reads every worker's count before anyone leaves
