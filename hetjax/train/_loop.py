"""The one training loop: a generator of steps over any `StepProgram`, with hooks at step
boundaries and the policy's state carried as a value."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from hetjax.core import Policy, StepProgram, StepStats, Work


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What a hook sees after a step.

  Attributes:
    step: steps completed so far (the state's step, as a Python int, without a device sync).
    state: the state after the step. The next step donates it: keep the latest ``info.state``
      only; an earlier one's arrays are deleted ("Array has been deleted" if read later).
    stats: the step's `StepStats` (``stats.loss`` is a device scalar: reading it with
      ``float()`` waits for the step).
    decision: what the step ran with (e.g. its `Shares`); None without a policy.
    policy_state: the policy's state after learning from this step: what a checkpoint saves,
      so a resumed run continues with it. None without a policy.
    next_decision: what the next step will run with (from ``policy_state``).
    time: ``time.perf_counter()`` when the step returned.
    until: the step the loop stops at (None where no loop made this info).
  """

  step: int
  state: Any
  stats: StepStats
  decision: Any = None
  policy_state: Any = None
  next_decision: Any = None
  time: float = 0.0
  until: int | None = None

  @property
  def metrics(self) -> dict[str, jax.Array]:
    """``{'loss': …}``: the step's device metrics."""
    return {'loss': self.stats.loss}


@dataclasses.dataclass(frozen=True)
class Hook:
  """``fn(info)`` run after every ``every``-th step, and after the last step if ``at_end``."""

  fn: Callable[[StepInfo], None]
  every: int = 1
  at_end: bool = False


def training_steps(
    program: StepProgram,
    state: Any,
    until: int,
    hooks: Sequence[Hook] = (),
    policy: Policy | None = None,
    policy_state: Any = None,
) -> Iterator[StepInfo]:
  """Runs ``program``'s steps from ``state.step`` up to ``until``, yielding after each one.

  Every mode runs here: SPMD (`Trainer`), per-worker shares (`WorkerTrainer`), tokens
  (`TokenTrainer`) and a pipeline (`hetjax.pipeline.PipelineTrainer`). Each step: the host
  global batch of the step (a function of the seed and the step only), the program's step with
  the policy's decision, then the policy learns from the step's `StepStats` and gives the next
  decision — before the hooks, so a checkpoint hook saves a policy state that resumes exactly.
  Rebalancing, checkpointing, logging and telemetry are hooks.

  The loop reads ``state.step`` once, then counts on the host. An SPMD step never waits for the
  device unless a hook asks for a value, so dispatch of step s+1 overlaps the device work of
  step s; multi-worker programs time their phases and so wait every step.

  Example::

    log = Hook(lambda info: print(info.step, float(info.stats.loss)), every=10)
    for info in training_steps(trainer, state, until=100, hooks=[log]):
      state = info.state

    policy = balance.make_policy('lbbsp', rules)     # per-worker shares, re-sized every step
    for info in training_steps(worker_trainer, state, 100, policy=policy):
      state, policy_state = info.state, info.policy_state

  Args:
    program: how a step runs.
    state: the state to start from (donated).
    until: the step to stop at.
    hooks: run after each step (`Hook.every`, `Hook.at_end`).
    policy: decides each step (e.g. the shares); None for programs that take no decision.
    policy_state: the policy's state to continue from (e.g. restored from a checkpoint);
      default ``policy.init()``.
  """
  step = int(state.step)
  decision = None
  if policy is not None:
    policy_state = policy.init() if policy_state is None else policy_state
    decision, policy_state = policy.update(policy_state, None)
  while step < until:
    work = Work(step, program.global_batch_at(step))
    state, stats = program.step(state, work, decision)
    following = decision
    if policy is not None:
      following, policy_state = policy.update(policy_state, stats)
    step += 1
    info = StepInfo(step, state, stats, decision, policy_state, following, time.perf_counter(),
                    until)
    run_hooks(hooks, info, until)
    yield info
    decision = following


def run_hooks(hooks: Sequence[Hook], info: StepInfo, until: int) -> None:
  """Runs every hook due after step ``info.step`` of a loop that stops at ``until``."""
  for hook in hooks:
    if info.step % hook.every == 0 or (hook.at_end and info.step == until):
      hook.fn(info)
