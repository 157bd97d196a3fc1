"""One worker of `bench_bsp.py`: uniform BSP with and without a straggler, interleaved.

  python experiments/_bsp_worker.py OUT_DIR STEPS BLOCK   (started by hetjax.launch)

Blocks of BLOCK steps alternate between the scenarios until each has STEPS steps, so both see
the same machine state (on a shared 2-core box, back-to-back runs drift by 30%). The chief
writes ``schedule.json`` (which steps belong to which scenario) beside ``telemetry.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

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

  import models
  from hetjax.train import WorkerTrainer, measure_speed, worker_steps

  out = pathlib.Path(out_dir)
  trainer = WorkerTrainer(models.make_task('mlp', **MODEL), optax.sgd(0.05, momentum=0.9),
                          GLOBAL_BATCH)
  channel = runtime.Channel(f'bench/{out}')
  dilations = {name: runtime.TimeDilation(runtime.parse_slowdown(spec, ctx.workers), ctx.worker)
               for name, spec in SCENARIOS.items()}
  state = trainer.init_state()
  policy = runtime.UniformShares(GLOBAL_BATCH, ctx.workers)
  speed = measure_speed(trainer, state, policy.shares(0, ())[ctx.worker])
  cluster = runtime.discover_cluster(speed, channel)
  fit = runtime.fit_allreduce(trainer.mesh, 'proc', trainer.fused_size, ALLREDUCE_REPEATS)
  telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers, out / 'telemetry.jsonl')
  schedule = []
  try:
    for _ in range(-(-steps // block)):
      for name in SCENARIOS:
        start = int(state.step)
        for info in worker_steps(trainer, state, start + block, policy, dilations[name],
                                 telemetry):
          state = info.state
        schedule.append({'scenario': name, 'first_step': start + 1, 'last_step': start + block})
  finally:
    telemetry.close()
  if ctx.is_chief:
    info = {'workers': ctx.workers, 'global_batch': GLOBAL_BATCH, 'model': 'mlp', **MODEL,
            'scenarios': SCENARIOS, 'grad_bytes': 4 * trainer.fused_size,
            'allreduce': dataclasses.asdict(fit), 'cluster': cluster.to_json()}
    (out / 'run.json').write_text(json.dumps(info, indent=2) + '\n')
    (out / 'schedule.json').write_text(json.dumps(schedule) + '\n')


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
