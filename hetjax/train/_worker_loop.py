"""The multi-worker loop: each phase of every step timed, slowness emulated, hooks at the end."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

import jax
import numpy as np

from hetjax.runtime import SharePolicy, StepStats, TelemetryGatherer, TimeDilation, WorkerStepStats
from hetjax.train._loop import Hook, StepInfo, run_hooks
from hetjax.train._state import TrainState
from hetjax.train._workers import WorkerTrainer


def host_load(dilation: TimeDilation | None, step: int) -> float:
  """The host-load input of a step: the emulated co-tenant load when slowness is emulated
  (sleeping loads no CPU, so no OS counter would see it), else the 1-minute load average per
  core."""
  if dilation is not None:
    return float(dilation.factor(step))
  try:
    return os.getloadavg()[0] / (os.cpu_count() or 1)
  except OSError:
    return 0.0


def worker_steps(
    trainer: WorkerTrainer,
    state: TrainState,
    until: int,
    policy: SharePolicy,
    dilation: TimeDilation | None = None,
    telemetry: TelemetryGatherer | None = None,
    hooks: Sequence[Hook] = (),
    history: list[StepStats] | None = None,
) -> Iterator[StepInfo]:
  """Runs BSP steps from ``state.step`` to ``until`` on every worker, yielding after each.

  Each step: ask ``policy`` for the shares (the same answer on every worker: its inputs are the
  shares and the busy times every worker learned from the previous combine), build this worker's
  slice (``data_s``), compile its program if the share size is new (``compile_s``), compute its
  partial gradient and wait for it (``compute_s``), sleep to emulate slowness (``dilation_s``),
  then join the combine and optimizer update and wait for it (``collective_s``). Timing needs
  those waits, so unlike `training_steps` this loop syncs every step.

  Args:
    trainer: the multi-worker trainer.
    state: the state to start from (donated).
    until: the step to stop at.
    policy: ``policy.shares(step, history)`` gives each step's shares (a `BalancePolicy`, or
      `hetjax.runtime.UniformShares` for plain BSP).
    dilation: this worker's slowdown emulation, if any.
    telemetry: where each step's `WorkerStepStats` go.
    hooks: run on every worker after each step (`Hook.every`, `Hook.at_end`).
    history: the `StepStats` list the policy sees; pass one to keep it across calls.
  """
  history = [] if history is None else history
  step = int(state.step)
  while step < until:
    shares = tuple(int(s) for s in policy.shares(step, history))
    trainer.check_shares(shares)
    start = time.perf_counter()
    batch = jax.block_until_ready(trainer.local_batch(step, shares))
    computed = time.perf_counter()
    compiling = trainer.programs.compiling
    packed = jax.block_until_ready(trainer.local_gradient(state, batch))
    compile_s = trainer.last_compile_s
    compute_s = time.perf_counter() - computed - compile_s
    # Pieces, or a compile competing for the cores: a true time, but not this worker's speed.
    sampled = not (trainer.programs.last_ran_pieces or compiling or trainer.programs.compiling)
    slept = dilation.apply(step, compute_s, rows=shares[trainer.worker]) if dilation else 0.0
    load = host_load(dilation, step)
    combine = time.perf_counter()
    state, loss, busy, loads, samples = jax.block_until_ready(
        trainer.combine(state, packed, busy_s=compute_s + slept, load=load, sampled=sampled))
    end = time.perf_counter()
    busy, loads = np.asarray(busy, np.float64), np.asarray(loads, np.float64)
    history.append(StepStats(step, shares, tuple(busy.tolist()), 0.0, float(busy.max()),
                             tuple(loads.tolist()), tuple(np.asarray(samples).tolist())))
    step += 1
    stats = WorkerStepStats(
        step=step, worker=trainer.worker, share=shares[trainer.worker],
        slowdown=dilation.factor(step - 1) if dilation else 1.0,
        data_s=computed - start, compute_s=compute_s, dilation_s=slept,
        collective_s=end - combine, step_s=end - start, compile_s=compile_s, load=load)
    if telemetry:
      telemetry.record(stats)
    info = StepInfo(step, state, {'loss': loss}, combine, stats)
    run_hooks(hooks, info, until)
    yield info


def measure_speed(trainer: WorkerTrainer, state: TrainState, rows: int, repeats: int = 3,
                  dilation: TimeDilation | None = None) -> float:
  """This worker's samples/s on its local gradient for ``rows`` rows: the reference speed of
  `hetjax.runtime.Cluster`.

  The best of ``repeats`` timed runs after one compiling run. Under emulated slowness the time
  is multiplied by the step-0 factor, which is exactly what time dilation would add.
  """
  batch = trainer.place(trainer.task.data.global_batch(trainer.seed, 0, rows))
  jax.block_until_ready(trainer.local_gradient(state, batch))  # compile
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(trainer.local_gradient(state, batch))
    best = min(best, time.perf_counter() - start)
  factor = dilation.factor(0) if dilation else 1.0
  return rows / (best * factor)
