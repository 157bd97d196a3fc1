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

**Streaming** (``overlap_steps`` τ, ``fragments``). A round's exchange leaves at its end, in
fragments of the fused buffer (one collective each, each paced by the links), on a background
thread, while every worker goes on from its own parameters. It lands τ steps into the next
round: each worker takes θ_new + (θ − θ_sent), the outer parameters and the inner steps it took
since. The state at a round's end holds the outer state before that exchange and the exchange
itself pending (each worker's buffer and θ_sent), so a checkpoint of it resumes exactly (the
exchange is sent again); `settle` waits for its collectives before a caller issues its own.
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
from hetjax.train._background import Background
from hetjax.train._head import StepHead
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
  pending: PyTree = None

  @classmethod
  def target(cls, outer: TrainState, inner_optimizer: optax.GradientTransformation,
             workers: int, sharding: jax.sharding.Sharding, overlap: bool = False
             ) -> LocalState:
    """A restore target from ``outer`` (the abstract `TrainState` of the outer optimizer), the
    run's inner optimizer and its worker count, the inner state placed by ``sharding`` (e.g.
    replicated on one process's devices, as `hetjax.run.load_model` reads a run); ``overlap``:
    the run overlapped its exchanges (``local.overlap_steps``), so it saved them pending."""
    trainable = split_trainable(outer.params)[0]
    abstract = jax.eval_shape(inner_optimizer.init, trainable)

    def stacked(a, rows=workers):
      return jax.ShapeDtypeStruct((rows, *a.shape), a.dtype, sharding=sharding)

    pending = None
    if overlap:
      size = StepHead(workers).size + sum(math.prod(a.shape) for a in jax.tree.leaves(trainable))
      pending = {'fused': jax.ShapeDtypeStruct((workers * size,), jnp.float32,
                                               sharding=sharding),
                 'at_send': jax.tree.map(stacked, trainable)}
    return cls(outer.step, outer.params, outer.opt_state, jax.tree.map(stacked, abstract),
               pending)


