"""A worker of the unequal-cluster part of experiments/bench_fela.py (`_fela_unequal`).

  python -m hetjax.launch --workers 4 --devices-per-worker 2 --slowdown static:1,1,3,3 -- \\
      python -m experiments._fela_unequal_worker OUT SPEC_JSON

Every worker: measures the job's devices (`hetjax.planner.measure_cluster`, worker 0's numbers
for all) and slows each worker's by its factor in the trace — the cluster the planner sees;
per model, plans it (worker 0 searches, the others read the plan) and costs the hand-written
baselines on the same cluster; compiles every plan across the four workers
(`hetjax.planner.compile_plan`: stages on their groups of workers), makes each worker a host of
known speed for each plan (`hetjax.emulation.StagePace` with `roofline_costs`: every plan's hosts
equally fast), then trains the plans in interleaved rounds, the order rotating, each block
between two barriers. Worker 0 writes ``OUT/run.json``: one row per (model, plan).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time


def main(out_dir: str, spec_json: str) -> None:
  from hetjax import runtime

  ctx = runtime.initialize(init_timeout_s=120)

  import jax
  import numpy as np
  import optax

  from hetjax import configs, emulation, models, pipeline, planner
  from hetjax.sharding import submodel_names

  spec = json.loads(spec_json)
  channel = runtime.Channel('fela-unequal')
  trace = emulation.parse_trace(ctx.slowdown, ctx.workers)
  factors = [trace.factor(w, 0) for w in range(ctx.workers)]
  measured = planner.measure_cluster()  # a collective: every worker takes part
  if ctx.is_chief:
    channel.set('cluster', measured.to_json())
  measured = planner.ClusterSpec.from_json(channel.get('cluster'))
  cluster = measured.with_slowdowns(factors)
  device = measured.workers[0]
  rates = (device.flops_per_s, device.memory_bytes_per_s or device.flops_per_s)
  rows, micro, steps, rounds = [], spec['micro_batches'], spec['steps'], spec['rounds']
  for key, (model, kwargs, batch) in spec['models'].items():
    task = models.make_task(model, **kwargs)
    names = submodel_names(task.make_model)
    profiles = planner.profile_submodels(task)
    if ctx.is_chief:
      found = planner.search(profiles, cluster, batch, micro_batches=micro)
      channel.set(f'plan/{key}', found.to_json())
    plans = [planner.Plan.from_json(channel.get(f'plan/{key}'), names)]
    for path in sorted(configs.PLANS.glob('*.json')):
      plans.append(planner.evaluate(planner.Plan.load(path, names), profiles, cluster, batch))
    runs = {}
    for plan in plans:
      compiled = planner.compile_plan(plan, task, optax.adam(1e-3), batch, micro_batches=micro)
      trainer = compiled.trainer
      trainer.use_host(emulation.StagePace(trace, ctx.worker, pipeline.roofline_costs(
          {k: c for k, c in compiled.programs.items()}, *rates, spec['margin'])))
      state, _ = trainer.train_step(trainer.init_state(), trainer.global_batch_at(0))  # warm up
      runs[plan.name] = [compiled, state]
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for r in range(rounds):
      for name in order[r % len(order):] + order[:r % len(order)]:
        compiled, state = runs[name]
        channel.barrier(f'{key}/{r}/{name}/start')
        start = time.perf_counter()
        for s in range(steps):
          state, _ = compiled.trainer.train_step(state, compiled.trainer.global_batch_at(1 + s))
        jax.block_until_ready(state.params)
        channel.barrier(f'{key}/{r}/{name}/end')
        times[name].append((time.perf_counter() - start) / steps)
        runs[name][1] = state
    late = {name: (c.trainer.pace.overruns, c.trainer.pace.overrun_s)
            for name, (c, _) in runs.items()}
    channel.set(f'late/{key}/{ctx.worker}', {n: list(v) for n, v in late.items()})
    if ctx.is_chief:
      everyone = [channel.get(f'late/{key}/{w}') for w in range(ctx.workers)]
      for name, (compiled, _) in runs.items():
        plan = compiled.plan
        rows.append({
            'model': key, 'plan': name, 'cluster': 'unequal', 'source': 'measured',
            'slowdown': ctx.slowdown,
            'layouts': {s.name: f'{s.layout.name(plan.group_devices(s))}@'
                                f'{",".join(map(str, plan.members(s)))}'
                        for s in plan.submodels},
            'stages': compiled.trainer.stages,
            'bytes_per_device': float(compiled.collective_bytes()),
            'measured_step_s': float(np.median(times[name])),
            'measured_rounds_s': times[name],
            'predicted_step_s': float(plan.predicted_step_s),
            'memory_bytes': compiled.memory_bytes,
            'actions_past_host_time': int(sum(e[name][0] for e in everyone)),
            'actions_past_host_time_s': float(sum(e[name][1] for e in everyone))})
    del runs
  if ctx.is_chief:
    info = {'rows': rows, 'cluster': cluster.to_json(), 'factors': factors,
            'measured_device': dataclasses.asdict(device), 'spec': spec}
    (pathlib.Path(out_dir) / 'run.json').write_text(json.dumps(info, indent=1))


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])
