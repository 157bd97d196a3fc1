"""Pipeline mode under several workers: one SDPipe replica per worker (`hetjax.run.build`).

Every worker runs the whole pipeline on its own devices (`PipelineTrainer`) as one replica; a
`ReplicaDriver` is the step program, and after each step the replica reports to the group
scheduler (worker 0 runs it, `ReplicaPolicy` is the loop's policy) and averages each stage with
its group (``Config.sync``: 'sdpipe', 'all-reduce', 'random-pairs', 'periodic-average').
Under local SGD (``local.inner_steps`` H, with ``pipeline.sync=periodic-average``) the replicas
average every H steps and the mean makes the round's outer step (``local.outer``, its state in
each replica's checkpoints: `hetjax.replicas.ReplicaDriver`'s ``outer``); `check_local` refuses
what does not go with it.

Slowdown (``--slowdown``, the one trace grammar): each replica is a host of known speed. A
replica's step always trains on the same rows (its batch), so the host has one cost per step:
``host_row_s`` × rows when given, else calibrated at start — the median of timed steps on a
copy of the initial state, × `hetjax.emulation.MARGIN`, the largest any worker measured
(`hetjax.emulation.build_host`, a step of one size) — and every step is padded to
``(factor + delay) × that cost`` (`ReplicaDriver.use_host`; the transient draw of step s is the
trace's draw for the replica's step s = 1, 2, …). SDPipe's and random pairs' windows are set on
the scale of that step (or of a timed one without a slowdown): `window_options`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from hetjax import ConfigError, emulation, runtime, train
from hetjax.pipeline import PipelineTrainer
from hetjax.replicas import (
  ReplicaCheckpointer,
  ReplicaDriver,
  ReplicaPolicy,
  SyncClient,
  SyncName,
  SyncPolicy,
)
from hetjax.run._sections import check_rounds

#: The scheduler's key namespace on the run's channel (a new coordination service per launch).
PREFIX = 'sync'
TIMED_STEPS = 3
#: The sync policies that wait in windows, and the first window, in undisturbed steps.
WINDOWED = ('sdpipe', 'random-pairs')
WINDOW = 0.1


def build(config, ctx: runtime.WorkerContext, channel: runtime.Channel, trainer: PipelineTrainer,
          trace, base):
  """``base`` (a `hetjax.run.Built`) completed with this worker's replica (the step program),
  the loop's sync policy, the emulated host (or None), the replica's checkpoints (each replica
  saves its own parameters under ``checkpoints/replica-W``; a resume starts from the latest
  step every replica saved), the warm-up that compiles and connects the groups before the
  scheduler's clock starts, and the scheduler's report when the replicas have left.

  Raises:
    ConfigError: a job restarted on fewer workers (each replica's parameters are its own).
  """
  if runtime.original_workers(ctx.workers) > ctx.workers:
    raise ConfigError(f'pipeline replicas cannot go on with {ctx.workers} of their '
                      f'{runtime.original_workers(ctx.workers)} workers (each replica checkpoints '
                      'its own parameters): run them with --min-workers equal to --workers')
  h = config.local.inner_steps
  outer = train.outer_optimizer(config.local.outer, config.local.outer_lr,
                                config.local.outer_momentum) if h else None
  driver = ReplicaDriver(trainer, SyncClient(channel, PREFIX, ctx.worker), ctx.workers,
                         overlap=config.pipeline.sync_overlap, outer=outer,
                         steps_per_round=h or 1)
  host = None
  if trace is not None:
    host = replica_host(ctx, driver, trace, channel, config.emulation.host_row_s)
    driver.use_host(host)
  options = {'every': h} if h else {}  # local SGD: everyone at a round's end
  if ctx.is_chief and config.pipeline.sync in WINDOWED:  # windows on the scale of a step
    step_s = host.nominal_s(trainer.global_batch) if host else time_step(driver)
    options = window_options(config.pipeline.sync, step_s)
  sync = ReplicaPolicy(SyncPolicy(config.pipeline.sync, ctx.workers, options), channel, PREFIX,
                       serve=ctx.is_chief)

  def finish(state) -> dict:
    report = sync.close()  # once every replica has left, the scheduler stops: its report
    return {} if report is None else {
        'sync': {k: v for k, v in report.to_json().items() if k != 'policy'}}

  return dataclasses.replace(
      base, program=driver, policy=sync, host=host,
      checkpoints=lambda workdir, resume: checkpoints(workdir, ctx, channel, resume),
      restore_target=driver.abstract_state, warm_up=driver.warm_up, finish=finish,
      run_info={'policy': None, 'sync': config.pipeline.sync})


def check_local(config) -> None:
  """Refuses, in one line naming the fields, what local SGD over replicas does not take:
  another sync policy than periodic averaging (whose schedule, every ``local.inner_steps``
  steps, makes the rounds), the overlapped sync, a cutoff (a replica trains its whole batch), a
  packed exchange (replicas average in float32), or a run whose steps or checkpoints fall inside
  a round."""
  h = config.local.inner_steps
  if not h:
    return
  sync = config.pipeline.sync
  if sync != SyncName.PERIODIC_AVERAGE.value:
    raise ConfigError(f'local.inner_steps ({h}) syncs the replicas on '
                      f'pipeline.sync={SyncName.PERIODIC_AVERAGE.value} (everyone every '
                      f'{h} steps, an outer step from the mean), not pipeline.sync {sync!r}: set '
                      f'pipeline.sync={SyncName.PERIODIC_AVERAGE.value} or drop local.inner_steps')
  if config.pipeline.sync_overlap:
    raise ConfigError('local.inner_steps and pipeline.sync_overlap do not go together: a '
                      'round\'s outer step takes its mean before the next round starts from it; '
                      'drop one')
  if config.local.cutoff:
    raise ConfigError(f'local.cutoff ({config.local.cutoff}) cuts a worker\'s rows in mode '
                      'shares; a pipeline replica under local.inner_steps trains its whole batch '
                      'every step: drop local.cutoff')
  if config.local.overlap_steps or config.local.fragments > 1:
    raise ConfigError('local.overlap_steps and local.fragments stream mode shares\' outer '
                      'exchange; pipeline replicas under local.inner_steps average each stage at '
                      'the round\'s end: drop them')
  if config.local.exchange != 'float32':
    raise ConfigError(f'local.exchange {config.local.exchange!r} packs mode shares\' outer '
                      'exchange; pipeline replicas under local.inner_steps average each stage in '
                      'float32: drop local.exchange')
  check_rounds(config)


def checkpoints(workdir: pathlib.Path, ctx: runtime.WorkerContext, channel: runtime.Channel,
                resume: bool) -> ReplicaCheckpointer:
  """This replica's checkpointer; a resume restores the newest step every replica holds good
  (the replicas agree over ``channel``; a corrupt one is skipped with one warning line)."""
  ckpt = ReplicaCheckpointer(workdir / 'checkpoints' / f'replica-{ctx.worker}', board=channel,
                             replica=ctx.worker, replicas=ctx.workers)
  if not resume:
    return ckpt
  channel.set(f'resume/{ctx.worker}', ckpt.latest_step() or 0)
  steps = [channel.get(f'resume/{w}') for w in range(ctx.workers)]
  if min(steps) == 0:
    raise ConfigError(f'--resume: replica {steps.index(0)} has no checkpoint in '
                      f'{workdir / "checkpoints"}')
  return ckpt


def window_options(sync: str, step_s: float) -> dict:
  """SDPipe's and random pairs' windows as fractions of an undisturbed replica step (their
  defaults, 2 ms within [0.5, 10] ms, are for GPU steps): 1/10 of a step to start, adapting
  within [1/40, 1/5] of one, as `experiments/bench_sdpipe.py` runs them."""
  window = WINDOW * step_s
  if sync == 'sdpipe':
    return {'window_s': window, 'min_window_s': window / 4, 'max_window_s': 2 * window,
            'timeout_s': max(5.0, 4 * window)}
  return {'window_s': window, 'timeout_s': max(5.0, 4 * window)}


def replica_host(ctx, driver: ReplicaDriver, trace, channel, host_row_s: float = 0.0
                 ) -> emulation.KnownSpeedHost:
  """This replica's host: ``host_row_s`` per row, or the calibrated step (module docstring)
  spread over the batch's rows."""
  calibration = emulation.Calibration(lambda rows: time_step(driver),
                                      (driver.trainer.global_batch,), repeats=1)
  return emulation.build_host(trace, ctx.worker, ctx.workers, calibration=calibration,
                              row_s=host_row_s, board=channel)


def time_step(driver: ReplicaDriver, repeats: int = TIMED_STEPS) -> float:
  """The median seconds of a replica's step (compute only) on copies of the initial state,
  after one untimed step that compiles."""
  trainer = driver.trainer
  state = trainer.init_state()
  batch = driver.batch_at(0)
  times = []
  for _ in range(repeats + 1):
    params, opt_state = jax.tree.map(jnp.copy, (state.params, state.opt_state))
    start = time.perf_counter()
    out, _ = trainer.train_step(dataclasses.replace(state, params=params, opt_state=opt_state),
                                batch)
    jax.block_until_ready(out.params)
    times.append(time.perf_counter() - start)
  return float(np.median(times[1:]))
