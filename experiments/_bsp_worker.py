"""One worker of `bench_bsp.py`: uniform BSP with and without a straggler, interleaved.

  python -m experiments._bsp_worker OUT_DIR STEPS BLOCK   (started by hetjax.launch)

Every worker runs as a host of known speed (`hetjax.emulation.KnownSpeedHost`), calibrated once
for the job; each scenario is a slowdown trace of those hosts. Blocks of BLOCK steps alternate
between the scenarios until each has STEPS steps (`experiments._bench_launch.interleaved_blocks`),
so both see the same machine state (on a shared 2-core box, back-to-back runs drift by 30%);
every step runs through `hetjax.train.training_steps` under the uniform policy.
The chief writes ``schedule.json`` (which steps belong to which scenario) beside
``telemetry.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from experiments._bench_launch import interleaved_blocks
from hetjax import runtime

# The benchmark's model: an MLP wide enough that a worker's gradient (1024 rows) takes tens of
# milliseconds, so compute, not dispatch, decides the iteration time.
MODEL = {'hidden': 1024, 'width': 512}
GLOBAL_BATCH = 4096
ALLREDUCE_REPEATS = 10
SCENARIOS = {'none': 'none', 'static': 'static:1,1,1,3'}


def main(out_dir: str, steps: int, block: int) -> None:
  ctx = runtime.initialize(init_timeout_s=120)
  import optax

  from hetjax import balance, core, emulation, models, run
  from hetjax.train import Hook, WorkerTrainer

  out = pathlib.Path(out_dir)
  trainer = WorkerTrainer(models.make_task('mlp', **MODEL), optax.sgd(0.05, momentum=0.9),
                          GLOBAL_BATCH)
  channel = runtime.Channel(f'bench/{out}')
  traces = {name: emulation.parse_trace(spec, ctx.workers) for name, spec in SCENARIOS.items()}
  state = trainer.init_state()
  host = run.emulated_host(ctx, trainer, traces['none'], channel)
  hosts = {name: dataclasses.replace(host, trace=trace) for name, trace in traces.items()}
  policy = balance.Uniform(core.ShareRules(GLOBAL_BATCH, ctx.workers))
  policy_state = policy.init()
  speed = trainer.measure_speed(state, policy.update(policy_state, None)[0][ctx.worker])
  cluster = runtime.discover_cluster(speed, channel)
  fit = runtime.fit_allreduce(trainer.mesh, 'proc', trainer.fused_size, ALLREDUCE_REPEATS)
  telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers, out / 'telemetry.jsonl')
  hooks = [Hook(lambda info: telemetry.record(info.stats.local))]
  try:
    _, schedule = interleaved_blocks(
        state, list(SCENARIOS), -(-steps // block), block, program=lambda name: trainer,
        policy=lambda name: policy, host=lambda name, shift: hosts[name], hooks=hooks,
        key='scenario')
  finally:
    telemetry.close()
    trainer.close()
  if ctx.is_chief:
    info = {'workers': ctx.workers, 'global_batch': GLOBAL_BATCH, 'model': 'mlp', **MODEL,
            'scenarios': SCENARIOS, 'grad_bytes': 4 * trainer.fused_size,
            'host_row_s': host.row_s, 'host_fixed_s': host.fixed_s,
            'allreduce': dataclasses.asdict(fit), 'cluster': cluster.to_json()}
    (out / 'run.json').write_text(json.dumps(info, indent=2) + '\n')
    (out / 'schedule.json').write_text(json.dumps(schedule) + '\n')


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
