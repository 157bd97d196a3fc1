"""A worker of tests/test_spmd_multiprocess.py: one jitted step over every worker's devices.

  python tests/workers/train_spmd.py OUT_DIR STRATEGY MESH

Trains the small MLP for `STEPS` steps with `Trainer` on ``make_mesh(MESH)`` over all devices
of the job, saves the state with `Checkpointer` and restores it onto the same global layout.
Every worker writes ``OUT_DIR/worker{i}.json``: its losses (read with ``float`` on every
worker), the final parameters (gathered), the share of each parameter its devices hold, the
process of every mesh device, and whether the restored state has the saved values and the
trainer's shardings.
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import runtime

ctx = runtime.initialize(init_timeout_s=60)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from hetjax import models  # noqa: E402
from hetjax.checkpoint import Checkpointer  # noqa: E402
from hetjax.sharding import make_mesh, parse_mesh_shape  # noqa: E402
from hetjax.train import Strategy, Trainer, training_steps  # noqa: E402
from tests.workers.common import MODELS, OPTIMIZER, STEPS  # noqa: E402

out, strategy, shape = pathlib.Path(sys.argv[1]), Strategy(sys.argv[2]), sys.argv[3]
kwargs, batch = MODELS['mlp']
mesh = make_mesh(parse_mesh_shape(shape))
trainer = Trainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch, mesh, strategy.rules())
state, losses = trainer.init_state(), []
for info in training_steps(trainer, state, STEPS):
  state = info.state
  losses.append(float(info.stats.loss))


def gather(tree):
  return [np.asarray(x).tolist()
          for x in jax.tree.leaves(multihost_utils.process_allgather(tree, tiled=True))]


def held(x):
  """The share of ``x``'s elements that this worker's devices hold."""
  blocks = {tuple(s.indices(n)[:2] for s, n in zip(index, x.shape, strict=True))
            for index in x.sharding.addressable_devices_indices_map(x.shape).values()}
  return sum(int(np.prod([hi - lo for lo, hi in block])) for block in blocks) / x.size


params = gather(state.params)
ckpt = Checkpointer(out / 'checkpoints', asynchronous=False)
ckpt.save(state, meta={'task': 'mlp'})
restored, meta = ckpt.restore(trainer.abstract_state())
ckpt.close()
same_shardings = jax.tree.leaves(jax.tree.map(
    lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), restored, trainer.state_shardings))
(out / f'worker{ctx.worker}.json').write_text(json.dumps({
    'losses': losses,
    'params': params,
    'mesh_processes': [[d.process_index for d in row] for row in mesh.devices],
    'restored_step': int(restored.step),
    'restored_equal': gather(restored.params) == params,
    'restored_shardings': all(same_shardings),
    'held': [held(x) for x in jax.tree.leaves(state.params)],
}))
