"""A worker of tests/test_replicas_sdpipe.py: pipeline replicas under a sync policy.

  python tests/workers/replicas_sdpipe.py OUT_DIR RUN [RUN ...]
  RUN = POLICY,STEPS,STRAGGLER[,SILENT,SILENT_S]

Every worker is one replica: a 2-stage pipeline of the small MLP on its own 2 devices, SGD.
The RUNs run one after the other in the same processes (one launch: the start-up and the
compiles are paid once), each from the same initial parameters, with its own scheduler and
its own keys on the coordination service. In each, worker 0 also runs the group scheduler
(POLICY, a `SyncPolicy` with TIMEOUT_S) in a thread; POLICY+overlap runs the replicas with
``overlap=True``. Each replica trains STEPS steps, every step padded by `HostPause` to STEP_S
(STRAGGLER: a `parse_trace` spec, e.g. ``persistent:3:3``, or ``none``). With SILENT given, that
worker sleeps SILENT_S seconds after its step 2 without reporting it, then stops (it leaves).
Run i makes each worker write ``OUT_DIR/{i}/w{worker}.npz``: its final parameters
(``params/<path>``), its initial ones (``init/<path>``), its steps (``steps``), their losses
(``losses``), group members (``members/<step>``) and group numbers (``seq/<step>``); worker 0
also writes the scheduler's report (``report``, JSON).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

MODEL = {'hidden': 32, 'width': 16}  # 3 links: up | down, head
BATCH = 16
LR = 0.1
STEP_S = 0.03
TIMEOUT_S = 1.0


def flat(tree: dict, prefix: str) -> dict:
  from flax import traverse_util
  return {'/'.join([prefix, *map(str, k)]): np.asarray(v)
          for k, v in traverse_util.flatten_dict(tree).items()}


def main(out_dir: str, runs: list[str]) -> None:
  from hetjax import runtime

  ctx = runtime.initialize(init_timeout_s=60)

  import jax
  import optax

  from hetjax import models
  from hetjax.pipeline import PipelineTrainer

  trainer = PipelineTrainer(models.make_task('mlp', **MODEL), optax.sgd(LR), BATCH, stages=2,
                            micro_batches=2, devices=jax.local_devices())
  for i, spec in enumerate(runs):
    policy, steps, straggler, *silent = spec.split(',')
    out = pathlib.Path(out_dir) / str(i)
    out.mkdir(parents=True, exist_ok=True)
    run(ctx, trainer, runtime.Channel(f'sdpipe-test/{out}'), out, policy, int(steps), straggler,
        int(silent[0]) if silent else None, float(silent[1]) if silent else 0.0)


def run(ctx, trainer, channel, out: pathlib.Path, policy: str, steps: int, straggler: str,
        silent: int | None, silent_s: float) -> None:
  import jax

  from hetjax.bench import HostPause
  from hetjax.replicas import ReplicaDriver, SyncClient, SyncPolicy, start_service

  policy, _, mode = policy.partition('+')
  service = None
  if ctx.is_chief:
    options = {'timeout_s': TIMEOUT_S}
    if policy == 'sdpipe':  # windows on the scale of a step
      options.update(window_s=STEP_S / 3, min_window_s=STEP_S / 10, max_window_s=STEP_S)
    service = start_service(channel, SyncPolicy(policy, ctx.workers, options), 'run',
                            stop_after_s=100)
  pause = HostPause.of_step(straggler, ctx.workers, ctx.worker, STEP_S)
  driver = ReplicaDriver(trainer, SyncClient(channel, 'run', ctx.worker), ctx.workers, pause,
                         overlap=mode == 'overlap')
  state = trainer.init_state()
  saved = {**flat(trainer.merge_tree(jax.device_get(state.params)), 'init')}
  driver.warm_up(state)
  channel.barrier('start')
  if ctx.worker == silent:
    state, records = driver.run(state, steps=2, leave=False)
    time.sleep(silent_s)  # silent: the others drop it after TIMEOUT_S and go on
    driver.client.leave()
  else:
    state, records = driver.run(state, steps=steps)
  saved.update(flat(trainer.merge_tree(jax.device_get(state.params)), 'params'))
  saved['losses'] = np.asarray([r.loss for r in records])
  saved['steps'] = np.asarray([r.step for r in records])
  for r in records:
    saved[f'members/{r.step}'] = np.asarray(r.members)
    saved[f'seq/{r.step}'] = np.asarray(r.seq)
    saved[f'times/{r.step}'] = np.asarray([r.start_s, r.compute_s, r.pause_s, r.wait_s, r.sync_s])
  if service is not None:
    saved['report'] = np.asarray(json.dumps(service.join(60).to_json()))
  np.savez(out / f'w{ctx.worker}.npz', **saved)
  channel.barrier('end')


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2:])
