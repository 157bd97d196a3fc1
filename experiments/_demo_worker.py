"""One worker of `experiments/demo.py`: uniform BSP and LB-BSP in interleaved blocks of one job.

  python experiments/_demo_worker.py OUT_DIR STEPS BLOCK POLICY   (started by hetjax.launch)

Both policies train their own copy of the MLP on the same global batches with the same hosts of
known speed (one calibration for the job); their blocks alternate, so both meet the same
machine. Each policy's run directory (``OUT_DIR/uniform``, ``OUT_DIR/POLICY``) gets what
``experiments/train.py`` writes: ``telemetry.jsonl``, ``run.json``, ``metrics.jsonl`` (step and
loss; no throughput, which only the telemetry can give in an interleaved job) and
``summary.json`` (final step and loss).
"""

from __future__ import annotations

import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hetjax import runtime

MODEL = {'hidden': 1024, 'width': 512}
GLOBAL_BATCH = 2048
BUCKET = 128


def main(out_dir: str, steps: int, block: int, compared: str) -> None:
  ctx = runtime.initialize(init_timeout_s=120)

  from hetjax import balance, emulation, models, run, train
  from hetjax.core import ShareRules

  out = pathlib.Path(out_dir)
  config = run.override(run.Config(model=run.ModelConfig('mlp', MODEL)), [
      f'global_batch={GLOBAL_BATCH}', 'optimizer=adam', 'learning_rate=3e-3', 'mesh=1x1'])
  task = models.make_task('mlp', **MODEL)
  optimizer = run.optimizer_of(config)[0]
  trainer = train.WorkerTrainer(task, optimizer, GLOBAL_BATCH, (1, 1),
                                train.Strategy.DATA_PARALLEL.rules(), bucket=BUCKET,
                                granularity=run.BalanceConfig().granularity)  # the default
  trace = emulation.parse_trace(ctx.slowdown or 'none', ctx.workers)
  host = run.emulated_host(ctx, trainer, trace, runtime.Channel(f'demo/{out}'))
  rules = ShareRules(GLOBAL_BATCH, ctx.workers, BUCKET)
  runs = {}
  for name in ('uniform', compared):
    run_dir = out / name
    if ctx.is_chief:
      run_dir.mkdir(parents=True, exist_ok=True)
      (run_dir / 'run.json').write_text(json.dumps({
          'workers': ctx.workers, 'global_batch': GLOBAL_BATCH, 'model': 'mlp',
          'slowdown': ctx.slowdown, 'policy': name, 'host_row_s': host.row_s,
          'host_fixed_s': host.fixed_s, 'host_source': 'calibrated'}) + '\n')
    channel = runtime.Channel(f'demo/{out}/{name}')
    telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers,
                                          run_dir / 'telemetry.jsonl')
    runs[name] = {'policy': balance.make_policy(name, rules), 'state': trainer.init_state(),
                  'policy_state': None, 'telemetry': telemetry, 'losses': []}
  try:
    for start in range(0, steps, block):
      for name, run in runs.items():
        hooks = [train.Hook(lambda i, t=run['telemetry']: t.record(i.stats.local))]
        for info in train.training_steps(trainer, run['state'], min(start + block, steps),
                                         hooks, run['policy'], run['policy_state']):
          run['state'], run['policy_state'] = info.state, info.policy_state
          run['losses'].append((info.step, info.stats.loss))
        if ctx.is_chief:
          print(f'{name:>8}: steps {start + 1}-{info.step}, loss '
                f'{float(run["losses"][-1][1]):.4f}', flush=True)
  finally:
    for run in runs.values():
      run['telemetry'].close()
    trainer.close()
  if ctx.is_chief:
    for name, run in runs.items():
      losses = [(step, float(loss)) for step, loss in run['losses']]
      (out / name / 'metrics.jsonl').write_text(
          ''.join(json.dumps({'step': s, 'loss': v}) + '\n' for s, v in losses))
      (out / name / 'summary.json').write_text(json.dumps(
          {'final_step': losses[-1][0], 'final_loss': losses[-1][1]}) + '\n')


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
