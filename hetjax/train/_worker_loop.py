"""The multi-worker loop: each phase of every step timed, slowness emulated, hooks at the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import jax

from hetjax.runtime import TelemetryGatherer, TimeDilation, WorkerStepStats
from hetjax.train._loop import Hook, StepInfo
from hetjax.train._state import TrainState
from hetjax.train._workers import WorkerTrainer

SharesFn = Callable[[int], Sequence[int]]


def worker_steps(
    trainer: WorkerTrainer,
    state: TrainState,
    until: int,
    shares_for: SharesFn,
    dilation: TimeDilation | None = None,
    telemetry: TelemetryGatherer | None = None,
    hooks: Sequence[Hook] = (),
) -> Iterator[StepInfo]:
  """Runs BSP steps from ``state.step`` to ``until`` on every worker, yielding after each.

  Each step: build this worker's slice (``data_s``), compute its partial gradient and wait for
  it (``compute_s``), sleep to emulate slowness (``dilation_s``), then join the combine and
  optimizer update and wait for it (``collective_s``: communication plus the wait for the
  slowest). Timing needs those waits, so unlike `training_steps` this loop syncs every step.

  Args:
    trainer: the multi-worker trainer.
    state: the state to start from (donated).
    until: the step to stop at.
    shares_for: ``step → shares``; must return the same shares on every worker.
    dilation: this worker's slowdown emulation, if any.
    telemetry: where each step's `WorkerStepStats` go.
    hooks: run on every worker after each step (`Hook.every`, `Hook.at_end`).
  """
  step = int(state.step)
  while step < until:
    shares = tuple(int(s) for s in shares_for(step))
    trainer.check_shares(shares)
    start = time.perf_counter()
    batch = jax.block_until_ready(trainer.local_batch(step, shares))
    computed = time.perf_counter()
    packed = jax.block_until_ready(trainer.local_gradient(state, batch))
    compute_s = time.perf_counter() - computed
    # Compilation is not dilated: a slow host does not compile the same program 3x slower here.
    slept = dilation.apply(step, compute_s) if dilation and not trainer.last_call_compiled else 0.0
    combine = time.perf_counter()
    state, loss = jax.block_until_ready(trainer.combine(state, packed))
    end = time.perf_counter()
    step += 1
    stats = WorkerStepStats(
        step=step, worker=trainer.worker, share=shares[trainer.worker],
        slowdown=dilation.trace.factor(dilation.worker, step - 1) if dilation else 1.0, data_s=computed - start,
        compute_s=compute_s, dilation_s=slept, collective_s=end - combine, step_s=end - start)
    if telemetry:
      telemetry.record(stats)
    info = StepInfo(step, state, {'loss': loss}, combine, stats)
    for hook in hooks:
      if step % hook.every == 0 or (hook.at_end and step == until):
        hook.fn(info)
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
  factor = dilation.trace.factor(dilation.worker, 0) if dilation else 1.0
  return rows / (best * factor)