@dataclasses.dataclass
class _Inflight:
  """An outer exchange running on the background thread: its future, the step after which it
  lands, and this worker's parameters when it was sent (local arrays)."""

  future: Any
  land: int
  at_send: PyTree


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
    overlap_steps: streaming: a round's exchange runs on a background thread and lands this
      many steps into the next round, each worker rebasing its parameters onto the new outer
      ones (θ_new + θ − θ_sent); the state at a round's end then holds it pending (module
      docstring). 0: the exchange blocks.
    fragments: the exchange in about this many pieces of the fused buffer, one collective each,
      each paced by the links.

  Raises:
    ConfigError: workers of different device counts, a bad ``steps_per_round``, ``cutoff``,
      ``overlap_steps`` or ``fragments``, or int8, overlap or fragments with parameters split
      inside a worker.
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
      overlap_steps: int = 0,
      fragments: int = 1,
      accumulate: int = 1,
      granularity: Granularity | str = Granularity.COMPILE,
  ):
    if int(steps_per_round) != steps_per_round or steps_per_round < 1:
      raise ConfigError(f'local.inner_steps (inner steps a round) must be a positive integer, '
                        f'got {steps_per_round!r}')
    if not 0 <= overlap_steps < steps_per_round:
      raise ConfigError(f'local.overlap_steps ({overlap_steps}) must be in [0, local.inner_steps '
                        f'({steps_per_round})): an exchange lands inside the next round')
    if fragments < 1:
      raise ConfigError(f'local.fragments must be >= 1, got {fragments}')
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
    self._inner_ran = False
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
    # Streaming: the exchange in fragments synced in turn, on a background thread while the
    # next round's first overlap_steps inner steps run.
    self.overlap_steps, self.fragments = int(overlap_steps), int(fragments)
    if (self.overlap_steps or self.fragments > 1) and self.fused_layout.separate:
      raise ConfigError('local.overlap_steps and local.fragments need every parameter whole '
                        'inside a worker (data parallel inside it): this layout splits some')
    self._bounds = self.fused_layout.buckets(
        -(-4 * self.fused_size // self.fragments) if self.fragments > 1 else None)
    self._pieces = [self._piece_program(a, b) for a, b in self._bounds]
    self._apply_outer = jax.jit(
        lambda train, pieces: self._outer_step(
            train, *self.fused_layout.unpack(jnp.concatenate(pieces), [])),
        out_shardings=(self.layout.shardings, NamedSharding(self.mesh, PartitionSpec())))
    trainable_local = split_trainable(params_local, like=self.layout.abstract.params)[0]
    self._rebase = jax.jit(self._rebased, donate_argnums=1, out_shardings=params_local)
    self._params_abstract = trainable
    self._unrow_params = jax.jit(lambda t: jax.tree.map(lambda x: x[0], t),
                                 out_shardings=trainable_local)
    self._params_stacked = jax.tree.map(
        lambda a, s: NamedSharding(self.mesh, stacked_spec(s.spec, a.ndim + 1)),
        trainable, trainable_local)
    self._background = Background('local-exchange')
    self._inflight: _Inflight | None = None
    self._anchor: TrainState | None = None     # the round's outer state, once known
    self._carry: tuple[int, PyTree, PyTree] | None = None   # (next round, params, inner state)

  # -- state -------------------------------------------------------------------------------------

  def init_state(self) -> LocalState:
    """The outer state `WorkerTrainer.init_state` makes, and every worker's fresh inner state
    (and, overlapping, an empty pending exchange: no rows in its head)."""
    outer = super().init_state()
    local = self.local_view(outer.params)
    pending = None
    if self.overlap_steps:
      pending = {'fused': self._stack_fused(self._zero()[0]),
                 'at_send': self._stack_rows(split_trainable(self._copy(local))[0],
                                             self._params_abstract, self._params_stacked)}
    return LocalState(outer.step, outer.params, outer.opt_state,
                      self._stack_rows(self._init_inner(local)), pending)

  def abstract_state(self) -> LocalState:
    outer = self.layout.abstract_state()

    def stacked(a, s):
      return jax.ShapeDtypeStruct((self.workers, *a.shape), a.dtype, sharding=s)

    pending = None
    if self.overlap_steps:
      pending = {'fused': jax.ShapeDtypeStruct((self.workers * self.fused_size,), jnp.float32,
                                               sharding=self._fused_stacked),
                 'at_send': jax.tree.map(stacked, self._params_abstract, self._params_stacked)}
    return LocalState(outer.step, outer.params, outer.opt_state,
                      jax.tree.map(stacked, self._inner_abstract, self._inner_stacked), pending)

  def settle(self) -> None:
    """Waits until an exchange in flight has finished its collectives (it still lands at its
    step): what a caller does before collectives of its own, such as a checkpoint's."""
    if self._inflight is not None:
      self._inflight.future.exception()

  def close(self) -> None:
    """Waits for an exchange in flight, then drops queued background compiles."""
    if self._inflight is not None:
      self._inflight.future.exception()
      self._inflight = None
    self._background.close()
    super().close()

  def _stack_rows(self, tree: PyTree, abstract: PyTree = None, shardings: PyTree = None
                  ) -> PyTree:
    """This worker's ``tree`` (by default its inner state) as its row of the stacked global
    arrays (no copy beyond the leading axis)."""
    abstract = self._inner_abstract if abstract is None else abstract
    shardings = self._inner_stacked if shardings is None else shardings
    rows = self._row(tree)
    return jax.tree.map(
        lambda x, a, s: jax.make_array_from_single_device_arrays(
            (self.workers, *a.shape), s, [shard.data for shard in x.addressable_shards]),
        rows, abstract, shardings)

  def _own_row(self, stacked: PyTree, unrow=None) -> PyTree:
    """This worker's row of a stacked tree (by default the inner state), as arrays on its local
    mesh (a copy)."""
    def local(x, s):
      sharding = NamedSharding(self.local_mesh, PartitionSpec(*s.spec))
      return jax.make_array_from_single_device_arrays(
          (1, *x.shape[1:]), sharding, [shard.data for shard in x.addressable_shards])
    return (unrow or self._unrow)(jax.tree.map(local, stacked, self._local_row_specs(stacked)))

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

  def _piece_program(self, a: int, b: int):
    """Elements ``[a, b)`` of every worker's fused buffer summed over workers (the head's
    exactly, the rest in 8 bits under ``int8``): one fragment of a streamed exchange."""
    head = self.fused_layout.head

    def total(f):
      parts = []
      if a < head:
        parts.append(lax.psum(f[a:min(b, head)], PROC))
      if b > max(a, head):
        rest = f[max(a, head):b]
        parts.append(gathered_int8_sum(rest, PROC) if self.int8 else lax.psum(rest, PROC))
      return jnp.concatenate(parts)

    return jax.jit(jax.shard_map(total, mesh=self.mesh, in_specs=PartitionSpec(PROC),
                                 out_specs=PartitionSpec(), check_vma=False))

  def _rebased(self, new: PyTree, now: PyTree, sent: PyTree) -> PyTree:
    """θ_new + (θ_now − θ_sent): the landed outer parameters and the inner steps taken since
    the exchange left (the other leaves as they are now)."""
    fixed = split_trainable(now)[1]
    moved = jax.tree.map(lambda a, b, c: (a + (b - c)).astype(a.dtype), split_trainable(new)[0],
                         split_trainable(now)[0], split_trainable(sent)[0])
    return merge_trainable(moved, fixed)

  def _reduce(self, anchor: TrainState, fused: jax.Array) -> tuple[TrainState, jax.Array]:
    """The outer exchange in fragments, one after the other, each paced by the links, then the
    outer step: (the new outer state, the summed head). Run on the background thread when
    overlapped."""
    pieces = []
    for (a, b), program in zip(self._bounds, self._pieces, strict=True):
      with self._piece_time(a, b):
        pieces.append(jax.block_until_ready(program(fused)))
    return jax.block_until_ready(self._apply_outer(anchor, pieces))

  def _piece_time(self, a: int, b: int):
    if self.pace is None:
      return contextlib.nullcontext()
    head = self.fused_layout.head
    if self.int8:
      values = b - max(a, head)
      return self.pace.exchange(4 * max(min(b, head) - a, 0) + int8_bytes(values) if values else
                                4 * (b - a), Collective.ALL_GATHER)
    return self.pace.exchange(4 * (b - a))

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
    """This worker's round from ``step``: its parameters and inner state carried from the last
    round when it overlapped, else from ``state`` (a start or a resume; a resume of an
    overlapped run sends the exchange it saved pending again)."""
    if step % self.steps_per_round:
      raise ConfigError(f'local SGD resumes at a round\'s start: step {step} is not a multiple '
                        f'of local.inner_steps {self.steps_per_round}')
    if self._carry is not None and self._carry[0] == step:
      return _Round(step, self._carry[1], self._carry[2])
    self._anchor, self._inflight = TrainState(state.step, state.params, state.opt_state), None
    params = self._copy(self.local_view(state.params))
    if self.overlap_steps and int(state.step) > 0:  # every round's end sent one
      sent = merge_trainable(self._own_row(state.pending['at_send'], self._unrow_params),
                             split_trainable(params)[1])
      self._send(self._anchor, state.pending['fused'], step, sent)
      params = self._copy(sent)
    return _Round(step, params, self._own_row(state.inner))

  def step(self, state: LocalState, work: Work, shares) -> tuple[LocalState, StepStats]:
    """One inner step of this worker's on its rows of ``work``; at a round's last step, the
    outer exchange (every worker joins it), blocking or sent to land ``overlap_steps`` later."""
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
    rows, loss = 0, jnp.float32(math.nan)
    if not cut:
      part = partial_gradient(self, state, work, shares)
      rows, data_s, compile_s = part.rows, part.data_s, part.compile_s
      began = time.perf_counter()
      if rows:
        rnd.sampled &= self._inner_ran   # its first call compiles
        self._inner_ran = True
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
    timing = dict(data_s=data_s, compute_s=compute_s, slept=slept, compile_s=compile_s, rows=rows)
    if self._inflight is not None and s + 1 == self._inflight.land:
      return state, self._land(rnd, s, start, timing)
    if s + 1 < rnd.start + h:
      return state, self._own_stats(s, shares, start, timing, loss)
    if self.overlap_steps:
      return self._submit(rnd, s), self._own_stats(s, shares, start, timing, loss)
    return self._exchange(state, rnd, s, start, timing)

  def _own_stats(self, s: int, shares, start: float, timing: dict, loss) -> StepStats:
    """A step without an exchange: this worker's own numbers only (no other worker's are known,
    so none is a sample a policy could learn from)."""
    end = time.perf_counter()
    busy = timing['compute_s'] + timing['slept']
    own = [0.0] * self.workers
    own[self.worker] = busy
    return StepStats(s, shares, tuple(own), iter_s=end - start, sampled=(False,) * self.workers,
                     compile_s=timing['compile_s'], loss=loss,
                     local=self._timing(s, start, end, timing, 0.0))

  def _timing(self, s: int, start: float, end: float, timing: dict,
              collective_s: float) -> WorkerTiming:
    return WorkerTiming(step=s + 1, worker=self.worker, share=timing['rows'], slowdown=1.0,
                        data_s=timing['data_s'], compute_s=timing['compute_s'],
                        dilation_s=timing['slept'], collective_s=collective_s,
                        step_s=end - start, compile_s=timing['compile_s'])

  def _packed(self, rnd: _Round, anchor: PyTree):
    """This worker's weighted pseudo-gradient against ``anchor`` with the round's numbers in
    its slots of the head, stacked over workers: what the exchange sums."""
    h = self.steps_per_round
    weight = rnd.rows / h
    packed = self._pseudo(self.local_view(anchor), rnd.params,
                          jnp.float32(0.0) + rnd.loss / h, jnp.float32(weight))
    return self.stacked(packed, busy_s=rnd.busy_s / h, load=rnd.load,
                        sampled=2.0 if rnd.exact else float(rnd.sampled), rows=weight,
                        compile_s=rnd.compile_s)

  def _learned(self, head) -> dict[str, np.ndarray]:
    """The summed head as named host arrays; the cutoff's budget from it where every worker's
    round was a clean sample (no compile in it, as a run's first round has)."""
    head = self.read_head(head)
    if (head['sampled'] > 0.5).all():
      self._budget_s = self.steps_per_round * statistics.median(head['busy_s'].tolist())
    return head

  def _exchange(self, state: LocalState, rnd: _Round, s: int, start: float, timing: dict):
    """The blocking outer exchange at a round's end: the new state and the round's stats."""
    fused, separate = self._packed(rnd, state.params)
    inner = self._stack_rows(rnd.opt_state)
    combine = time.perf_counter()
    anchor = TrainState(state.step, state.params, state.opt_state)
    if self.fragments > 1:
      outer, head = self._reduce(anchor, fused)
    else:
      with self._exchange_time():
        outer, head = jax.block_until_ready(self._outer(anchor, fused, separate))
    end = time.perf_counter()
    self._round = None
    head = self._learned(head)
    step = jax.device_put(np.int32(s + 1), self.layout.shardings.step)
    stats = dataclasses.replace(
        self.stats(s, head, end - start, timing['compile_s'],
                   self._timing(s, start, end, timing, end - combine)),
        bytes=self.exchange_bytes)
    return LocalState(step, outer.params, outer.opt_state, inner), stats

  def _send(self, anchor: TrainState, fused: jax.Array, step: int, sent: PyTree) -> None:
    self._inflight = _Inflight(self._background.submit(self._reduce, anchor, fused),
                               step + self.overlap_steps, sent)

  def _submit(self, rnd: _Round, s: int) -> LocalState:
    """An overlapped round's end: its exchange sent to the background thread, this worker
    going on from its own parameters. The state returned holds the round's outer state before
    the exchange and the exchange pending (each worker's buffer and parameters at sending), so
    a checkpoint of it resumes exactly: the exchange is sent again."""
    anchor = self._anchor
    fused, _ = self._packed(rnd, anchor.params)
    sent = self._copy(rnd.params)
    pending = {'fused': fused,
               'at_send': self._stack_rows(split_trainable(sent)[0], self._params_abstract,
                                           self._params_stacked)}
    step = jax.device_put(np.int32(s + 1), self.layout.shardings.step)
    state = LocalState(step, anchor.params, anchor.opt_state,
                       self._stack_rows(rnd.opt_state), pending)
    self._send(anchor, fused, s + 1, sent)
    self._carry, self._round = (s + 1, rnd.params, rnd.opt_state), None
    return state

  def _land(self, rnd: _Round, s: int, start: float, timing: dict) -> StepStats:
    """Waits for the exchange in flight, moves this worker onto the new outer parameters with
    the inner steps it took since (`_rebased`), and returns the step's stats with every
    worker's numbers of the round the exchange closed."""
    waited = time.perf_counter()
    outer, head = self._inflight.future.result()
    rnd.params = self._rebase(self.local_view(outer.params), rnd.params, self._inflight.at_send)
    jax.block_until_ready(rnd.params)
    end = time.perf_counter()
    self._anchor, self._inflight = outer, None
    head = self._learned(head)
    return dataclasses.replace(
        self.stats(s, head, end - start, timing['compile_s'],
                   self._timing(s, start, end, timing, end - waited)),
        bytes=self.exchange_bytes)
