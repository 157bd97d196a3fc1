"""`PipelineTrainer`: runs a GPipe or 1F1B schedule, one device group per stage, across processes.

Stages. The model's chain (`HasChain`) is cut into contiguous ranges of links (`split_stages` on
equal costs unless ranges are given), and the devices into as many equal contiguous groups: stage
s owns a 1-D mesh over its group (axis ``'batch'``). Its parameters and optimizer state live
replicated on that mesh, and every micro-batch's rows are split over it, so a stage with several
devices is data-parallel inside (XLA adds the gradient all-reduce).

Programs, compiled once per stage and kept in ``programs[s]``:

* forward ``F_s(params, carry_in, batch) -> carry_out``;
* backward ``B_s(params, acc, carry_in, batch, d_carry_out) -> (acc + d_params, d_carry_in)``.
  It recomputes the stage's forward under `jax.vjp` (GPipe's rematerialisation), so a stage
  keeps only its input carry per micro-batch in flight, never its inner activations. The last
  stage's backward takes no cotangent: it runs forward and ``chain_loss`` and differentiates
  ``Σ losses / global_batch``, so summing over micro-batches gives exactly the gradient of the
  mean loss over the global batch (and the loss itself accumulates to that mean). Its forward
  action therefore runs nothing: the stage keeps its input until the backward.
* ``acc`` is the stage's gradient accumulator (donated, updated in place); ``update_s`` applies
  the optimizer to the stage's own parameters once every micro-batch is done.

Order. The schedule (`gpipe`, `one_f_one_b` or any valid `Schedule`) fixes each stage's order;
actions are dispatched in the order of the schedule's simulated start times, which respects
every dependency. JAX dispatch is asynchronous and each device runs its queue in order, so
stages on different devices overlap as the schedule intends.

Transfers. A carry crosses to stage s + 1 and a cotangent back to stage s − 1 with
``jax.device_put(x, NamedSharding(next_mesh, P('batch')))``; micro-batch rows are placed on each
stage that needs them. The devices may span processes (no stage's group may straddle two). Each
process builds the same trainer, makes the same calls with the same global batch, and walks the
same dispatch order, running only the programs of the stages it owns. A carry or cotangent that
crosses processes is a `jax.device_put` on every process in that order: the sender's array, the
others' shard-less placeholders shaped by `jax.eval_shape` (`hetjax.pipeline._transfer`).
Parameters, optimizer state, gradients and updates stay on their stage's process: per-stage
trees hold ``None`` for other processes' stages, and only the last stage's process gets the loss.

The optimizer runs per stage, so it must act on each parameter on its own (SGD, Adam, AdamW):
transformations that couple all parameters, such as global-norm clipping, would see one stage's
norm only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.core import StepStats, Work
from hetjax.data import Batch
from hetjax.pipeline._chain import Path, assemble, check_chain
from hetjax.pipeline._schedule import (
    BACKWARD,
    FORWARD,
    Action,
    Schedule,
    finish_times,
    positive_int,
)
from hetjax.pipeline._stage_args import checked_schedule, stage_ranges
from hetjax.pipeline._transfer import CarrySpecs, StepTransfers, stage_meshes
from hetjax.sharding import LogicalRules, activation_rules, scope
from hetjax.train import Task

PyTree = Any
AXIS = 'batch'
_RULES = LogicalRules.of({'batch': AXIS})  # inside a stage, only the batch is split


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


@dataclasses.dataclass(frozen=True, eq=False)
class StagePrograms:
  """The jitted programs of one stage (see the module docstring)."""

  forward: Callable[..., PyTree]
  backward: Callable[..., tuple]
  zeros: Callable[[], PyTree]
  update: Callable[..., tuple[PyTree, PyTree]]


def dispatch_order(schedule: Schedule) -> tuple[Action, ...]:
  """Every action of ``schedule`` by simulated start time (forward 1, backward 2 time units),
  ties by stage: an order in which each action comes after all it `Action.needs`.

  Raises:
    ConfigError: if the schedule is invalid or deadlocks.
  """
  schedule.validate()
  cost = {FORWARD: 1.0, BACKWARD: 2.0}
  finish = finish_times(schedule, (cost[FORWARD],) * schedule.stages,
                         (cost[BACKWARD],) * schedule.stages)
  return tuple(sorted(finish, key=lambda a: (finish[a] - cost[a.kind], a.stage)))


class PipelineTrainer:
  """Trains ``task``'s model as a pipeline of stages on disjoint device groups.

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
    stages: a number of stages (links split evenly by count with `split_stages`) or explicit
      ``(start, stop)`` link ranges, e.g. ``split_stages(costs, 2)``.
    micro_batches: micro-batches per step; each has ``global_batch / micro_batches`` rows.
    schedule: ``'gpipe'``, ``'1f1b'`` or a `Schedule` for the same stages and micro-batches.
    devices: the devices, split into equal contiguous groups, one per stage (default: all, of
      every process).
    seed: initialises parameters (as the unpipelined model would) and selects the data.

  Raises:
    ConfigError: a model without a chain, bad stage ranges, devices that do not divide evenly
      over stages, a stage whose devices span processes, a global batch that does not divide
      into micro-batches, or micro-batch rows that do not divide over a stage's devices.
  """

  def __init__(
      self,
      task: Task,
      optimizer: optax.GradientTransformation,
      global_batch: int,
      stages: int | Sequence[tuple[int, int]] = 2,
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
    self.ranges = stage_ranges(stages, len(links))
    self.stage_links = tuple(tuple(link.name for link in links[a:b]) for a, b in self.ranges)
    n = len(self.ranges)
    self.schedule = checked_schedule(schedule, n, self.micro_batches)
    self._order = dispatch_order(self.schedule)

    self.meshes, self.owners = stage_meshes(jax.devices() if devices is None else devices, n, AXIS)
    per = self.meshes[0].size
    if self.global_batch % self.micro_batches:
      raise ConfigError(f'global batch {self.global_batch} does not divide into '
                        f'{self.micro_batches} micro-batches')
    self.micro_rows = self.global_batch // self.micro_batches
    if self.micro_rows % per:
      raise ConfigError(f'micro-batch of {self.micro_rows} rows does not divide over the '
                        f'{per} devices of a stage')
    self._replicated = tuple(NamedSharding(m, PartitionSpec()) for m in self.meshes)
    self._rows = tuple(NamedSharding(m, PartitionSpec(AXIS)) for m in self.meshes)
    self._abstract = tuple(
        {name: nnx.to_pure_dict(nnx.state(self.links[name].module)) for name in names}
        for names in self.stage_links)
    self.local_stages = tuple(s for s in range(n) if self.owners[s] == jax.process_index())
    crosses = len(set(self.owners)) > 1  # then placeholders need the carries' shapes
    self._specs = CarrySpecs(self._apply, self._abstract, self.micro_rows) if crosses else None
    self.programs = {s: self._compile(s) for s in self.local_stages}

  @property
  def stages(self) -> int:
    return len(self.ranges)

  # -- programs ---------------------------------------------------------------------------------

  def _apply(self, s: int, params: PyTree, carry: PyTree, batch: Batch) -> PyTree:
    """Stage ``s``'s links on ``carry`` (traced inside the stage's programs)."""
    with activation_rules(self.meshes[s], _RULES):
      for name in self.stage_links[s]:
        module = nnx.merge(self.graphdefs[name], params[name])
        with scope(name):
          carry = self.links[name].apply(module, carry, batch)
    return carry

  def _backward(self, s: int, params, grads, carry, batch, d_out):
    """``(grads + d_params, d_carry_in)``; stage 0 has no carry to differentiate."""
    if s == 0:
      _, vjp = jax.vjp(lambda p: self._apply(s, p, None, batch), params)
      (d_params,), d_in = vjp(d_out), None
    else:
      _, vjp = jax.vjp(lambda p, c: self._apply(s, p, c, batch), params, carry)
      d_params, d_in = vjp(d_out)
    return jax.tree.map(jnp.add, grads, d_params), d_in

  def _backward_last(self, params, acc, carry, batch):
    """``(loss + Σ losses / X, grads + d_params, d_carry_in)`` for the last stage."""
    s = self.stages - 1
    loss, grads = acc

    def partial_loss(p, c):
      out = self._apply(s, p, c, batch)
      with activation_rules(self.meshes[s], _RULES):
        return jnp.sum(self._chain_loss(out, batch)) / self.global_batch

    if s == 0:
      part, vjp = jax.vjp(lambda p: partial_loss(p, None), params)
      (d_params,), d_in = vjp(jnp.ones_like(part)), None
    else:
      part, vjp = jax.vjp(partial_loss, params, carry)
      d_params, d_in = vjp(jnp.ones_like(part))
    return loss + part, jax.tree.map(jnp.add, grads, d_params), d_in

  def _compile(self, s: int) -> StagePrograms:
    rep, rows = self._replicated[s], self._rows[s]
    abstract = self._abstract[s]

    def zeros():
      grads = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), abstract)
      return (jnp.zeros((), jnp.float32), grads) if s == self.stages - 1 else grads

    def update(params, opt_state, grads):
      updates, opt_state = self.optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    if s == self.stages - 1:
      backward = jax.jit(self._backward_last, out_shardings=(rep, rep, rows), donate_argnums=1)
    else:
      backward = jax.jit(lambda p, acc, c, b, d: self._backward(s, p, acc, c, b, d),
                         out_shardings=(rep, rows), donate_argnums=1)
    return StagePrograms(
        forward=jax.jit(lambda p, c, b: self._apply(s, p, c, b), out_shardings=rows),
        backward=backward,
        zeros=jax.jit(zeros, out_shardings=rep),
        update=jax.jit(update, out_shardings=(rep, rep), donate_argnums=(0, 1)))

  # -- state ------------------------------------------------------------------------------------

  def init_state(self, params: PyTree | None = None) -> PipelineState:
    """Each local stage's parameters and a fresh optimizer state, on the stage's devices.

    Args:
      params: the model's parameters as its nested pure dict (``nnx.to_pure_dict`` layout, e.g.
        a `hetjax.train.Trainer` state's ``params``); they are copied, never aliased. Only the
        local stages' links are read, so it may hold just those. Default: initialised from the
        seed, equal to the unpipelined model's (each process computes its own stages' only).
    """
    if params is not None:
      parts = self.split_tree(params, self.local_stages)
    elif self.local_stages:  # XLA drops the other stages' initialisers: their outputs are unused
      parts = jax.jit(lambda: self.split_tree(self._init_params(), self.local_stages),
                      out_shardings=self._replicated[self.local_stages[0]])()
    else:
      parts = (None,) * self.stages
    # The copy matters: device_put onto several devices may alias the caller's buffer on one of
    # them (even with may_alias=False), and train_step donates the parameters.
    started = [(None, None) if p is None else jax.jit(self._start, out_shardings=rep)(
        jax.device_put(p, rep)) for p, rep in zip(parts, self._replicated, strict=True)]
    return PipelineState(0, *zip(*started, strict=True))

  def _init_params(self) -> PyTree:
    with nnx.use_eager_sharding(False):
      return nnx.to_pure_dict(nnx.state(self.task.make_model(nnx.Rngs(self.seed))))

  def _start(self, params: PyTree) -> tuple[PyTree, PyTree]:
    return jax.tree.map(jnp.copy, params), self.optimizer.init(params)

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
    return self._run(state.params, host_batch, order)

  def train_step(self, state: PipelineState, host_batch: Batch, schedule: Schedule | None = None
                 ) -> tuple[PipelineState, jax.Array | None]:
    """One optimizer step on ``host_batch`` (``state``'s arrays are donated); returns the new
    state and the mean loss over the global batch (on the last stage's devices, else ``None``)."""
    grads, loss = self.gradients(state, host_batch, schedule)
    params, opt_state = list(state.params), list(state.opt_state)
    for s in self.local_stages:
      params[s], opt_state[s] = self.programs[s].update(params[s], opt_state[s], grads[s])
    return PipelineState(state.step + 1, tuple(params), tuple(opt_state)), loss

  def step(self, state: PipelineState, work: Work, decision: None = None
           ) -> tuple[PipelineState, StepStats]:
    """One optimizer step on ``work`` (the `StepProgram` shape); ``state`` is donated.

    Like an SPMD step it does not wait for the devices: ``iter_s`` is the host time since the
    previous step returned, not a speed sample. One process only (``stats.loss`` is on the
    last stage's devices).
    """
    if decision is not None:
      raise ConfigError(f'a pipeline step takes no decision, got {decision!r}')
    start = time.perf_counter()
    state, loss = self.train_step(state, work.batch)
    end = time.perf_counter()
    last = getattr(self, '_last_return', None)
    iter_s, self._last_return = end - (start if last is None else last), end
    return state, StepStats(work.step, (self.global_batch,), (iter_s,), iter_s=iter_s,
                            sampled=(False,), loss=loss)

  def abstract_state(self, step: int = 0) -> PipelineState:
    """Shapes, dtypes and shardings of the state at ``step``: a checkpoint's restore target
    (built from a fresh state, so it allocates one)."""
    fresh = self.init_state()
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        dataclasses.replace(fresh, step=step))

  def _run(self, params: tuple[PyTree, ...], host_batch: Batch, order: Sequence[Action]):
    rows = {len(v) for v in host_batch.values()}
    if rows != {self.global_batch}:
      raise ConfigError(f'batch has {sorted(rows)} rows, the pipeline takes global batch '
                        f'{self.global_batch}')
    last = self.stages - 1
    specs = self._specs(host_batch) if self._specs else (None,) * self.stages
    step = StepTransfers(self._rows, self.owners, specs, host_batch, self.micro_rows)
    acc = [self.programs[s].zeros() if s in self.programs else None for s in range(self.stages)]
    for action in order:  # all processes walk all of it: the same cross-process puts, in order
      s, m, program = action.stage, action.micro, self.programs.get(action.stage)
      if action.kind == FORWARD:
        if s < last:
          out = program.forward(params[s], step.inputs.get((s, m)),
                                step.batch(s, m)) if program else None
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
      if s > 0:
        step.cotangent(d_in, s, m)
    loss, acc[last] = (None, None) if acc[last] is None else acc[last]
    return tuple(acc), loss
