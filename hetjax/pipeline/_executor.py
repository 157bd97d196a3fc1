"""`PipelineTrainer`: runs a GPipe or 1F1B schedule in this process, one device group per stage.

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
stage that needs them.

The optimizer runs per stage, so it must act on each parameter on its own (SGD, Adam, AdamW):
transformations that couple all parameters, such as global-norm clipping, would see one stage's
norm only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.data import Batch
from hetjax.pipeline._chain import Path, assemble, check_chain
from hetjax.pipeline._schedule import (
    BACKWARD,
    FORWARD,
    Action,
    Schedule,
    finish_times,
    gpipe,
    one_f_one_b,
    positive_int,
)
from hetjax.pipeline._split import split_stages
from hetjax.sharding import LogicalRules, activation_rules, make_mesh, scope
from hetjax.train import Task

PyTree = Any
AXIS = 'batch'
SCHEDULES: dict[str, Callable[[int, int], Schedule]] = {'gpipe': gpipe, '1f1b': one_f_one_b}
_RULES = LogicalRules.of({'batch': AXIS})  # inside a stage, only the batch is split


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PipelineState:
  """Per-stage parameters and optimizer state, each on its stage's devices.

  Attributes:
    step: optimizer steps taken (a host int: it is also the data position).
    params: per stage, ``{link name: the link module's pure dict}``.
    opt_state: per stage, the optax state of that stage's parameters.
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
  """Trains ``task``'s model as a pipeline of stages on disjoint device groups of this process.

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
    devices: the devices, split into equal contiguous groups, one per stage (default: all).
    seed: initialises parameters (as the unpipelined model would) and selects the data.

  Raises:
    ConfigError: a model without a chain, bad stage ranges, devices that do not divide evenly
      over stages, a global batch that does not divide into micro-batches, or micro-batch rows
      that do not divide over a stage's devices.
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
    self.ranges = _stage_ranges(stages, len(links))
    self.stage_links = tuple(tuple(link.name for link in links[a:b]) for a, b in self.ranges)
    n = len(self.ranges)
    self.schedule = _schedule(schedule, n, self.micro_batches)
    self._order = dispatch_order(self.schedule)

    devices = list(jax.devices() if devices is None else devices)
    if not devices or len(devices) % n:
      raise ConfigError(f'{len(devices)} devices do not split evenly over {n} stages')
    per = len(devices) // n
    if self.global_batch % self.micro_batches:
      raise ConfigError(f'global batch {self.global_batch} does not divide into '
                        f'{self.micro_batches} micro-batches')
    self.micro_rows = self.global_batch // self.micro_batches
    if self.micro_rows % per:
      raise ConfigError(f'micro-batch of {self.micro_rows} rows does not divide over the '
                        f'{per} devices of a stage')
    self.meshes = tuple(make_mesh((per,), (AXIS,), devices[s * per:(s + 1) * per])
                        for s in range(n))
    self._replicated = tuple(NamedSharding(m, PartitionSpec()) for m in self.meshes)
    self._rows = tuple(NamedSharding(m, PartitionSpec(AXIS)) for m in self.meshes)
    self._abstract = tuple(
        {name: nnx.to_pure_dict(nnx.state(self.links[name].module)) for name in names}
        for names in self.stage_links)
    self.programs = {s: self._compile(s) for s in range(n)}

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
    """Each stage's parameters and a fresh optimizer state, on the stage's devices.

    Args:
      params: the model's parameters as its nested pure dict (``nnx.to_pure_dict`` layout, e.g.
        a `hetjax.train.Trainer` state's ``params``); they are copied, never aliased. Default:
        initialised from the seed, equal to the unpipelined model's.
    """
    if params is None:
      params = jax.jit(self._init_params, out_shardings=self._replicated[0])()
    # The copy matters: device_put onto several devices may alias the caller's buffer on one of
    # them (even with may_alias=False), and train_step donates the parameters.
    parts, opt_state = zip(*(
        jax.jit(self._start, out_shardings=self._replicated[s])(
            jax.device_put(p, self._replicated[s]))
        for s, p in enumerate(self.split_tree(params))), strict=True)
    return PipelineState(0, parts, opt_state)

  def _init_params(self) -> PyTree:
    with nnx.use_eager_sharding(False):
      return nnx.to_pure_dict(nnx.state(self.task.make_model(nnx.Rngs(self.seed))))

  def _start(self, params: PyTree) -> tuple[PyTree, PyTree]:
    return jax.tree.map(jnp.copy, params), self.optimizer.init(params)

  def split_tree(self, tree: PyTree) -> tuple[dict, ...]:
    """Per stage ``{link name: subtree}`` of a tree in the model's pure-dict layout."""
    def at(path: Path) -> PyTree:
      node = tree
      for key in path:
        node = node[key]
      return node
    return tuple({name: at(self.paths[name]) for name in names} for names in self.stage_links)

  def merge_tree(self, per_stage: Sequence[PyTree]) -> dict:
    """The model's nested pure dict (``nnx.to_pure_dict(nnx.state(model))`` layout) from
    per-stage trees of parameters or gradients; arrays stay on their stages' devices."""
    return assemble({k: v for tree in per_stage for k, v in tree.items()}, self.paths)

  def global_batch_at(self, step: int) -> Batch:
    """The host global batch of ``step`` (a function of the seed and the step only)."""
    return self.task.data.global_batch(self.seed, step, self.global_batch)

  # -- running a schedule -----------------------------------------------------------------------

  def gradients(self, state: PipelineState, host_batch: Batch,
                schedule: Schedule | None = None) -> tuple[tuple[PyTree, ...], jax.Array]:
    """Per-stage gradients of the mean loss over ``host_batch`` and that loss; no update.

    ``schedule`` overrides the trainer's (same stages and micro-batches), e.g. to compare
    schedules on the same compiled programs.
    """
    order = self._order if schedule is None else dispatch_order(
        _schedule(schedule, self.stages, self.micro_batches))
    return self._run(state.params, host_batch, order)

  def train_step(self, state: PipelineState, host_batch: Batch,
                 schedule: Schedule | None = None) -> tuple[PipelineState, jax.Array]:
    """One optimizer step on ``host_batch`` (``state``'s arrays are donated); returns the new
    state and the mean loss over the global batch (on the last stage's devices)."""
    grads, loss = self.gradients(state, host_batch, schedule)
    params, opt_state = zip(*(
        self.programs[s].update(state.params[s], state.opt_state[s], grads[s])
        for s in range(self.stages)), strict=True)
    return PipelineState(state.step + 1, tuple(params), tuple(opt_state)), loss

  def _run(self, params: tuple[PyTree, ...], host_batch: Batch, order: Sequence[Action]):
    rows = {len(v) for v in host_batch.values()}
    if rows != {self.global_batch}:
      raise ConfigError(f'batch has {sorted(rows)} rows, the pipeline takes global batch '
                        f'{self.global_batch}')
    last = self.stages - 1
    acc = [self.programs[s].zeros() for s in range(self.stages)]
    inputs: dict[tuple[int, int], PyTree] = {}  # (stage, micro) → carry in, kept for backward
    cotangents: dict[tuple[int, int], PyTree] = {}  # (stage, micro) → d carry out
    batches: dict[tuple[int, int], Batch] = {}

    def batch(s: int, m: int) -> Batch:
      if (s, m) not in batches:
        part = {k: v[m * self.micro_rows:(m + 1) * self.micro_rows] for k, v in host_batch.items()}
        batches[s, m] = jax.device_put(part, self._rows[s])
      return batches[s, m]

    for action in order:
      s, m, program = action.stage, action.micro, self.programs[action.stage]
      if action.kind == FORWARD:
        if s < last:
          out = program.forward(params[s], inputs.get((s, m)), batch(s, m))
          inputs[s + 1, m] = jax.device_put(out, self._rows[s + 1])
        continue
      if s == last:
        *state, d_in = program.backward(params[s], acc[s], inputs.pop((s, m), None), batch(s, m))
        acc[s] = tuple(state)
      else:
        acc[s], d_in = program.backward(params[s], acc[s], inputs.pop((s, m), None), batch(s, m),
                                        cotangents.pop((s, m)))
      del batches[s, m]
      if s > 0:
        cotangents[s - 1, m] = jax.device_put(d_in, self._rows[s - 1])
    loss, acc[last] = acc[last]
    return tuple(acc), loss


def _stage_ranges(stages: int | Sequence[tuple[int, int]], links: int) -> tuple[tuple[int, int], ...]:
  """Contiguous non-empty link ranges covering ``0 … links − 1``, or a `ConfigError`."""
  if isinstance(stages, (int, np.integer)) and not isinstance(stages, bool):
    return split_stages([1.0] * links, int(stages))
  ranges = tuple(tuple(r) for r in stages)
  edges = [0]
  for r in ranges:
    if len(r) != 2 or r[0] != edges[-1] or r[1] <= r[0]:
      raise ConfigError(f'stage ranges {ranges} are not contiguous non-empty (start, stop) pairs '
                        f'from 0 to {links}')
    edges.append(r[1])
  if not ranges or edges[-1] != links:
    raise ConfigError(f'stage ranges {ranges} do not cover the {links} links of the chain')
  return ranges


def _schedule(schedule: str | Schedule, stages: int, micro: int) -> Schedule:
  """The schedule for ``stages`` and ``micro`` micro-batches, by name or checked as given."""
  if isinstance(schedule, str):
    if schedule not in SCHEDULES:
      raise ConfigError(f'unknown schedule {schedule!r}; choose one of: {", ".join(SCHEDULES)}')
    return SCHEDULES[schedule](stages, micro)
  if (schedule.stages, schedule.micro_batches) != (stages, micro):
    raise ConfigError(f'schedule {schedule.name!r} is for {schedule.stages} stages and '
                      f'{schedule.micro_batches} micro-batches, not {stages} and {micro}')
  schedule.validate()
  return schedule
