"""One worker of `bench_sdpipe.py`: one pipeline replica, trained under every policy in turn.

  python -m experiments._sdpipe_worker OUT_DIR CONFIG_JSON   (under hetjax.launch, 2 devices each)

The worker is one replica: a 2-stage pipeline (`MODEL` MLP on digits) on its own 2 devices.
For every round, scenario and policy (``CONFIG_JSON``: rounds, scenarios {name: slowdown spec},
policies, budget_s, step_s, window and max_group for `policy_options`; a policy named
``NAME+overlap`` is NAME with `ReplicaDriver(overlap=True)`) it starts from the same initial
parameters and trains for budget_s seconds, the policies' order rotating by one each round
(`experiments._analysis.round_order`); worker 0 runs that run's group scheduler in a thread.
Every replica is a host of known speed (`HostPause`: the scenario's `parse_trace` spec, a step
of step_s), × 3 for a persistent straggler, plus SDPipe's transient sleeps drawn per (round,
worker, step), so every policy of a round meets the same stragglers. Each replica keeps host
copies of its parameters at the first step ending after 20, 40, 60 and 80% of the run, and at
its end; after the run, all replicas average each snapshot over everyone to measure the
consensus distance ``‖xᵢ − x̄‖`` at those times (not part of the run's time). The chief writes
``OUT_DIR/run.json``: per run every replica's steps (end time, loss, compute, pause, wait, sync,
group size: `experiments._sdpipe_analysis.STEP_FIELDS`), the scheduler's report and its
distances at the snapshots.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import numpy as np

MODEL = {'hidden': 512, 'width': 256}
BATCH = 64
MICRO_BATCHES = 2
LR = 0.02
TIMEOUT_S = 30.0  # nobody is dropped in the benchmark: stragglers are slow, not dead
OVERLAP = '+overlap'  # a policy name's suffix: the same policy, averaging overlapped
SNAPSHOTS = (0.2, 0.4, 0.6, 0.8)  # consensus is measured at these fractions of a run and its end


def policy_options(policy: str, step_s: float, window: float = 0.1, max_group: int = 4) -> dict:
  """Each policy's options. Windows are on the scale of a step (SDPipe's defaults are for GPU
  steps): ``window`` × step_s to start, adapting within [window / 4, 2 × window] × step_s."""
  if policy == 'sdpipe':
    return {'timeout_s': TIMEOUT_S, 'window_s': window * step_s,
            'min_window_s': window * step_s / 4, 'max_window_s': 2 * window * step_s,
            'max_group': max_group, 'min_group': min(2, max_group)}
  if policy == 'random-pairs':
    return {'timeout_s': TIMEOUT_S, 'window_s': window * step_s}
  if policy == 'periodic-average':
    return {'timeout_s': TIMEOUT_S, 'every': 10}  # HetPipe-like: sync every 10 batches
  return {'timeout_s': TIMEOUT_S}


class Snapshots:
  """Host copies of a replica's parameters at the first step ending after each of SNAPSHOTS ×
  the budget (``on_step`` of `ReplicaDriver.run`), and at the end (`finish`)."""

  def __init__(self, budget_s: float):
    self.times = [f * budget_s for f in SNAPSHOTS]
    self.params: list = []

  def __call__(self, record, state) -> None:
    import jax

    while len(self.params) < len(self.times) and record.end_s >= self.times[len(self.params)]:
      self.params.append(jax.device_get(state.params))

  def finish(self, state) -> None:
    """Takes the final snapshot (and any a short run missed), so every replica has as many."""
    import jax

    final = jax.device_get(state.params)
    self.params += [final] * (len(self.times) + 1 - len(self.params))


def distance_to_mean(driver, state, params, workers: int) -> float:
  """‖x − x̄‖ for this replica's host parameters ``params``, x̄ by one average over every
  replica (a collective: every replica calls it, with its snapshot of the same index)."""
  import jax

  placed = driver.place(params)
  mean = driver.average(dataclasses.replace(state, params=placed), tuple(range(workers)))
  offsets = [np.asarray(a, np.float64) - np.asarray(b, np.float64) for a, b in zip(
      jax.tree.leaves(params), jax.tree.leaves(jax.device_get(mean.params)), strict=True)]
  return float(np.sqrt(sum(np.sum(o * o) for o in offsets)))


def main(out_dir: str, config: dict) -> None:
  from hetjax import runtime

  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()

  import jax
  import optax

  from experiments._analysis import round_order
  from hetjax import models
  from hetjax.bench import HostPause
  from hetjax.pipeline import PipelineTrainer
  from hetjax.replicas import ReplicaDriver, SyncClient, SyncPolicy, start_service

  out = pathlib.Path(out_dir)
  channel = runtime.Channel(f'sdpipe/{out}')
  trainer = PipelineTrainer(models.make_task('mlp', **MODEL), optax.sgd(LR, momentum=0.9),
                            BATCH, stages=2, micro_batches=MICRO_BATCHES,
                            devices=jax.local_devices())
  step_s, budget_s = float(config['step_s']), float(config['budget_s'])

  def options(policy: str) -> dict:
    return policy_options(policy.removesuffix(OVERLAP), step_s, config['window'],
                          config['max_group'])

  driver = ReplicaDriver(trainer, SyncClient(channel, 'warm-up', ctx.worker), ctx.workers)
  warm_up_s = driver.warm_up(trainer.init_state())
  runs = []
  for r in range(int(config['rounds'])):
    for scenario, spec in config['scenarios'].items():
      for policy in round_order(config['policies'], r):
        label = f'{r}/{scenario}/{policy}'
        service = None
        if ctx.is_chief:
          made = SyncPolicy(policy.removesuffix(OVERLAP), ctx.workers, options(policy))
          service = start_service(channel, made, label, stop_after_s=budget_s + 120)
        driver.client = SyncClient(channel, label, ctx.worker)
        driver.overlap = policy.endswith(OVERLAP)
        driver.use_host(HostPause.of_step(spec, ctx.workers, ctx.worker, step_s, seed=r))
        state = trainer.init_state()
        channel.barrier(f'{label}/start', timeout_s=120)
        snapshots = Snapshots(budget_s)
        state, records = driver.run(state, until_s=budget_s, on_step=snapshots)
        snapshots.finish(state)
        distances = [distance_to_mean(driver, state, params, ctx.workers)
                     for params in snapshots.params]
        mine = {'steps': [[x.end_s, x.loss, x.compute_s, x.pause_s, x.wait_s, x.sync_s,
                           len(x.members)] for x in records], 'distances': distances}
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
