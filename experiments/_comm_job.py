"""bench_comm's launched job: every process runs the runs listed in ``OUT/runs.json`` in order.

  python -m hetjax.launch --workers 4 --servers 1 -- python experiments/_comm_job.py OUT

A run is a dict: ``id``, ``scheme`` (``ps-…`` with its ``ps`` spec, or ``allreduce-…``),
``network`` (the links' text), ``hosts`` (a slowdown trace), ``compute_s`` (the step time of
an undisturbed host: each step is padded by sleep to it × the host's factor), ``steps``,
``global_batch``, ``lr``, ``model`` (the mlp's arguments) and, for the all-reduce scheduler,
``overlap`` and ``bucket_bytes``. Workers write ``OUT/ID/worker-W.json`` (each step's
iteration time, loss and communication), servers ``OUT/ID/server-S.json`` (every update: its
time, workers, staleness, scale and pushed loss). Every process joins a barrier before each run,
so the runs do not overlap.
"""

from __future__ import annotations

import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import optax
from flax import nnx

import models
from hetjax import emulation, ps, runtime, train
from hetjax.sharding import abstract_model


def _host(run: dict, worker: int, workers: int) -> emulation.KnownSpeedHost:
  rows = run['global_batch'] // workers
  return emulation.KnownSpeedHost(emulation.parse_trace(run['hosts'], workers), worker,
                                  row_s=run['compute_s'] / rows)


def full_loss(task, params) -> float:
  """The mean loss of ``params`` over every row of the task's data set (the final loss)."""
  graphdef = abstract_model(task.make_model, 0)[0]
  rows = {k: jax.numpy.asarray(v) for k, v in task.data.arrays.items()}
  return float(jax.jit(lambda p: jax.numpy.mean(task.loss(nnx.merge(graphdef, p), rows)))(
      params))


def _ps_run(run: dict, role: ps.PsRole, out: pathlib.Path, transport: ps.Transport) -> None:
  task = models.make_task('mlp', **run['model'])
  config = ps.parse_ps(run['ps'])
  channel = runtime.Channel(f'comm/{run["id"]}')
  if role.is_server:
    def evaluate(server):  # one server holds every leaf: the final parameters' loss
      if server.layout.servers == 1:
        loss = full_loss(task, server.layout.merge([server.params]))
        (out / 'final.json').write_text(json.dumps({'final_loss': loss}))

    ps.serve(task, optax.sgd(run['lr']), config, role, channel, transport=transport,
             idle_timeout_s=120, report_path=out / f'server-{role.index}.json', on_done=evaluate)
    return
  links = emulation.parse_links(run['network'], role.workers)
  worker = ps.make_worker(task, run['global_batch'], config, role, channel, transport=transport,
                          links=links, host=_host(run, role.index, role.workers), timeout_s=120)
  state, steps = worker.init_state(), []
  for info in train.training_steps(worker, state, run['steps']):
    state, local = info.state, info.stats.local
    steps.append({'iter_s': info.stats.iter_s, 'loss': float(info.stats.loss),
                  'compute_s': local.compute_s + local.dilation_s, 'push_s': local.push_s,
                  'pull_s': local.pull_s, 'wait_s': local.wait_s, 'staleness': local.staleness,
                  'accepted': local.accepted})
  worker.finish(state)
  (out / f'worker-{role.index}.json').write_text(json.dumps({'steps': steps}))


def _allreduce_run(run: dict, ctx: runtime.WorkerContext, out: pathlib.Path) -> None:
  task = models.make_task('mlp', **run['model'])
  links = emulation.parse_links(run['network'], ctx.workers)
  host = _host(run, ctx.worker, ctx.workers)
  kwargs = dict(seed=0, host=host, links=links)
  if run.get('overlap'):
    program = train.OverlapTrainer(task, optax.sgd(run['lr']), run['global_batch'],
                                   bucket_bytes=run.get('bucket_bytes'), **kwargs)
  else:
    program = train.WorkerTrainer(task, optax.sgd(run['lr']), run['global_batch'], **kwargs)
  share = run['global_batch'] // ctx.workers
  policy = _Fixed((share,) * ctx.workers)
  state, steps = program.init_state(), []
  for info in train.training_steps(program, state, run['steps'], policy=policy):
    state = info.state
    steps.append({'iter_s': info.stats.iter_s, 'loss': float(info.stats.loss)})
  state = program.flush(state) if hasattr(program, 'flush') else state
  if hasattr(program, 'close'):
    program.close()
  if ctx.is_chief:
    params = program.local_view(_params(state))
    (out / 'final.json').write_text(json.dumps({'final_loss': full_loss(task, params)}))
  (out / f'worker-{ctx.worker}.json').write_text(json.dumps({'steps': steps}))


def _params(state):
  """The parameters of a `TrainState` or of the all-reduce scheduler's state."""
  return state.params if hasattr(state, 'params') else state.train.params


class _Fixed:
  """The equal shares every step (a policy with no state)."""

  def __init__(self, shares):
    self.shares = shares

  def init(self):
    return None

  def update(self, state, stats):
    return self.shares, state


def main() -> None:
  out = pathlib.Path(sys.argv[1])
  ctx = runtime.initialize(init_timeout_s=120)
  runs = json.loads((out / 'runs.json').read_text())
  is_ps = any(r['scheme'].startswith('ps-') for r in runs)
  role = ps.ps_role() if is_ps else None
  transport = ps.Transport() if is_ps else None
  barrier = runtime.Channel('comm-barrier')
  for run in runs:
    barrier.barrier(f'run-{run["id"]}', timeout_s=300)
    where = out / run['id']
    where.mkdir(parents=True, exist_ok=True)
    if run['scheme'].startswith('ps-'):
      _ps_run(run, role, where, transport)
    else:
      _allreduce_run(run, ctx, where)
    print(f'{run["id"]} done', flush=True)
  jax.effects_barrier()


if __name__ == '__main__':
  main()
