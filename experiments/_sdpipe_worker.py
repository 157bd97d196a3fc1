"""One worker of `bench_sdpipe.py`: one pipeline replica, trained under every policy in turn.

  python experiments/_sdpipe_worker.py OUT_DIR CONFIG_JSON   (under hetjax.launch, 2 devices each)

The worker is one replica: a 2-stage pipeline (`MODEL` MLP on digits) on its own 2 devices.
For every round, scenario and policy (``CONFIG_JSON``: rounds, scenarios {name: straggler spec},
policies, budget_s, step_s, window and max_group for `policy_options`) it starts from the same initial parameters and trains for budget_s
seconds; worker 0 runs that run's group scheduler in a thread. Every step is padded by
`StragglerPause` to step_s (× 3 for a persistent straggler), plus SDPipe's transient sleeps,
drawn per (round, worker, step), so every policy of a round meets the same stragglers. After
each run all replicas average once over everyone to measure the consensus distance
``mean_i ‖xᵢ − x̄‖`` (not part of the run's time). The chief writes ``OUT_DIR/run.json``: per run
every replica's steps (end time, loss, compute, pause, wait, sync, group size), the
scheduler's report and the consensus distance.
"""

from __future__ import annotations

import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np

MODEL = {'hidden': 512, 'width': 256}
BATCH = 64
MICRO_BATCHES = 2
LR = 0.02
TIMEOUT_S = 30.0  # nobody is dropped in the benchmark: stragglers are slow, not dead


def policy_options(policy: str, step_s: float, window: float = 0.1, max_group: int = 4) -> dict:
  """Each policy's options. Windows are on the scale of a step (SDPipe's defaults are for GPU
  steps): ``window`` × step_s to start, adapting within [window / 4, 2 × window] × step_s."""
  if policy == 'sdpipe':
    return {'timeout_s': TIMEOUT_S, 'window_s': window * step_s,
            'min_window_s': window * step_s / 4, 'max_window_s': 2 * window * step_s,
            'max_group': max_group, 'min_group': min(2, max_group)}
  if policy == 'ad-psgd':
    return {'timeout_s': TIMEOUT_S, 'window_s': window * step_s}
  if policy == 'ps':
    return {'timeout_s': TIMEOUT_S, 'every': 10}  # HetPipe-like: sync every 10 batches
  return {'timeout_s': TIMEOUT_S}


def main(out_dir: str, config: dict) -> None:
  from hetjax import runtime

  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()

  import jax
  import optax

  import models
  from hetjax.pipeline import (
      PipelineTrainer,
      ReplicaDriver,
      StragglerPause,
      SyncClient,
      make_sync_policy,
      start_service,
  )

  out = pathlib.Path(out_dir)
  channel = runtime.Channel(f'sdpipe/{out}')
  trainer = PipelineTrainer(models.make_task('mlp', **MODEL), optax.sgd(LR, momentum=0.9),
                            BATCH, stages=2, micro_batches=MICRO_BATCHES,
                            devices=jax.local_devices())
  step_s, budget_s = float(config['step_s']), float(config['budget_s'])

  def options(policy: str) -> dict:
    return policy_options(policy, step_s, config['window'], config['max_group'])

  driver = ReplicaDriver(trainer, SyncClient(channel, 'warm-up', ctx.worker), ctx.workers)
  warm_up_s = driver.warm_up(trainer.init_state())
  runs = []
  for r in range(int(config['rounds'])):
    for scenario, spec in config['scenarios'].items():
      for policy in config['policies']:
        label = f'{r}/{scenario}/{policy}'
        service = None
        if ctx.is_chief:
          made = make_sync_policy(policy, ctx.workers, **options(policy))
          service = start_service(channel, made, label, stop_after_s=budget_s + 120)
        driver.client = SyncClient(channel, label, ctx.worker)
        driver.pause = StragglerPause(spec, ctx.worker, step_s, seed=r)
        state = trainer.init_state()
        channel.barrier(f'{label}/start', timeout_s=120)
        state, records = driver.run(state, until_s=budget_s)
        # Consensus distance: everyone averages once with everyone (outside the timed run).
        mean = driver.average(state, tuple(range(ctx.workers)))
        offsets = [np.asarray(a, np.float64) - np.asarray(b, np.float64) for a, b in zip(
            jax.tree.leaves(jax.device_get(state.params)),
            jax.tree.leaves(jax.device_get(mean.params)), strict=True)]
        distance = float(np.sqrt(sum(np.sum(o * o) for o in offsets)))
        mine = {'steps': [[x.end_s, x.loss, x.compute_s, x.pause_s, x.wait_s, x.sync_s,
                           len(x.members)] for x in records], 'distance': distance}
        channel.set(f'{label}/replica/{ctx.worker}', mine)
        if ctx.is_chief:
          report = service.join(120)
          replicas = [channel.get(f'{label}/replica/{w}', timeout_s=120)
                      for w in range(ctx.workers)]
          runs.append({'round': r, 'scenario': scenario, 'spec': spec, 'policy': policy,
                       'report': report.to_json(), 'replicas': replicas})
        channel.barrier(f'{label}/end', timeout_s=120)
  if ctx.is_chief:
    info = {'workers': ctx.workers, 'model': 'mlp', **MODEL, 'batch': BATCH,
            'micro_batches': MICRO_BATCHES, 'stages': trainer.stages,
            'stage_links': [list(s) for s in trainer.stage_links], 'lr': LR,
            'warm_up_s': warm_up_s, 'config': config, 'runs': runs,
            'policy_options': {p: options(p) for p in config['policies']}}
    (out / 'run.json').write_text(json.dumps(info) + '\n')


if __name__ == '__main__':
  main(sys.argv[1], json.loads(sys.argv[2]))
