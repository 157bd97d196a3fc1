"""Checking a plan by compiling it: the step XLA would run, and whether it fits in memory."""

from __future__ import annotations

import dataclasses

import jax
import optax

from hetjax._errors import ConfigError
from hetjax.planner._plan import Plan
from hetjax.train import Task, Trainer


@dataclasses.dataclass(frozen=True)
class CompiledPlan:
  """A plan's trainer and its compiled step, with XLA's per-device memory figures.

  Attributes:
    plan: the plan.
    trainer: a `Trainer` on the plan's mesh with the plan's rules, ready to train.
    compiled: the compiled train step.
    memory_bytes: arguments + outputs + temporaries − donated aliases, per device.
  """

  plan: Plan
  trainer: Trainer
  compiled: jax.stages.Compiled
  memory_bytes: int


def compile_plan(plan: Plan, task: Task, optimizer: optax.GradientTransformation,
                 global_batch: int, memory_cap: float | None = None,
                 devices=None, seed: int = 0) -> CompiledPlan:
  """Compiles ``plan``'s train step before any training and checks it against ``memory_cap``.

  Raises:
    ConfigError: the plan does not apply to the model (a dimension its degree does not
      divide, the wrong device count, a sub-model on a subset of the workers) or needs more
      than ``memory_cap`` bytes per device.
  """
  for s in plan.submodels:
    if plan.group_devices(s) != plan.devices:
      raise ConfigError(f'plan {plan.name!r}: sub-model {s.name!r} runs on workers '
                        f'{list(s.group)} only; the SPMD trainer runs every sub-model on all '
                        'devices (a subset group needs a pipeline executor)')
  trainer = Trainer(task, optimizer, global_batch, plan.mesh(devices), plan.rules(), seed)
  compiled = trainer.compile_step()
  memory = compiled.memory_analysis()
  used = int(memory.argument_size_in_bytes + memory.output_size_in_bytes
             + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  if memory_cap is not None and used > memory_cap:
    raise ConfigError(
        f'plan {plan.name!r} does not fit: its compiled step needs {used:,} bytes per device '
        f'(arguments {memory.argument_size_in_bytes:,}, temporaries '
        f'{memory.temp_size_in_bytes:,}), the cap is {int(memory_cap):,}')
  return CompiledPlan(plan, trainer, compiled, used)
