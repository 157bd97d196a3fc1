"""Checking a plan by compiling it: the programs XLA would run, and whether they fit in memory.

A plan on all devices of one process is one SPMD step (`hetjax.train.Trainer`); any other
plan — sub-models on different groups of workers, or workers in several processes — trains as
pipeline stages (`plan_stages`, `hetjax.pipeline.PipelineTrainer`). Either way every program is
compiled before any training, and the memory each device needs is read from XLA's
`memory_analysis()`: for a step, arguments + outputs + temporaries − donated aliases; for
stages, per device, the parameters, optimizer state and gradient accumulator of every stage it
holds, plus the largest temporaries of one of them, plus its micro-batches' carries in flight.

A plan of the whole model (a model without ``submodels()``, `Plan.whole_model`) has one part:
on every device of one process it is one SPMD step; on a group of the workers, or across
processes, one stage on its group's devices, whose chain is the whole loss (`whole_model_task`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import jax
import optax
from flax import nnx

from hetjax._errors import ConfigError
from hetjax.pipeline import PipelineTrainer, check_chain
from hetjax.planner._hlo import collective_bytes
from hetjax.planner._plan import Plan
from hetjax.planner._stages import plan_stages
from hetjax.planner._whole import whole_model_task
from hetjax.train import Task, Trainer


@dataclasses.dataclass(frozen=True)
class CompiledPlan:
  """A plan's trainer and its compiled programs, with XLA's per-device memory figures.

  Attributes:
    plan: the plan.
    trainer: a `Trainer` on the plan's mesh with its rules (one SPMD step), or a
      `hetjax.pipeline.PipelineTrainer` over its stages; ready to train.
    programs: the compiled programs: ``{'step': …}`` for one SPMD step; per local stage
      ``{'s0/forward': …, 's0/backward': …, 's0/update': …, …}`` for stages.
    memory_bytes: the most any device needs (module docstring); across processes, of this
      process's devices.
    stage_memory: per stage, the most one of its devices needs (empty for one SPMD step; 0
      for a stage on other processes, which check their own).
  """

  plan: Plan
  trainer: Any
  programs: dict[str, jax.stages.Compiled]
  memory_bytes: int
  stage_memory: tuple[int, ...] = ()

  @property
  def compiled(self) -> jax.stages.Compiled:
    """The one SPMD step's program (a staged plan has several: see ``programs``)."""
    if 'step' not in self.programs:
      raise ConfigError(f'plan {self.plan.name!r} trains as {len(self.stage_memory)} stages: '
                        'read programs or collective_bytes()')
    return self.programs['step']

  def collective_bytes(self) -> float:
    """Bytes the busiest device sends per step through collectives, from the compiled HLO:
    one step's; for stages, each stage's forward and backward once per micro-batch and its
    update once, summed over the stages a device is in, and the largest such sum (rows moved
    between stages are not collectives and are not counted)."""
    if 'step' in self.programs:
      return float(collective_bytes(self.programs['step']).total)
    trainer: PipelineTrainer = self.trainer
    per_device: dict[Any, float] = collections.Counter()
    for s in range(trainer.stages):
      moved = 0.0
      for kind, times in (('forward', trainer.micro_batches), ('backward', trainer.micro_batches),
                          ('update', 1)):
        program = self.programs.get(f's{s}/{kind}')
        moved += times * (collective_bytes(program).total if program is not None else 0.0)
      for d in trainer.meshes[s].devices.flat:
        per_device[d] += moved
    return max(per_device.values(), default=0.0)


def compiled_bytes(compiled: jax.stages.Compiled) -> int:
  """Device bytes a compiled program holds while it runs, as XLA's ``memory_analysis()`` says:
  arguments, outputs and temporaries, donated arguments that its outputs alias counted once
  (a train step's state)."""
  m = compiled.memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


