"""Pipeline mode under several workers: one SDPipe replica per worker (`experiments/_programs.py`).

Every worker runs the whole pipeline on its own devices (`PipelineTrainer`) as one replica; a
`ReplicaDriver` is the step program, and after each step the replica reports to the group
scheduler (worker 0 runs it, `ReplicaSync` is the loop's policy) and averages each stage with
its group (``Config.sync``: 'sdpipe', 'all-reduce', 'random-pairs', 'periodic-average').

Slowdown (``--slowdown``, the one trace grammar): each replica is a host of known speed. A
replica's step always trains on the same rows (its batch), so the host has one cost per step:
``host_row_s`` × rows when given, else calibrated at start — the median of timed steps on a
copy of the initial state, × `MARGIN`, the largest any worker measured — and every step is
padded to ``(factor + delay) × that cost`` (`HostPause`; the transient draw of step s is the
trace's draw for the replica's step s = 1, 2, …).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from hetjax import emulation, runtime
from hetjax.pipeline import (
    HostPause,
    PipelineTrainer,
    ReplicaDriver,
    ReplicaSync,
    SyncClient,
    SyncValuePolicy,
)

#: Host time over a calibrated step, as for the shares and tokens modes' hosts.
MARGIN = 1.5
#: The scheduler's key namespace on the run's channel (a new coordination service per launch).
PREFIX = 'sync'
TIMED_STEPS = 3


def build(config, ctx: runtime.WorkerContext, channel: runtime.Channel,
          trainer: PipelineTrainer, trace) -> tuple[ReplicaDriver, ReplicaSync,
                                                     emulation.KnownSpeedHost | None]:
  """This worker's replica, the loop's sync policy and the emulated host (or None)."""
  value = SyncValuePolicy(config.sync, ctx.workers)
  sync = ReplicaSync(value, channel, PREFIX, serve=ctx.is_chief)
  driver = ReplicaDriver(trainer, SyncClient(channel, PREFIX, ctx.worker), ctx.workers)
  host = None
  if trace is not None:
    host = replica_host(config, ctx, driver, trace, channel)
    driver.pause = HostPause(host, trainer.global_batch)
  return driver, sync, host


def replica_host(config, ctx, driver: ReplicaDriver, trace, channel
                 ) -> emulation.KnownSpeedHost:
  """This replica's host: ``config.host_row_s`` per row, or the calibrated step (module
  docstring) spread over the batch's rows."""
  rows = driver.trainer.global_batch
  row_s = config.host_row_s
  if not row_s:
    step_s = time_step(driver) * MARGIN
    channel.set(f'calibrate/{ctx.worker}', step_s)
    row_s = max(channel.get(f'calibrate/{w}') for w in range(ctx.workers)) / rows
  return emulation.KnownSpeedHost(trace, ctx.worker, row_s)


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
