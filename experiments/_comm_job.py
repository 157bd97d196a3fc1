"""bench_comm's launched job: every process runs the runs listed in ``OUT/runs.json`` in order.

  python -m hetjax.launch --workers 4 --servers 1 -- python -m experiments._comm_job OUT

A run is a dict: ``id``, ``scheme`` (``ps-…`` with its ``ps`` spec, or ``allreduce-…``),
``network`` (the links' text), ``hosts`` (a slowdown trace), ``compute_s`` (the step time of an
undisturbed host: each step is padded by sleep to it × the host's factor), ``steps`` (global
batches of gradients the run applies: all-reduce and bsp workers run that many steps; under asp
every worker steps until the server's version reaches ``steps`` × workers, so fast workers go on
while a straggler computes, as they would in a job that trains to a budget), ``global_batch``,
``lr``, ``model`` (the mlp's arguments) and, for the all-reduce scheduler, ``overlap``,
``estimate`` and ``bucket_bytes``. Workers write ``OUT/ID/worker-W.json`` (each step's iteration
time, loss and communication), servers ``OUT/ID/server-S.json`` (every update: its time,
workers, staleness, scale and pushed loss). Every process joins a barrier before each run, so
the runs do not overlap.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import jax
import optax
from flax import nnx

from hetjax import balance, emulation, models, ps, runtime, train
from hetjax.core import ShareRules
from hetjax.sharding import abstract_model

#: An asp worker's most steps, as a multiple of the run's global batches (a safety cap: with a
#: 3× straggler a fast worker makes about 1.2 × steps before the version count is reached).
MAX_STEPS = 4


def _host(run: dict, worker: int, workers: int) -> emulation.KnownSpeedHost:
  rows = run['global_batch'] // workers
  return emulation.build_host(emulation.parse_trace(run['hosts'], workers), worker, workers,
                              row_s=run['compute_s'] / rows)


class FullLoss:
  """The mean loss over every row of the task's data set, jitted once: the curves' measure."""

  def __init__(self, task):
    graphdef = abstract_model(task.make_model, 0)[0]
    rows = {k: jax.numpy.asarray(v) for k, v in task.data.arrays.items()}
    self._loss = jax.jit(lambda p: jax.numpy.mean(task.loss(nnx.merge(graphdef, p), rows)))

  def __call__(self, params) -> float:
    return float(self._loss(params))


def _ps_run(run: dict, role: ps.PsRole, out: pathlib.Path, transport: ps.Transport) -> None:
  task = models.make_task('mlp', **run['model'])
  config = ps.parse_ps(run['ps'])
  channel = runtime.Channel(f'comm/{run["id"]}')
  if role.is_server:
    full, curve = FullLoss(task), []
    every = 1 if config.consistency is ps.Consistency.BSP else role.workers   # a global batch of gradients

    def sample(server):  # one server holds every leaf: the loss of its parameters
      if server.version % every == 0:  # [global batches, loss, the server's clock]
        curve.append([server.version // every, full(server.layout.merge([server.params])),
                      time.perf_counter()])

    def evaluate(server):
      loss = full(server.layout.merge([server.params]))
      (out / 'final.json').write_text(json.dumps({'final_loss': loss, 'curve': curve}))

    ps.serve(task, optax.sgd(run['lr']), config, role, channel, transport=transport,
             idle_timeout_s=120, report_path=out / f'server-{role.index}.json', on_done=evaluate,
             on_update=sample if role.servers == 1 else None)
    return
  links = emulation.parse_links(run['network'], role.workers)
  worker = ps.make_worker(task, run['global_batch'], config, role, channel, transport=transport,
                          links=links, host=_host(run, role.index, role.workers), timeout_s=120)
  state, steps = worker.init_state(), []
  versions = run['steps'] * (1 if config.consistency is ps.Consistency.BSP else role.workers)
  for info in train.training_steps(worker, state, MAX_STEPS * run['steps']):
    state, local = info.state, info.stats.local
    steps.append({'iter_s': info.stats.iter_s, 'loss': float(info.stats.loss),
                  'compute_s': local.compute_s + local.dilation_s, 'push_s': local.push_s,
                  'pull_s': local.pull_s, 'wait_s': local.wait_s, 'staleness': local.staleness,
                  'accepted': local.accepted})
    if max(state.versions) >= versions:   # the run's global batches are in
      break
  worker.finish(state)
  (out / f'worker-{role.index}.json').write_text(json.dumps({'steps': steps}))


def _allreduce_run(run: dict, ctx: runtime.WorkerContext, out: pathlib.Path) -> None:
  task = models.make_task('mlp', **run['model'])
  links = emulation.parse_links(run['network'], ctx.workers)
  host = _host(run, ctx.worker, ctx.workers)
  kwargs = dict(seed=0, host=emulation.LinkedHost(links, ctx.worker, host))
  if run.get('overlap'):
    program = train.OverlapTrainer(task, optax.sgd(run['lr']), run['global_batch'],
                                   bucket_bytes=run.get('bucket_bytes'),
                                   estimate=run.get('estimate', 'own'), **kwargs)
  else:
    program = train.WorkerTrainer(task, optax.sgd(run['lr']), run['global_batch'], **kwargs)
  policy = balance.Uniform(ShareRules(run['global_batch'], ctx.workers))
  state, steps, curve, full = program.init_state(), [], [], FullLoss(task)
  for info in train.training_steps(program, state, run['steps'], policy=policy):
    state = info.state
    steps.append({'iter_s': info.stats.iter_s, 'loss': float(info.stats.loss)})
    if ctx.is_chief:   # the exact parameters: the scheduler's lag one step behind its batches
      exact = _exact(state)
      curve.append([int(exact.step), full(program.local_view(exact.params))])
  state = program.flush(state) if hasattr(program, 'flush') else state
  if hasattr(program, 'close'):
    program.close()
  if ctx.is_chief:
    loss = full(program.local_view(_exact(state).params))
    (out / 'final.json').write_text(json.dumps({'final_loss': loss, 'curve': curve}))
  (out / f'worker-{ctx.worker}.json').write_text(json.dumps({'steps': steps}))


def _exact(state) -> train.TrainState:
  """The exact `TrainState` of a synchronous step's state or of the scheduler's."""
  return state if isinstance(state, train.TrainState) else state.train


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
