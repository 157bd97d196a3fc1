"""The training loop as a generator of steps, with hooks at step boundaries."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from hetjax.train._state import TrainState
from hetjax.train._trainer import Trainer


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What a hook sees after a step.

  Attributes:
    step: steps completed so far (``state.step`` as a Python int, without a device sync).
    state: the state after the step.
    metrics: device scalars (``'loss'``); reading one with ``float()`` waits for the step.
    time: ``time.perf_counter()`` when the step was dispatched.
    stats: in multi-worker training, this worker's timings of the step (`WorkerStepStats`).
  """

  step: int
  state: TrainState
  metrics: dict[str, jax.Array]
  time: float
  stats: Any = None


@dataclasses.dataclass(frozen=True)
class Hook:
  """``fn(info)`` run after every ``every``-th step, and after the last step if ``at_end``."""

  fn: Callable[[StepInfo], None]
  every: int = 1
  at_end: bool = False


def training_steps(
    trainer: Trainer,
    state: TrainState,
    until: int,
    hooks: Sequence[Hook] = (),
) -> Iterator[StepInfo]:
  """Runs steps from ``state.step`` up to ``until``, yielding after each one.

  The loop reads ``state.step`` once, then counts on the host, so it never waits for the device
  unless a hook asks for a value: dispatch of step s+1 (and the host work of building its batch)
  overlaps with the device work of step s. Rebalancing, checkpointing and logging are hooks.
  Each step donates its input state: keep the latest ``info.state``, not an earlier one.

  Example::

    log = Hook(lambda info: print(info.step, float(info.metrics['loss'])), every=10)
    for info in training_steps(trainer, state, until=100, hooks=[log]):
      state = info.state
  """
  step = int(state.step)
  while step < until:
    batch = trainer.put_batch(trainer.global_batch_at(step))
    state, metrics = trainer.train_step(state, batch)
    step += 1
    info = StepInfo(step, state, metrics, time.perf_counter())
    run_hooks(hooks, info, until)
    yield info


def run_hooks(hooks: Sequence[Hook], info: StepInfo, until: int) -> None:
  """Runs every hook due after step ``info.step`` of a loop that stops at ``until``."""
  for hook in hooks:
    if info.step % hook.every == 0 or (hook.at_end and info.step == until):
      hook.fn(info)
