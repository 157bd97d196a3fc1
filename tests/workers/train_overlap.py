"""A worker of tests/test_overlap.py: the overlapped all-reduce against the synchronous step.

  python tests/workers/train_overlap.py OUT.json

Launched as 2 workers of one device each; worker 0 writes ``OUT.json`` with:

- ``init``: the initial parameters (leaves), the reference's starting point;
- ``sync``, ``overlap``, ``buckets``: `STEPS` steps of the mlp with shares `SHARES` under
  `WorkerTrainer`, `OverlapTrainer` (one bucket, then flushed) and `OverlapTrainer` with
  `BUCKET_BYTES` (flushed): the final parameters, the reported losses and ``stats.step``s, and
  the buckets;
- ``int8``: the same with ``estimate='int8'`` (flushed), and its coarse exchange's bytes;
- ``links``: `TIMED` steps of each program on hosts of known speed (`HOST_S` of compute a step)
  and links ``link:20:inf``: each step's ``collective_s`` and ``iter_s``, and the modelled
  all-reduce time.
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
from hetjax.emulation import KnownSpeedHost, LinkedHost, parse_links, parse_trace  # noqa: E402
from hetjax.train import OverlapTrainer, WorkerTrainer  # noqa: E402
from tests.workers.common import MODELS, OPTIMIZER  # noqa: E402
from tests.workers.common import OVERLAP_BUCKET_BYTES as BUCKET_BYTES  # noqa: E402
from tests.workers.common import OVERLAP_HOST_S as HOST_S  # noqa: E402
from tests.workers.common import OVERLAP_LINKS as LINKS  # noqa: E402
from tests.workers.common import OVERLAP_SHARES as SHARES  # noqa: E402
from tests.workers.common import OVERLAP_STEPS as STEPS  # noqa: E402
from tests.workers.common import OVERLAP_TIMED as TIMED  # noqa: E402

kwargs, batch = MODELS['mlp']
task = models.make_task('mlp', **kwargs)


def leaves(tree):
  return [np.asarray(x).tolist() for x in jax.tree.leaves(tree)]


def run(program, steps, shares, flush=True):
  state, losses, reported, timing = program.init_state(), [], [], []
  for step in range(steps):
    state, stats = program.step(state, Work(step, program.global_batch_at(step)), shares)
    losses.append(float(stats.loss))
    reported.append(stats.step)
    timing.append({'collective_s': stats.local.collective_s, 'iter_s': stats.iter_s})
  if isinstance(program, OverlapTrainer) and flush:
    state = program.flush(state)
    assert int(state.step) == steps and int(state.ahead) == 0
    state = state.train
  program.close()
  return {'params': leaves(jax.device_get(state.params)), 'losses': losses,
          'reported': reported, 'timing': timing}


sync = WorkerTrainer(task, OPTIMIZER, batch)
out = {'init': leaves(jax.device_get(sync.init_state().params)), 'sync': run(sync, STEPS, SHARES)}
one = OverlapTrainer(task, OPTIMIZER, batch)
out['overlap'] = {**run(one, STEPS, SHARES), 'buckets': one.buckets}
split = OverlapTrainer(task, OPTIMIZER, batch, bucket_bytes=BUCKET_BYTES)
out['buckets'] = {**run(split, STEPS, SHARES), 'buckets': split.buckets,
                  'fused_size': split.sync.fused_size}

coarse = OverlapTrainer(task, OPTIMIZER, batch, estimate='int8')
out['int8'] = {**run(coarse, STEPS, SHARES), 'coarse_bytes': coarse.coarse_bytes}

links = parse_links(LINKS, workers=2)
host = KnownSpeedHost(parse_trace('static:1,1', 2), worker=ctx.worker,
                      row_s=HOST_S / (batch // 2))
even = (batch // 2, batch // 2)
paced = LinkedHost(links, ctx.worker, host)
timed_sync = WorkerTrainer(task, OPTIMIZER, batch, host=paced)
timed_overlap = OverlapTrainer(task, OPTIMIZER, batch, host=paced)
timed_int8 = OverlapTrainer(task, OPTIMIZER, batch, host=paced, estimate='int8')
out['links'] = {
    'modelled_s': links.all_reduce_s(range(2), timed_sync.all_reduce_bytes),
    'gather_s': links.all_gather_s(range(2), timed_int8.coarse_bytes),
    'sync': run(timed_sync, TIMED, even)['timing'],
    'overlap': run(timed_overlap, TIMED, even)['timing'],
    'int8': run(timed_int8, TIMED, even)['timing'],
}
if ctx.is_chief:
  pathlib.Path(sys.argv[1]).write_text(json.dumps(out))