def compile_plan(plan: Plan, task: Task, optimizer: optax.GradientTransformation,
                 global_batch: int, memory_cap: float | None = None,
                 devices=None, seed: int = 0, micro_batches: int = 1,
                 schedule: str = '1f1b', accumulate: int = 1) -> CompiledPlan:
  """Compiles ``plan``'s programs before any training and checks them against ``memory_cap``.

  Args:
    plan: the plan.
    task: its model, loss and data.
    optimizer: the optimizer.
    global_batch: examples per step.
    memory_cap: bytes per device (None: no check).
    devices: the devices to run on (default: all of the job's).
    seed: initialisation and data.
    micro_batches: for stages, micro-batches per step (groups overlap across them).
    schedule: for stages, ``'1f1b'`` or ``'gpipe'``.
    accumulate: gradient accumulation: one SPMD step computes its gradient in this many
      micro-batches (`hetjax.train.Trainer`); stages run ``micro_batches`` × ``accumulate``.

  Raises:
    ConfigError: the plan does not apply to the model (a dimension its degree does not
      divide, the wrong device count, a grouped plan of sub-models for a model without a chain)
      or needs more than ``memory_cap`` bytes on some device (the message names the stage and
      its group).
  """
  devices = list(jax.devices() if devices is None else devices)
  one_process = len({d.process_index for d in devices}) == 1
  if one_process and not plan.grouped:
    trainer = Trainer(task, optimizer, global_batch, plan.mesh(devices), plan.rules(), seed,
                      accumulate=accumulate)
    compiled = trainer.compile_step()
    used = compiled_bytes(compiled)
    memory = compiled.memory_analysis()
    if memory_cap is not None and used > memory_cap:
      raise ConfigError(
          f'plan {plan.name!r} does not fit: its compiled step needs {used:,} bytes per device '
          f'(arguments {memory.argument_size_in_bytes:,}, temporaries '
          f'{memory.temp_size_in_bytes:,}), the cap is {int(memory_cap):,}')
    return CompiledPlan(plan, trainer, {'step': compiled}, used)
  if plan.whole_model:  # one stage, one link: the whole loss (module docstring)
    task = whole_model_task(task)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(seed)))
  if plan.grouped and not hasattr(model, 'chain'):
    raise ConfigError(f'plan {plan.name!r} puts sub-models on different groups, which train as '
                      f'pipeline stages; model {task.name!r} has no chain() (hetjax.pipeline.'
                      'HasChain)')
  links, _ = check_chain(model)
  layouts = plan_stages(plan, [link.name for link in links], devices)
  trainer = PipelineTrainer(task, optimizer, global_batch, layouts, micro_batches * accumulate,
                            schedule, seed=seed)
  stages = trainer.compile_stages()
  programs = {f's{s}/{k}': c for s, kinds in stages.items() for k, c in kinds.items()}
  stage_memory = _stage_memory(trainer, stages)
  per_device: dict[Any, int] = collections.Counter()
  peak: dict[Any, int] = collections.Counter()
  for s, (resident, transient) in stage_memory.items():
    for d in trainer.meshes[s].devices.flat:
      per_device[d] += resident
      peak[d] = max(peak[d], transient)
  used = {d: per_device[d] + peak[d] for d in per_device}
  if memory_cap is not None:
    for s, (resident, transient) in stage_memory.items():
      worst = max(used[d] for d in trainer.meshes[s].devices.flat)
      if worst > memory_cap:
        group = list(plan.members(plan.submodels[trainer.ranges[s][0]]))
        raise ConfigError(
            f'plan {plan.name!r} does not fit: stage {s} ({", ".join(trainer.stage_links[s])} '
            f'on workers {group}) needs {worst:,} bytes on one of its devices (its parameters, '
            f'optimizer state and gradients {resident:,}, temporaries {transient:,}, with the '
            f'other stages on those devices), the cap is {int(memory_cap):,}')
  totals = tuple(max((used[d] for d in trainer.meshes[s].devices.flat if d in used), default=0)
                 for s in range(trainer.stages))
  return CompiledPlan(plan, trainer, programs, max(used.values(), default=0), totals)


def _device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded `jax.ShapeDtypeStruct`s (the largest shard)."""
  return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
             for a in jax.tree.leaves(tree))


def _stage_memory(trainer: PipelineTrainer, stages: dict[int, dict[str, jax.stages.Compiled]]
                  ) -> dict[int, tuple[int, int]]:
  """Per local stage, (bytes a device holds for the whole step, bytes of its peak program):
  the update's arguments are the parameters, optimizer state and accumulated gradients; the
  largest temporaries of its programs, and the backward's other inputs (carry, rows,
  cotangent) for every micro-batch in flight, are the transient part."""
  out = {}
  for s, programs in stages.items():
    resident = int(programs['update'].memory_analysis().argument_size_in_bytes)
    params = _device_bytes(trainer.abstract_params(s))  # the backward's parameters and acc
    backward = programs['backward'].memory_analysis()
    inputs = max(int(backward.argument_size_in_bytes) - 2 * params, 0)
    temps = max(int(p.memory_analysis().temp_size_in_bytes) for p in programs.values())
    out[s] = (resident, temps + trainer.micro_batches * inputs)
  return out
