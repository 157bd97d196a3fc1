"""A worker of tests/test_workers_unequal.py: data parallelism over workers of unequal devices.

  python tests/workers/train_unequal.py OUT_DIR

Launched with workers of different device counts (e.g. 2, 1 and 1). Every worker writes
``OUT_DIR/w{worker}.json`` with:

- ``counts``, ``degrees``, ``share_degree``: the device counts and local degrees it sees;
- ``fsdp_error``: the one-line error of a `WorkerTrainer` under FSDP (it splits parameters
  inside the 2-device worker);
- ``uniform`` and ``lbbsp``: `STEPS` steps of the mlp under `balance.Uniform` and under LB-BSP
  (bucket 4, hosts of known speed ``static:1,1,3``, a 2-device worker twice as fast per row):
  the losses, the shares of every step and this worker's copy of the final parameters, and
  whether every local device holds the same copy.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import runtime

ctx = runtime.initialize(init_timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from hetjax import (  # noqa: E402
  ConfigError,
  balance,
  emulation,
  models,
)
from hetjax.core import ShareRules  # noqa: E402
from hetjax.train import Strategy, WorkerTrainer, training_steps  # noqa: E402
from tests.workers.common import LBBSP_STEPS, MODELS, OPTIMIZER, STEPS  # noqa: E402

BUCKET = 4
# A 1-device host's seconds per row: 16 rows take 64 ms, well over the compute, and long enough
# that the new share's program (compiled in the background while the old shares run, before
# LB-BSP moves) is ready within a few steps on a loaded machine.
ROW_S = 4e-3

out = pathlib.Path(sys.argv[1])
kwargs, batch = MODELS['mlp']
task = models.make_task('mlp', **kwargs)
counts = tuple(sum(d.process_index == w for d in jax.devices()) for w in range(ctx.workers))


def train(policy, bucket=None, host=None, steps=STEPS):
  trainer = WorkerTrainer(task, OPTIMIZER, batch, bucket=bucket, host=host)
  losses, shares, state = [], [], trainer.init_state()
  for info in training_steps(trainer, state, steps, policy=policy):
    state = info.state
    losses.append(float(info.stats.loss))
    shares.append(list(info.stats.rows))
  trainer.close()
  leaves = jax.tree.leaves(state.params)
  same = all(np.array_equal(np.asarray(s.data), np.asarray(x.addressable_data(0)))
             for x in leaves for s in x.addressable_shards)
  params = [np.asarray(x.addressable_data(0)).tolist() for x in leaves]
  return trainer, {'losses': losses, 'shares': shares, 'params': params, 'same_on_devices': same}


result = {'counts': counts}
try:
  WorkerTrainer(task, OPTIMIZER, batch, rules=Strategy.FSDP.rules())
  result['fsdp_error'] = None
except ConfigError as e:
  result['fsdp_error'] = str(e)

uniform_rules = ShareRules(batch, ctx.workers, 2, devices=counts)
trainer, result['uniform'] = train(balance.Uniform(uniform_rules))
result |= {'degrees': trainer.batch_degrees, 'share_degree': trainer.share_degree}

speed = counts[ctx.worker] / min(counts)
host = emulation.KnownSpeedHost(emulation.StaticTrace((1.0, 1.0, 3.0)), ctx.worker, ROW_S,
                                speed=speed)
lbbsp = balance.make_policy('lbbsp', ShareRules(batch, ctx.workers, BUCKET, devices=counts))
_, result['lbbsp'] = train(lbbsp, bucket=BUCKET, host=host, steps=LBBSP_STEPS)
(out / f'w{ctx.worker}.json').write_text(json.dumps(result))
