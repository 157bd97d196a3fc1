"""Local SGD over workers (DiLoCo): inner steps with no communication, an outer step a round.

Each worker trains its own copy of the parameters for ``H`` inner steps with the run's
optimizer, on its share of each step's global batch, and exchanges nothing. At the round's end
every worker sends its pseudo-gradient ``θ_start − θ_i`` in one all-reduce, and the outer
optimizer (Nesterov SGD by default, DiLoCo's) applies their average to ``θ_start``:

    Δ = Σᵢ rᵢ (θ_start − θᵢ) / Σᵢ rᵢ        θ ← outer(θ_start, Δ)

where ``rᵢ`` is the rows worker ``i`` trained on during the round: the average weighs each
worker by the samples it contributed, so a worker given fewer rows (or cut short) counts for
less. With ``H = 1``, plain inner SGD and outer SGD at rate 1 this is synchronous data
parallelism exactly: ``θ − η Σᵢ rᵢ gᵢ / X`` is the full batch's gradient step.

**Heterogeneity-aware rounds.** The shares of a step are a share policy's (`hetjax.balance`),
held for a whole round (`hetjax.balance.RoundPolicy`): LB-BSP sizes each worker's rows from its speed, so every
worker's ``H`` inner steps take the same time and the round waits for nobody. The policy learns
once a round, from the round's mean rows and busy time per inner step, which the outer
exchange's head carries to every worker (so every worker decides the same). A worker that turns
slow inside a round is cut (``cutoff``): it starts no inner step that would end past ``cutoff``
× the round's budget (``H`` × the previous round's median busy time per step) and joins the
exchange with the rows it has, weighted by them.

**State.** `LocalState`: the data position at the round's start, the outer parameters, the
outer optimizer's state, and every worker's inner optimizer state stacked over workers
(``'proc'``), so a checkpoint at a round's end resumes exactly. Inside a round this worker's
own parameters and inner state live on its local mesh (`_Round`); the state the loop holds is
the round start's, so a checkpoint taken inside a round saves the round's start, and a resume
runs the round again from its first step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.core import Collective, StepStats, Work, WorkerTiming
from hetjax.train._int8 import gathered_int8_sum, int8_bytes
from hetjax.train._partial import partial_gradient, prepare_upcoming
from hetjax.train._share_programs import Granularity
from hetjax.train._state import TrainState
from hetjax.train._task import Task
from hetjax.train._trainable import merge_trainable, split_trainable
from hetjax.train._worker_mesh import PROC, stacked_spec
from hetjax.train._workers import WorkerTrainer

PyTree = Any

#: DiLoCo's outer optimizer: SGD at 0.7 with Nesterov momentum 0.9 (Douillard et al., 2023).
OUTER_LEARNING_RATE, OUTER_MOMENTUM = 0.7, 0.9


def outer_optimizer(name: str = 'nesterov', learning_rate: float = OUTER_LEARNING_RATE,
                    momentum: float = OUTER_MOMENTUM) -> optax.GradientTransformation:
  """The outer optimizer by name: ``nesterov`` (SGD with Nesterov momentum, DiLoCo's) or
  ``sgd`` (plain: at rate 1 the outer step is the pseudo-gradients' average)."""
  if name == 'nesterov':
    return optax.sgd(learning_rate, momentum=momentum, nesterov=True)
  if name == 'sgd':
    return optax.sgd(learning_rate)
  raise ConfigError(f"unknown outer optimizer {name!r}; choose 'nesterov' or 'sgd'")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalState:
  """What local SGD saves: the state at a round's start.

  Attributes:
    step: inner steps taken (the data position of the round's first step).
    params: the outer parameters (every worker's inner steps start from them), replicated.
    opt_state: the outer optimizer's state.
    inner: every worker's inner optimizer state, stacked along a leading axis of workers and
      split over ``'proc'`` (worker ``i``'s row on worker ``i``'s devices).
  """

  step: jax.Array
  params: PyTree
  opt_state: PyTree
  inner: PyTree

  @classmethod
  def target(cls, outer: TrainState, inner_optimizer: optax.GradientTransformation,
             workers: int, sharding: jax.sharding.Sharding) -> LocalState:
    """A restore target from ``outer`` (the abstract `TrainState` of the outer optimizer), the
    run's inner optimizer and its worker count, the inner state placed by ``sharding`` (e.g.
    replicated on one process's devices, as `hetjax.run.load_model` reads a run)."""
    abstract = jax.eval_shape(inner_optimizer.init, split_trainable(outer.params)[0])
    inner = jax.tree.map(lambda a: jax.ShapeDtypeStruct((workers, *a.shape), a.dtype,
                                                        sharding=sharding), abstract)
    return cls(outer.step, outer.params, outer.opt_state, inner)


@dataclasses.dataclass
class _Round:
  """This worker's round in progress: its parameters and inner state on its local mesh, and
  what it has done so far."""

  start: int
  params: PyTree
  opt_state: PyTree
  loss: Any = 0.0          # Σ over its inner steps of mean loss × rows (device scalar)
  rows: int = 0
  busy_s: float = 0.0
  last_busy_s: float = 0.0
  compile_s: float = 0.0
  sampled: bool = True
  exact: bool = True
  load: float = 0.0


class LocalTrainer(WorkerTrainer):
  """Local SGD (DiLoCo) over the job's workers: ``steps_per_round`` inner steps with
  ``optimizer``, then one outer step of ``outer`` on the rows-weighted pseudo-gradient.

  Example (in every worker)::

    trainer = LocalTrainer(task, optax.adamw(1e-3), global_batch=256, steps_per_round=50)
    policy = balance.RoundPolicy(balance.make_policy('lbbsp', rules), 50)  # sized once a round
    for info in training_steps(trainer, trainer.init_state(), 500, policy=policy):
      pass

  Args:
    task, optimizer, global_batch, local_shape, rules, seed, bucket, host, accumulate,
      granularity: as `WorkerTrainer`'s; ``optimizer`` is the inner one, and each worker's
      inner step is the mean over its own rows.
    steps_per_round: inner steps between outer steps (H); the run's steps and checkpoints
      fall on its multiples.
    outer: the outer optimizer, any optax transformation of the pseudo-gradient (default
      `outer_optimizer`'s Nesterov SGD).
    cutoff: stop a worker's round once its next inner step would end past ``cutoff`` × the
      round's budget (0: never).
    int8: exchange the pseudo-gradients in 8 bits (`hetjax.train._int8`: a scale a block,
      all-gathered, summed dequantized): a quarter of the bytes, one ring pass; the head (loss,
      rows, times) exactly. Only where every parameter is whole inside a worker (data
      parallel), as the one fused buffer carries them.

  Raises:
    ConfigError: workers of different device counts, or a bad ``steps_per_round``/``cutoff``.
  """

  def __init__(
      self,
      task: Task,
      optimizer: optax.GradientTransformation,
      global_batch: int,
      local_shape: tuple[int, int] | None = None,
      rules=None,
      seed: int = 0,
      bucket: int | None = None,
      host=None,
      *,
      steps_per_round: int,
      outer: optax.GradientTransformation | None = None,
      cutoff: float = 0.0,
      int8: bool = False,
      accumulate: int = 1,
      granularity: Granularity | str = Granularity.COMPILE,
  ):
    if int(steps_per_round) != steps_per_round or steps_per_round < 1:
      raise ConfigError(f'local.steps (inner steps a round) must be a positive integer, got '
                        f'{steps_per_round!r}')
    if not (cutoff == 0 or cutoff >= 1):
      raise ConfigError(f'local.cutoff must be 0 (never cut) or >= 1 (times the round\'s '
                        f'budget), got {cutoff!r}')
    super().__init__(task, outer or outer_optimizer(), global_batch, local_shape, rules, seed,
                     bucket, host, accumulate=accumulate, granularity=granularity)
    if self._axis != PROC:
      raise ConfigError('local SGD needs workers of equal device counts (each keeps its own '
                        'copy of the model and inner state on its own devices)')
    self.inner_optimizer, self.steps_per_round, self.cutoff = optimizer, int(steps_per_round), \
        float(cutoff)
    self._round: _Round | None = None
    self._budget_s = math.inf
    trainable = split_trainable(self.layout.abstract.params)[0]
    local_params = jax.tree.map(lambda s: NamedSharding(self.local_mesh, s),
                                split_trainable(self.layout.param_specs,
                                                like=self.layout.abstract.params)[0])
    self._inner_abstract = jax.eval_shape(optimizer.init, trainable)
    self._inner_local = optax.tree_map_params(
        optimizer, lambda _, sharding: sharding, self._inner_abstract, local_params,
        transform_non_params=lambda _: self._local_replicated,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    self._inner_stacked = jax.tree.map(
        lambda a, s: NamedSharding(self.mesh, stacked_spec(s.spec, a.ndim + 1)),
        self._inner_abstract, self._inner_local)
    params_local = jax.tree.map(lambda s: NamedSharding(self.local_mesh, s),
                                self.layout.param_specs)
    self._copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=params_local)
    self._row = jax.jit(lambda t: jax.tree.map(lambda x: x[None], t))
    self._unrow = jax.jit(lambda t: jax.tree.map(lambda x: x[0], t),
                          out_shardings=self._inner_local)
    self._init_inner = jax.jit(lambda p: optimizer.init(split_trainable(p)[0]),
                               out_shardings=self._inner_local)
    self._inner_step = jax.jit(self._inner_update, donate_argnums=(0, 1),
                               out_shardings=(params_local, self._inner_local,
                                              self._local_replicated))
    self._pseudo = jax.jit(self._pseudo_gradient, out_shardings=self._local_out)
    if int8 and self.fused_layout.separate:
      raise ConfigError('local.exchange=int8 needs every parameter whole inside a worker (data '
                        'parallel inside it): this layout splits some; use float32 or '
                        '--strategy=data_parallel')
    self.int8 = bool(int8)
    self._outer = self._combine_program(self._outer_update_int8 if int8 else self._outer_update)

  # -- state -------------------------------------------------------------------------------------

  def init_state(self) -> LocalState:
    """The outer state `WorkerTrainer.init_state` makes, and every worker's fresh inner state."""
    outer = super().init_state()
    inner = self._init_inner(self.local_view(outer.params))
    return LocalState(outer.step, outer.params, outer.opt_state, self._stack_rows(inner))

  def abstract_state(self) -> LocalState:
    outer = self.layout.abstract_state()
    inner = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct((self.workers, *a.shape), a.dtype, sharding=s),
        self._inner_abstract, self._inner_stacked)
    return LocalState(outer.step, outer.params, outer.opt_state, inner)

  def _stack_rows(self, inner: PyTree) -> PyTree:
    """This worker's inner state as its row of the stacked global arrays (no copy beyond the
    leading axis)."""
    rows = self._row(inner)
    return jax.tree.map(
        lambda x, a, s: jax.make_array_from_single_device_arrays(
            (self.workers, *a.shape), s, [shard.data for shard in x.addressable_shards]),
        rows, self._inner_abstract, self._inner_stacked)

  def _own_row(self, stacked: PyTree) -> PyTree:
    """This worker's row of the stacked inner state, as arrays on its local mesh (a copy)."""
    def local(x, s):
      sharding = NamedSharding(self.local_mesh, PartitionSpec(*s.spec))
      return jax.make_array_from_single_device_arrays(
          (1, *x.shape[1:]), sharding, [shard.data for shard in x.addressable_shards])
    return self._unrow(jax.tree.map(local, stacked, self._local_row_specs(stacked)))

  def _local_row_specs(self, stacked: PyTree) -> PyTree:
    """The local-mesh sharding of one row of each stacked leaf: its spec without ``'proc'``."""
    def spec(x):
      entries = list(x.sharding.spec) + [None] * (x.ndim - len(x.sharding.spec))
      first = entries[0]
      first = tuple(a for a in ((first,) if isinstance(first, str) else first or ()) if a != PROC)
      return NamedSharding(self.local_mesh, PartitionSpec(first or None, *entries[1:]))
    return jax.tree.map(spec, stacked)

  # -- the programs ------------------------------------------------------------------------------

  def _inner_update(self, params: PyTree, opt_state: PyTree, fused: jax.Array,
                    separate: list[jax.Array], scale: jax.Array):
    """One inner step from a packed ``Σ ∇ / X`` over this worker's rows: its mean gradient is
    that times ``scale`` = X / rows. Returns (params, inner state, mean loss)."""
    head, grads = self.fused_layout.unpack(fused, separate)
    grads = jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)
    trainable, fixed = split_trainable(params)
    updates, opt_state = self.inner_optimizer.update(grads, opt_state, trainable)
    return (merge_trainable(optax.apply_updates(trainable, updates), fixed), opt_state,
            head[0] * scale)

  def _pseudo_gradient(self, start: PyTree, params: PyTree, loss: jax.Array, weight: jax.Array):
    """``weight × (θ_start − θ)`` packed for the exchange, ``loss`` in the head."""
    delta = jax.tree.map(lambda a, b: (weight * (a.astype(jnp.float32) - b.astype(jnp.float32))
                                       ).astype(a.dtype),
                         split_trainable(start)[0], split_trainable(params)[0])
    return self.fused_layout.pack(loss, delta)

  def _outer_update(self, state: TrainState, fused: jax.Array, separate: list[jax.Array]):
    """The sum over workers (`WorkerTrainer`'s combine), divided by the rows they trained on,
    and the outer optimizer's step; the head's loss is the rows-weighted mean."""
    return self._outer_step(state, *self._summed(fused, separate))

  def _outer_update_int8(self, state: TrainState, fused: jax.Array, separate: list[jax.Array]):
    """`_outer_update` with the pseudo-gradients exchanged in 8 bits (`gathered_int8_sum`),
    the head exactly."""
    head = self.fused_layout.head

    def total(f):
      return jnp.concatenate([lax.psum(f[:head], PROC), gathered_int8_sum(f[head:], PROC)])

    summed = jax.shard_map(total, mesh=self.mesh, in_specs=PartitionSpec(PROC),
                           out_specs=PartitionSpec(), check_vma=False)(fused)
    return self._outer_step(state, *self.fused_layout.unpack(summed, separate))

  def _outer_step(self, state: TrainState, head: jax.Array, summed: PyTree):
    rows = head[np.asarray([self._layout_head.slots(w)[3] for w in range(self.workers)])]
    total = jnp.maximum(rows.sum(), 1e-30)
    grads = jax.tree.map(lambda g: (g / total).astype(g.dtype), summed)
    return state.apply_gradients(self.optimizer, grads), head.at[0].set(head[0] / total)

  @property
  def exchange_bytes(self) -> int:
    """Bytes one worker sends in an outer exchange: the all-reduce's buffer, or in 8 bits each
    worker's part of the all-gather (and the head)."""
    if not self.int8:
      return self.all_reduce_bytes
    head = self.fused_layout.head
    return 4 * head + int8_bytes(self.fused_size - head)

  def _exchange_time(self):
    """The emulated links' time of an outer exchange around it (nothing without them)."""
    if self.pace is None:
      return contextlib.nullcontext()
    if self.int8:
      return self.pace.exchange(self.exchange_bytes, Collective.ALL_GATHER)
    return self.pace.exchange(self.all_reduce_bytes)

  # -- a step ------------------------------------------------------------------------------------

  def local_gradient(self, state, batch):
    """``Σ ∇ / X`` over this worker's rows at its own round's parameters (outside a round, as a
    speed probe runs it: at ``state``'s)."""
    if self._round is None:
      return super().local_gradient(state, batch)
    rows = len(next(iter(batch.values())))
    if rows == 0:
      self.programs.last_compile_s = 0.0
      return self._zero()
    return self.programs(self._add, self._round.params, batch)

  def whole_model(self, state: LocalState) -> nnx.Module:
    """The model with the outer parameters (the round start's)."""
    return nnx.merge(self.graphdef, self.local_view(state.params))

  def _begin(self, state: LocalState, step: int) -> _Round:
    if step % self.steps_per_round:
      raise ConfigError(f'local SGD resumes at a round\'s start: step {step} is not a multiple '
                        f'of local.steps {self.steps_per_round}')
    return _Round(step, self._copy(self.local_view(state.params)), self._own_row(state.inner))

  def step(self, state: LocalState, work: Work, shares) -> tuple[LocalState, StepStats]:
    """One inner step of this worker's on its rows of ``work``; at a round's last step, the
    outer exchange and update too (every worker joins it)."""
    s, h = work.step, self.steps_per_round
    if self._round is None or not self._round.start <= s < self._round.start + h:
      self._round = self._begin(state, s)
    rnd = self._round
    shares = tuple(int(x) for x in shares) if shares is not None else None
    prepare_upcoming(self, shares)
    start = time.perf_counter()
    first = s == rnd.start
    cut = (self.cutoff > 0 and not first
           and rnd.busy_s + rnd.last_busy_s > self.cutoff * self._budget_s)
    data_s = compute_s = slept = compile_s = 0.0
    rows = 0
    if not cut:
      part = partial_gradient(self, state, work, shares)
      rows, data_s, compile_s = part.rows, part.data_s, part.compile_s
      began = time.perf_counter()
      if rows:
        rnd.params, rnd.opt_state, loss = self._inner_step(
            rnd.params, rnd.opt_state, *part.packed,
            jnp.float32(self.global_batch / rows))
        jax.block_until_ready(rnd.params)
        rnd.loss = rnd.loss + loss * rows
      compute_s, slept = part.compute_s + time.perf_counter() - began, part.slept
      rnd.rows += rows
      rnd.last_busy_s = compute_s + slept
      rnd.busy_s += rnd.last_busy_s
      rnd.compile_s += part.compiled_s
      rnd.sampled &= part.sampled
      rnd.exact &= part.exact
      rnd.load = part.load
    if s + 1 < rnd.start + h:
      end = time.perf_counter()
      local = WorkerTiming(step=s + 1, worker=self.worker, share=rows, slowdown=1.0,
                           data_s=data_s, compute_s=compute_s, dilation_s=slept,
                           collective_s=0.0, step_s=end - start, compile_s=compile_s)
      own = [0.0] * self.workers
      own[self.worker] = compute_s + slept
      return state, StepStats(s, shares, tuple(own), iter_s=end - start,
                              sampled=(False,) * self.workers, compile_s=compile_s,
                              loss=jnp.float32(math.nan) if not rows else loss, local=local)
    return self._exchange(state, rnd, s, start, data_s, compute_s, slept, compile_s, rows)

  def _exchange(self, state: LocalState, rnd: _Round, s: int, start: float, data_s: float,
                compute_s: float, slept: float, compile_s: float, rows: int):
    h = self.steps_per_round
    weight = rnd.rows / h
    packed = self._pseudo(self.local_view(state.params), rnd.params,
                          jnp.float32(0.0) + rnd.loss / h, jnp.float32(weight))
    fused, separate = self.stacked(packed, busy_s=rnd.busy_s / h, load=rnd.load,
                                   sampled=2.0 if rnd.exact else float(rnd.sampled), rows=weight,
                                   compile_s=rnd.compile_s)
    inner = self._stack_rows(rnd.opt_state)
    combine = time.perf_counter()
    with self._exchange_time():
      outer, head = jax.block_until_ready(self._outer(
          TrainState(state.step, state.params, state.opt_state), fused, separate))
    end = time.perf_counter()
    self._round = None
    head = self.read_head(head)
    self._budget_s = h * statistics.median(head['busy_s'].tolist())
    local = WorkerTiming(step=s + 1, worker=self.worker, share=rows, slowdown=1.0,
                         data_s=data_s, compute_s=compute_s, dilation_s=slept,
                         collective_s=end - combine, step_s=end - start, compile_s=compile_s)
    step = jax.device_put(np.int32(s + 1), self.layout.shardings.step)
    stats = dataclasses.replace(self.stats(s, head, end - start, compile_s, local),
                                bytes=self.exchange_bytes)
    return LocalState(step, outer.params, outer.opt_state, inner), stats
