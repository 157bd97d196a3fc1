"""`PipelineTrainer`: runs a GPipe or 1F1B schedule over stages on device groups, across processes.

Stages. The model's chain (`HasChain`) is cut into contiguous ranges of links, each run by one
stage on its own mesh under its own rules (`StageLayout`). Classic stages (``stages`` a count or
link ranges, `equal_stages`) cut the devices into equal contiguous groups, a 1-D mesh
``('batch',)`` each, parameters replicated on it: data parallel inside a stage. A plan's stages
(`hetjax.planner.plan_stages`) put each run of sub-models on its device group, with a tensor
degree and FSDP per sub-model; groups may differ in size, span processes and share devices.

Programs, compiled once per stage and kept in ``programs[s]``:

* forward ``F_s(params, carry_in, batch) -> carry_out``;
* backward ``B_s(params, acc, carry_in, batch, d_carry_out) -> (acc + d_params, d_carry_in)``.
  It recomputes the stage's forward under `jax.vjp` (GPipe's rematerialisation), so a stage
  keeps only its input carry per micro-batch in flight, never its inner activations. The last
  stage's backward takes no cotangent: it runs forward and ``chain_loss`` and differentiates
  ``Σ losses / global_batch``, so summing over micro-batches gives exactly the gradient of the
  mean loss over the global batch (and the loss itself accumulates to that mean). Its forward
  action therefore runs nothing: the stage keeps its input until the backward.
* ``acc`` is the stage's gradient accumulator (donated, updated in place, laid out like the
  parameters, so a stage with several data-parallel devices reduces its gradient in the
  backward); ``update_s`` applies the optimizer to the stage's own parameters once every
  micro-batch is done.

Order. The schedule (`gpipe`, `one_f_one_b` or any valid `Schedule`) fixes each stage's order;
actions are dispatched in the order of the schedule's simulated start times, which respects
every dependency. JAX dispatch is asynchronous and each device runs its queue in order, so
stages on different devices overlap as the schedule intends. When a stage spans processes,
every action instead runs to its end before the next is dispatched (`_settle`: programs over
overlapping sets of processes in flight together deadlock on the CPU backend).

Transfers (`hetjax.pipeline._transfer`). Micro-batch rows are placed on each stage that needs
them; a carry crosses to stage s + 1 and a cotangent back to stage s − 1, split by rows as the
receiving stage's compute rules say. Each process builds the same trainer, makes the same calls
with the same global batch, and walks the same dispatch order, running only the programs of the
stages it has devices in, and taking part in the moves `_transfer.move` says it must.
Parameters, optimizer state, gradients and updates stay on their stage's devices: per-stage
trees hold ``None`` for stages this process has no device in, and only the last stage's
processes get the loss (`step` brings it to process 0 too).

The optimizer runs per stage, so it must act on each parameter on its own (SGD, Adam, AdamW):
transformations that couple all parameters, such as global-norm clipping, would see one stage's
norm only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._checks import positive_int
from hetjax._errors import ConfigError
from hetjax.core import Pace, StepStats, Work
from hetjax.data import Batch
from hetjax.pipeline._chain import Path, assemble, check_chain
from hetjax.pipeline._schedule import FORWARD, Action, Schedule
from hetjax.pipeline._stage_args import checked_schedule, stage_ranges
from hetjax.pipeline._stage_programs import StageProgramsMixin, dispatch_order
from hetjax.pipeline._stages import StageLayout, check_layouts, equal_stages
from hetjax.pipeline._transfer import CarrySpecs, StepTransfers, move
from hetjax.sharding import abstract_model, param_shardings, read_weights
from hetjax.train import Task, split_trainable

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PipelineState:
  """Per-stage parameters and optimizer state, each on its stage's devices.

  Attributes:
    step: optimizer steps taken (a host int: it is also the data position).
    params: per stage, ``{link name: the link module's pure dict}``; ``None`` for a stage that
      another process owns.
    opt_state: per stage, the optax state of that stage's parameters (``None`` likewise).
  """

  step: int = dataclasses.field(metadata={'static': True})
  params: tuple[PyTree, ...]
  opt_state: tuple[PyTree, ...]


class PipelineTrainer(StageProgramsMixin):
  """Trains ``task``'s model as a pipeline of stages on device groups.

  The groups may span processes (module docstring); ``programs`` has ``local_stages`` only.

  Example::

    trainer = PipelineTrainer(task, optax.sgd(0.1), global_batch=16, stages=2,
                              micro_batches=4, schedule='1f1b')
    state = trainer.init_state()
    state, loss = trainer.train_step(state, trainer.global_batch_at(0))

  Args:
    task: a task whose model implements `HasChain`.
    optimizer: an optax transformation that treats parameters independently (module docstring).
    global_batch: examples per step.
    stages: a number of stages (links split evenly by count with `split_stages`), explicit
      ``(start, stop)`` link ranges (e.g. ``split_stages(costs, 2)``), both on `equal_stages`
      of ``devices``; or `StageLayout`s (e.g. `hetjax.planner.plan_stages` of a plan).
    micro_batches: micro-batches per step; each has ``global_batch / micro_batches`` rows.
    schedule: ``'gpipe'``, ``'1f1b'`` or a `Schedule` for the same stages and micro-batches.
    devices: for a count or ranges, the devices, split into equal contiguous groups, one per
      stage (default: all, of every process); not with layouts, which carry their meshes.
    seed: initialises parameters (as the unpipelined model would) and selects the data.

  Raises:
    ConfigError: a model without a chain, bad stage ranges or layouts, devices that do not
      divide evenly over stages, a classic stage whose devices span processes, a global batch
      that does not divide into micro-batches, micro-batch rows that do not divide over a
      stage's row split, or a parameter its stage's rules split unevenly.
  """

  def __init__(
      self,
      task: Task,
      optimizer: optax.GradientTransformation,
      global_batch: int,
      stages: int | Sequence[tuple[int, int]] | Sequence[StageLayout] = 2,
      micro_batches: int = 1,
      schedule: str | Schedule = '1f1b',
      devices: Sequence[jax.Device] | None = None,
      seed: int = 0,
  ):
    self.task, self.optimizer, self.seed = task, optimizer, seed
    self.global_batch = positive_int(global_batch, 'global_batch')
    self.micro_batches = positive_int(micro_batches, 'micro_batches')
    with nnx.use_eager_sharding(False):
      model = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(seed)))
    links, paths = check_chain(model)
    self.links = {link.name: link for link in links}
    self.paths = {link.name: path for link, path in zip(links, paths, strict=True)}
    self.graphdefs = {link.name: nnx.graphdef(link.module) for link in links}
    self._chain_loss = model.chain_loss
    if not isinstance(stages, int) and any(isinstance(x, StageLayout) for x in stages):
      if devices is not None:
        raise ConfigError('stage layouts carry their meshes: give devices or layouts, not both')
      self.layouts = check_layouts(stages, len(links))
    else:
      self.layouts = equal_stages(stage_ranges(stages, len(links)),
                                  jax.devices() if devices is None else devices)
    self.ranges = tuple(layout.links for layout in self.layouts)
    self.stage_links = tuple(tuple(link.name for link in links[a:b]) for a, b in self.ranges)
    n = len(self.ranges)
    self.schedule = checked_schedule(schedule, n, self.micro_batches)
    self._order = dispatch_order(self.schedule)

    self.meshes = tuple(layout.mesh for layout in self.layouts)
    self.processes = tuple(layout.processes for layout in self.layouts)
    if self.global_batch % self.micro_batches:
      raise ConfigError(f'global batch {self.global_batch} does not divide into '
                        f'{self.micro_batches} micro-batches')
    self.micro_rows = self.global_batch // self.micro_batches
    for s, layout in enumerate(self.layouts):
      if self.micro_rows % layout.row_ways:
        raise ConfigError(f'micro-batch of {self.micro_rows} rows does not divide over the '
                          f'{layout.row_ways} devices stage {s} splits rows over')
    self._replicated = tuple(NamedSharding(m, PartitionSpec()) for m in self.meshes)
    self._rows = tuple(NamedSharding(layout.mesh, layout.rules.compute.spec(('batch',)))
                       for layout in self.layouts)
    _, shapes, names = abstract_model(task.make_model, seed)
    self._abstract = self.split_tree(shapes)
    self._shardings = tuple(self._stage_shardings(s, names) for s in range(n))
    me = jax.process_index()
    self.local_stages = tuple(s for s in range(n) if me in self.processes[s])
    # Placeholders and exchange programs need the carries' shapes unless all is one process's.
    crosses = len(set().union(*self.processes)) > 1
    self._lockstep = any(len(p) > 1 for p in self.processes)
    self._specs = CarrySpecs(self._apply, self._abstract, self.micro_rows) if crosses else None
    self.programs = {s: self._compile(s) for s in self.local_stages}
    #: Called after each of this process's actions when a stage spans processes
    #: (`hetjax.core.Pace.pad_action`: hosts of known speed per action,
    #: `hetjax.emulation.StagePace`); None: no padding.
    self.pace: Pace | None = None

  @property
  def stages(self) -> int:
    return len(self.ranges)

  def _stage_shardings(self, s: int, names: PyTree) -> tuple[PyTree, PyTree]:
    """(parameter, optimizer state) shardings of stage ``s``: each link's parameters by its
    scope's rules, the optimizer state following its parameters, counters replicated."""
    mesh, rules = self.meshes[s], self.layouts[s].rules.params
    stage_names = self.split_tree(names)[s]
    params = {name: param_shardings(self._abstract[s][name], stage_names[name], mesh,
                                    rules.in_scope(name)) for name in self.stage_links[s]}
    trainable = split_trainable(self._abstract[s])[0]  # the optimizer's: float parameters
    opt = optax.tree_map_params(
        self.optimizer, lambda _, sharding: sharding,
        jax.eval_shape(self.optimizer.init, trainable),
        split_trainable(params, like=self._abstract[s])[0],
        transform_non_params=lambda _: self._replicated[s],
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    return params, opt

  # -- state ------------------------------------------------------------------------------------

  def close(self) -> None:
    """Nothing to release: the program holds only compiled functions and arrays."""

  def evaluate(self, state: PipelineState, batch: Batch) -> dict[str, float] | None:
    """``{'loss': mean loss}`` of the host ``batch`` under ``state``'s parameters: the
    schedule's passes over the stages without an update (the gradients are computed and
    dropped: a forward-only schedule is not compiled; the task's other metrics need the whole
    model's outputs, which no stage holds, and are left out). On process 0 and the last
    stage's processes; None elsewhere (every process calls it)."""
    _, loss = self.gradients(state, batch)
    loss = self._loss_on_chief(loss)
    return None if loss is None else {'loss': float(loss)}

  def use_host(self, host: Pace | None) -> None:
    """Pads each of this worker's stage actions to ``host`` (`hetjax.core.Pace.pad_action`:
    a roofline pace per action, `hetjax.emulation.StagePace`, not a cost per row)."""
    self.pace = host

  def init_state(self, params: PyTree | None = None) -> PipelineState:
    """Each local stage's parameters and a fresh optimizer state, on the stage's devices.

    Args:
      params: the model's parameters as its nested pure dict (``nnx.to_pure_dict`` layout, e.g.
        a `hetjax.train.Trainer` state's ``params``); they are copied, never aliased. Only the
        local stages' links are read, so it may hold just those. Default: read from the task's
        ``weights`` where it has them, each parameter onto its stage's devices
        (`hetjax.sharding.initial_params`), else initialised from the seed, equal to the
        unpipelined model's (each process computes its own stages' only).
    """
    weights = self.task.weights
    if params is not None:
      parts = self.split_tree(params, self.local_stages)
    elif weights is not None:  # each link's parameters, read at its path in the whole model
      parts = tuple({name: read_weights(weights, self._abstract[s][name],
                                        self._shardings[s][0][name], tuple(self.paths[name]))
                     for name in self.stage_links[s]} if s in self.local_stages else None
                    for s in range(self.stages))
    else:  # one program per stage: XLA drops the initialisers of the other stages' parameters
      parts = tuple(jax.jit(lambda s=s: self.split_tree(self._init_params())[s],
                            out_shardings=self._shardings[s][0])()
                    if s in self.local_stages else None for s in range(self.stages))
    # The copy matters: device_put onto several devices may alias the caller's buffer on one of
    # them (even with may_alias=False), and train_step donates the parameters.
    started = [(None, None) if p is None else
               jax.jit(self._start, out_shardings=sh)(jax.device_put(p, sh[0]))
               for p, sh in zip(parts, self._shardings, strict=True)]
    return PipelineState(0, *zip(*started, strict=True))

  def _init_params(self) -> PyTree:
    with nnx.use_eager_sharding(False):  # traced within the stage's program
      return nnx.to_pure_dict(nnx.state(self.task.make_model(nnx.Rngs(self.seed))))

  def _start(self, params: PyTree) -> tuple[PyTree, PyTree]:
    return jax.tree.map(jnp.copy, params), self.optimizer.init(split_trainable(params)[0])

  def split_tree(self, tree: PyTree, stages: Sequence[int] | None = None
                 ) -> tuple[dict | None, ...]:
    """Per stage ``{link name: subtree}`` of a tree in the model's pure-dict layout; given
    ``stages``, ``None`` for every other stage (whose links are then never read)."""
    def at(path: Path) -> PyTree:
      node = tree
      for key in path:
        node = node[key]
      return node
    return tuple({name: at(self.paths[name]) for name in names}
                 if stages is None or s in stages else None
                 for s, names in enumerate(self.stage_links))

  def whole_model(self, state: PipelineState) -> nnx.Module | None:
    """The model with ``state``'s parameters, gathered onto this process's first device
    (`hetjax.core.HasModel`); None when some stage lives on another process."""
    if set().union(*self.processes) != {jax.process_index()}:
      return None
    params = jax.device_put(self.merge_tree(state.params), jax.local_devices()[0])
    return nnx.merge(abstract_model(self.task.make_model, self.seed)[0], params)

  def merge_tree(self, per_stage: Sequence[PyTree | None]) -> dict:
    """The model's nested pure dict (``nnx.to_pure_dict(nnx.state(model))`` layout) from
    per-stage trees of parameters or gradients; arrays stay on their stages' devices. ``None``
    stages (owned by other processes) are left out, so the dict holds the local links only."""
    return assemble({k: v for tree in per_stage if tree is not None for k, v in tree.items()},
                    self.paths)

  def global_batch_at(self, step: int) -> Batch:
    """The host global batch of ``step`` (a function of the seed and the step only)."""
    return self.task.data.global_batch(self.seed, step, self.global_batch)

  # -- running a schedule -----------------------------------------------------------------------

  def gradients(self, state: PipelineState, host_batch: Batch, schedule: Schedule | None = None
                ) -> tuple[tuple[PyTree | None, ...], jax.Array | None]:
    """Per-stage gradients of the mean loss over ``host_batch`` and that loss; no update.

    ``schedule`` overrides the trainer's (same stages and micro-batches), e.g. to compare
    schedules on the same compiled programs. Across processes (all make this call), another
    process's stage has ``None`` gradients, and the loss is ``None`` but on the last stage's.
    """
    order = self._order if schedule is None else dispatch_order(
        checked_schedule(schedule, self.stages, self.micro_batches))
    return self._run(state.params, host_batch, order, state.step)

  def train_step(self, state: PipelineState, host_batch: Batch, schedule: Schedule | None = None
                 ) -> tuple[PipelineState, jax.Array | None]:
    """One optimizer step on ``host_batch`` (``state``'s arrays are donated); returns the new
    state and the mean loss over the global batch (on the last stage's devices, else ``None``)."""
    grads, loss = self.gradients(state, host_batch, schedule)
    params, opt_state = list(state.params), list(state.opt_state)
    for s in self.local_stages:
      start = time.perf_counter()
      params[s], opt_state[s] = self._settle(
          self.programs[s].update(params[s], opt_state[s], grads[s]))
      self._pace(state.step, s, 'update', start)
    return PipelineState(state.step + 1, tuple(params), tuple(opt_state)), loss

  def step(self, state: PipelineState, work: Work, decision: None = None
           ) -> tuple[PipelineState, StepStats]:
    """One optimizer step on ``work`` (the `StepProgram` shape); ``state`` is donated.

    Like an SPMD step it does not wait for the devices: ``iter_s`` is the host time since the
    previous step returned, not a speed sample. ``stats.loss`` is on the last stage's devices,
    and also on process 0 (moved there when it has no device of the last stage); other
    processes get None.
    """
    if decision is not None:
      raise ConfigError(f'a pipeline step takes no decision, got {decision!r}')
    start = time.perf_counter()
    state, loss = self.train_step(state, work.batch)
    loss = self._loss_on_chief(loss)
    end = time.perf_counter()
    last = getattr(self, '_last_return', None)
    iter_s, self._last_return = end - (start if last is None else last), end
    return state, StepStats(work.step, (self.global_batch,), (iter_s,), iter_s=iter_s,
                            sampled=(False,), loss=loss)

  def _settle(self, value: PyTree) -> PyTree:
    """``value``, waited for when a stage spans processes: every action (and every move between
    stages) then runs to its end before the next is dispatched. On the CPU backend, programs
    over overlapping sets of processes left in flight together deadlocked (4 processes × 2
    devices, a stage over all of them and one over two: most runs hung; waiting for each, none
    did in the runs since)."""
    return jax.block_until_ready(value) if self._lockstep and value is not None else value

  def _pace(self, step: int, s: int, kind: str, start: float) -> None:
    """Pads the action that began at ``start`` to this worker's host (`pace`)."""
    if self.pace is not None and self._lockstep:
      self.pace.pad_action(step, s, kind, time.perf_counter() - start)

  def _loss_on_chief(self, loss: jax.Array | None) -> jax.Array | None:
    """``loss`` on process 0 as well, where the metrics are written (every process calls this:
    the move may cross processes)."""
    if self._specs is None or 0 in self.processes[-1]:
      return loss
    chief = jax.local_devices(process_index=0)[0]
    there = NamedSharding(jax.sharding.Mesh(np.array([chief]), ('chief',)), PartitionSpec())
    moved = move(loss, jax.ShapeDtypeStruct((), jnp.float32), self._replicated[-1], there)
    return moved if jax.process_index() == 0 else loss

  def abstract_state(self, step: int = 0) -> PipelineState:
    """Shapes, dtypes and shardings of the state at ``step``: a checkpoint's restore target
    (built from a fresh state, so it allocates one)."""
    fresh = self.init_state()
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        dataclasses.replace(fresh, step=step))

  def _run(self, params: tuple[PyTree, ...], host_batch: Batch, order: Sequence[Action],
           step_index: int = 0):
    rows = {len(v) for v in host_batch.values()}
    if rows != {self.global_batch}:
      raise ConfigError(f'batch has {sorted(rows)} rows, the pipeline takes global batch '
                        f'{self.global_batch}')
    last = self.stages - 1
    specs = self._specs(host_batch) if self._specs else (None,) * self.stages
    step = StepTransfers(self._rows, specs, host_batch, self.micro_rows, self._settle,
                         direct=not self._lockstep)
    acc = [self._settle(self.programs[s].zeros()) if s in self.programs else None
           for s in range(self.stages)]
    for action in order:  # all processes walk all of it: the same cross-process puts, in order
      s, m, program = action.stage, action.micro, self.programs.get(action.stage)
      start = time.perf_counter()
      if action.kind == FORWARD:
        if s < last:
          out = program.forward(params[s], step.inputs.get((s, m)),
                                step.batch(s, m)) if program else None
          if program:
            self._settle(out)
            self._pace(step_index, s, 'forward', start)
          step.carry(out, s, m)
        continue
      d_in = None
      if program:
        carry, part = step.inputs.pop((s, m), None), step.batch(s, m, last_use=True)
        if s == last:
          *state, d_in = program.backward(params[s], acc[s], carry, part)
          acc[s] = tuple(state)
        else:
          acc[s], d_in = program.backward(params[s], acc[s], carry, part,
                                          step.cotangents.pop((s, m)))
        self._settle(acc[s])
        self._pace(step_index, s, 'backward', start)
      if s > 0:
        step.cotangent(d_in, s, m)
    loss, acc[last] = (None, None) if acc[last] is None else acc[last]
    return tuple(acc), loss
