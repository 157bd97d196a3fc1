"""Data parallelism across workers (processes) that each compute a slice of their own size.

Each worker runs its own jitted gradient program on its local devices for its own number of
rows; only the cross-worker combine is a collective, and it runs on equal-shaped gradient trees.
That is what lets every worker have a different batch share — and later a different share every
iteration — while training stays the same SGD as one device computing the whole batch:

    g = Σᵢ Σ_{rows r of worker i} ∇ℓ_r / X        (X = the global batch)

Each worker's program returns its partial sum already divided by X; the combine adds them with
`lax.psum` over the ``'proc'`` axis of a mesh made of every worker's devices, and applies the
optimizer in the same program, so the state (replicated over workers) never leaves the devices.

Tensor fusion (`FusedLayout`): the loss and every gradient replicated inside a worker travel in
one flat buffer, one all-reduce a step instead of one per parameter. With gloo on CPU each
all-reduce pays a fixed cost, so a few tensors reduced one by one take several times what the
same bytes fused take.

Workers of different device counts (``launch --devices 2,1,1``) cannot form that grid. Their
parameters must be replicated inside each worker (data parallel; `replicated_layout` names the
first one a layout would split), the state lives replicated on a 1-D mesh ``('devices',)`` over
every device of every worker, and the fused buffer is stacked over all devices with each
worker's buffer on its first local device and zeros on its others: the ``psum`` over
``'devices'`` adds every worker exactly once (adding zeros is exact; nothing is divided).
Worker ``i``'s share must be a multiple of its own local data-parallel degree; the bucket, of
every worker's (their least common multiple, `share_degree`).
"""

from __future__ import annotations

import contextlib
import math
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
from hetjax.core import Pace, StepStats, Work, WorkerTiming
from hetjax.data import Batch, StepBatch, slice_batch
from hetjax.sharding import ShardingRules, activation_rules, put_batch
from hetjax.train._accumulate import micro_rows_of, summed_value_and_grad
from hetjax.train._fused import FusedLayout
from hetjax.train._head import StepHead
from hetjax.train._partial import partial_gradient, prepare_upcoming
from hetjax.train._share_programs import Granularity, SharePrograms
from hetjax.train._state import TrainState
from hetjax.train._state_layout import init_state, state_layout
from hetjax.train._strategies import Strategy
from hetjax.train._task import Task
from hetjax.train._trainable import split_trainable
from hetjax.train._worker_mesh import (
  PROC,
  batch_degrees,
  local_shapes,
  replicated_layout,
  stacked_spec,
  worker_meshes,
)

PyTree = Any


class WorkerTrainer:
  """Trains ``task`` over all workers of the job, worker ``i`` computing ``shares[i]`` rows.

  Example (run in every worker, after `hetjax.runtime.initialize()`)::

    trainer = WorkerTrainer(task, optax.adam(1e-3), global_batch=256)
    policy = balance.make_policy('lbbsp', balance.ShareRules(256, jax.process_count(), 16))
    for info in training_steps(trainer, trainer.init_state(), 100, policy=policy):
      pass                                            # info.stats.rows: the shares it ran

  Workers of different device counts: give the rules ``devices=`` (each worker's count), so that
  uniform shares are equal per device, and a bucket that is a multiple of `share_degree`.

  Args:
    task: the model, loss and data.
    optimizer: an optax transformation, applied identically on every worker.
    global_batch: examples per step over all workers; shares sum to it.
    local_shape: this worker's local mesh shape over ``('data', 'model')`` (default: all local
      devices on ``'data'``); the same on every worker. Workers of different device counts
      keep its model size and put the rest of their devices on ``'data'`` (`local_shapes`).
    rules: how parameters and compute are laid out inside a worker (default: data parallel).
      Workers of different device counts need rules that replicate every parameter inside a
      worker (`replicated_layout`).
    seed: initialises parameters and selects the data.
    bucket: the granularity of share sizes when shares change (LB-BSP), a multiple of
      `share_degree`. Given, a share size seen for the first time runs as a sum of already
      compiled pieces while its own program compiles on a background thread (see
      `SharePrograms`), so no step waits for a compile after the first. None (fixed shares):
      each size is compiled when first needed.
    host: the pace of the emulated host and links this worker runs as (`hetjax.core.Pace`,
      also given later by `use_host`): each step's compute is padded by sleep to the host's
      time, and its combine is the exchange of `all_reduce_bytes` the links price
      (`hetjax.emulation.LinkedHost`: under the ring exchange padded to a ring all-reduce on
      the slowest link, from its start; under the server exchange each worker first sleeps its
      own push and pull, then joins the combine, so the step ends when the slowest
      compute-plus-transfer does; both inside ``collective_s``). None: this machine's own speed
      and transfers.
    accumulate: gradient accumulation: each worker computes its rows in micro-batches of at
      most ``ceil(global_batch / (workers × accumulate))`` rows (rounded up to its local
      degree), summed before the combine, so a worker with a larger share runs more of them
      (`summed_value_and_grad`).
    granularity: with a ``bucket``, how a share size without a program runs
      (`Granularity`, `SharePrograms`): its own program compiled in the background (``compile``),
      whole micro-batches of ``bucket`` rows over programs already compiled (``micro``), or
      ``auto`` (micro where a compile costs more than a few calls).
  """

  def __init__(
      self,
      task: Task,
      optimizer: optax.GradientTransformation,
      global_batch: int,
      local_shape: tuple[int, int] | None = None,
      rules: ShardingRules | None = None,
      seed: int = 0,
      bucket: int | None = None,
      host: Pace | None = None,
      *,
      accumulate: int = 1,
      granularity: Granularity | str = Granularity.COMPILE,
  ):
    self.task, self.optimizer, self.global_batch, self.seed = task, optimizer, global_batch, seed
    self.pace = host
    self.rules = rules or Strategy.DATA_PARALLEL.rules()
    self.worker, self.workers = jax.process_index(), jax.process_count()
    self.local_shapes = local_shapes(local_shape)
    self.local_mesh, self.mesh = worker_meshes(local_shape)
    # 'proc' over a grid of equal workers; 'devices' over all devices of unequal ones.
    self._axis = self.mesh.axis_names[0]
    if self._axis == PROC:
      self.layout = state_layout(task, optimizer, self.mesh, self.rules.params, seed)
    else:
      self.layout = replicated_layout(task, optimizer, self.mesh, self.rules, self.local_shapes,
                                      Strategy.describe(self.rules), seed)
    self.graphdef = self.layout.graphdef
    self.batch_degrees = batch_degrees(self.rules, local_shape)
    self.local_batch_degree = self.batch_degrees[self.worker]
    #: Rows of each micro-batch of a worker's rows (None: one pass).
    self.micro_rows = micro_rows_of(math.ceil(global_batch / self.workers), accumulate,
                                    self.local_batch_degree)
    self._local_replicated = NamedSharding(self.local_mesh, PartitionSpec())
    self._evaluate = None
    if bucket is not None and (bucket <= 0 or bucket % self.share_degree):
      raise ConfigError(f'bucket {bucket} must be a positive multiple of the local data-parallel '
                        f'degree {self.share_degree}' + (
                            '' if len(set(self.batch_degrees)) == 1 else
                            f' (the least common multiple of the workers\' degrees '
                            f'{self.batch_degrees})'))

    # Replicated gradient leaves are fused into one buffer behind the step's head (`StepHead`):
    # each worker writes its own slots of the head, so the psum hands everyone everyone's timing.
    self._layout_head = StepHead(self.workers)
    # Gradients are the float parameters' only (`split_trainable`).
    trainable = split_trainable(self.layout.abstract.params)[0]
    trainable_specs = split_trainable(self.layout.param_specs, like=self.layout.abstract.params)[0]
    self.fused_layout = FusedLayout.of(
        trainable, trainable_specs, self._layout_head.size,
        {name: max(shape[i] for shape in self.local_shapes)
         for i, name in enumerate(self.local_mesh.axis_names)})
    self._fused_size, separate = self.fused_layout.size, self.fused_layout.separate
    specs = self.fused_layout.treedef.flatten_up_to(trainable_specs)
    self._separate_specs = [specs[i] for i in separate]
    self._separate_stacked = [
        NamedSharding(self.mesh, stacked_spec(specs[i], len(self.fused_layout.shapes[i])))
        for i in separate]
    self._fused_stacked = NamedSharding(self.mesh, PartitionSpec(self._axis))
    # Unequal workers: each worker's buffer on its first local device, zeros on the others.
    self._first = self.local_mesh.devices.flat[0]
    self._zeros = {} if self._axis == PROC else {
        d: jax.device_put(np.zeros((self._fused_size,), np.float32), d)
        for d in self.local_mesh.devices.flat[1:]}
    local_out = (self._local_replicated, [NamedSharding(self.local_mesh, specs[i])
                                          for i in separate])
    self._grad = jax.jit(self._local_grad, out_shardings=local_out)
    self.programs = SharePrograms(lambda p, b: self._grad.lower(p, b), bucket,
                                  global_batch - (self.workers - 1) * (bucket or 0), granularity)
    self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), out_shardings=local_out)
    self._zero = jax.jit(self._zero_grad, out_shardings=local_out)
    slots = np.asarray(self._layout_head.slots(self.worker))
    self._stamp = jax.jit(lambda fused, values: fused.at[slots].set(values), donate_argnums=0)
    self._local_out = local_out
    self._update = self._combine_program(self._combine_and_update)

  def _combine_program(self, update):
    """``update(state, fused, separate) -> (state, head)`` jitted over the job mesh, the state
    donated: the combine's program (`LocalTrainer`'s outer step is another)."""
    return jax.jit(
        update,
        in_shardings=(self.layout.shardings, self._fused_stacked, self._separate_stacked),
        out_shardings=(self.layout.shardings, NamedSharding(self.mesh, PartitionSpec())),
        donate_argnums=0)

  def close(self) -> None:
    """Drops queued background compiles, so the process exits without waiting for them."""
    self.programs.close()

  def evaluate(self, state: TrainState, batch: Batch) -> dict[str, float]:
    """Mean loss (and the task's metrics) of the host ``batch`` under ``state.params``, on
    this worker's own devices (every worker holds the whole model): no collective."""
    if self._evaluate is None:
      def means(params, b):
        model = nnx.merge(self.graphdef, params)
        with activation_rules(self.local_mesh, self.rules.compute):
          return self.task.eval_means(model, b)
      self._evaluate = jax.jit(means, out_shardings=self._local_replicated)
    found = self._evaluate(self.local_view(state.params), self.place(batch))
    return {k: float(v) for k, v in found.items()}

  def use_host(self, host: Pace | None) -> None:
    """Pads each step to ``host`` (`hetjax.core.StepProgram.use_host`): its rows of the step
    take the host's time, its combine the exchange the links price."""
    self.pace = host

  @property
  def compiles(self) -> int:
    """Programs compiled while a step waited (background compiles are not counted)."""
    return self.programs.compiles

  @property
  def compile_s(self) -> float:
    """Seconds steps waited for compiles, in total."""
    return self.programs.compile_s

  @property
  def last_compile_s(self) -> float:
    """Seconds the latest `local_gradient` call waited for a compile."""
    return self.programs.last_compile_s

  @property
  def share_degree(self) -> int:
    """What every share of a policy's rules must be a multiple of: the least common multiple of
    the workers' local data-parallel degrees (e.g. 2 for workers of 2, 1 and 1 devices)."""
    return math.lcm(*self.batch_degrees)

  @property
  def fused_size(self) -> int:
    """Float32 elements in the fused buffer each step's all-reduce carries (loss included)."""
    return self._fused_size

  @property
  def all_reduce_bytes(self) -> int:
    """Bytes one worker contributes to each step's all-reduces (fused buffer and the rest)."""
    return 4 * self._fused_size + self.fused_layout.separate_bytes

  # -- state -------------------------------------------------------------------------------------

  def init_state(self) -> TrainState:
    """Fresh state on the job mesh, replicated over workers (identical on every worker)."""
    return init_state(self.task, self.optimizer, self.layout, self.seed)

  def abstract_state(self) -> TrainState:
    return self.layout.abstract_state()

  def whole_model(self, state: TrainState) -> nnx.Module:
    """The model with this worker's copy of ``state``'s parameters (`hetjax.core.HasModel`)."""
    return nnx.merge(self.graphdef, self.local_view(state.params))

  def local_view(self, tree: PyTree) -> PyTree:
    """This worker's copy of a tree of global arrays, as arrays on the local mesh (no copy)."""
    def one(x):
      sharding = NamedSharding(self.local_mesh, x.sharding.spec)
      return jax.make_array_from_single_device_arrays(
          x.shape, sharding, [s.data for s in x.addressable_shards])
    return jax.tree.map(one, tree)

  # -- the two programs --------------------------------------------------------------------------

  def _local_grad(self, params: PyTree, batch: dict[str, jax.Array]):
    def per_example(p, b):
      model = nnx.merge(self.graphdef, p)
      with activation_rules(self.local_mesh, self.rules.compute):
        return self.task.loss(model, b)
    return self.fused_layout.pack(*summed_value_and_grad(per_example, params, batch,
                                                         self.global_batch, self.micro_rows))

  def _zero_grad(self):
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                         split_trainable(self.layout.abstract.params)[0])
    return self.fused_layout.pack(jnp.zeros((), jnp.float32), zeros)

  def _combine_and_update(self, state: TrainState, fused: jax.Array, separate: list[jax.Array]):
    head, grads = self._summed(fused, separate)
    return state.apply_gradients(self.optimizer, grads), head

  def _summed(self, fused: jax.Array, separate: list[jax.Array]) -> tuple[jax.Array, PyTree]:
    """(the head, the gradients) summed over every worker's stacked buffers (collective)."""
    def total(fused_parts, separate_parts):
      return (lax.psum(fused_parts, self._axis),
              [lax.psum(x, PROC) if x.ndim == len(shape) else lax.psum(x, PROC)[0]
               for x, shape in zip(separate_parts, [self.fused_layout.shapes[i]
                                                   for i in self.fused_layout.separate],
                                   strict=True)])

    stacked_specs = [s.spec for s in self._separate_stacked]
    fused, separate = jax.shard_map(
        total, mesh=self.mesh, in_specs=(PartitionSpec(self._axis), stacked_specs),
        out_specs=(PartitionSpec(), self._separate_specs))(fused, separate)
    return self.fused_layout.unpack(fused, separate)

  def _stack(self, local: jax.Array, sharding: NamedSharding) -> jax.Array:
    """Every worker's ``local`` concatenated along dimension 0, as one global array."""
    shards = [s.data if local.ndim else s.data.reshape((1,)) for s in local.addressable_shards]
    shape = (self.workers * (local.shape[0] if local.ndim else 1), *local.shape[1:])
    return jax.make_array_from_single_device_arrays(shape, sharding, shards)

  def _stack_fused(self, fused: jax.Array) -> jax.Array:
    """Every worker's fused buffer stacked for the combine's ``psum``: once per worker over
    ``'proc'``, or on the first of its devices (zeros on its others) over ``'devices'``."""
    if self._axis == PROC:
      return self._stack(fused, self._fused_stacked)
    shards = [s.data if s.device == self._first else self._zeros[s.device]
              for s in fused.addressable_shards]
    shape = (self.mesh.size * self._fused_size,)
    return jax.make_array_from_single_device_arrays(shape, self._fused_stacked, shards)

  # -- one step, in pieces, so a runtime can time each --------------------------------------------

  def check_shares(self, shares: tuple[int, ...]) -> None:
    if len(shares) != self.workers or sum(shares) != self.global_batch or min(shares) < 0:
      raise ConfigError(f'shares {tuple(shares)} must be {self.workers} non-negative integers '
                        f'summing to the global batch {self.global_batch}')
    for i, (s, degree) in enumerate(zip(shares, self.batch_degrees, strict=True)):
      if s % degree:
        raise ConfigError(f'share {s} of worker {i} is not divisible by its local '
                          f'data-parallel degree {degree}')

  def global_batch_at(self, step: int) -> StepBatch:
    """The host global batch of ``step`` (a function of the seed and the step only), read
    lazily: a step reads only this worker's rows of it (`hetjax.data.StepBatch`)."""
    return StepBatch(self.task.data, self.seed, step, self.global_batch)

  def local_batch(self, step: int, shares: tuple[int, ...]) -> dict[str, jax.Array]:
    """This worker's rows of step ``step``'s global batch, placed on the local mesh."""
    return self.place(slice_batch(self.global_batch_at(step), shares, self.worker))

  def place(self, batch: Batch | StepBatch) -> dict[str, jax.Array]:
    """Places host rows on the local mesh, split along the batch axis (a `StepBatch`: all of
    its rows)."""
    return put_batch(dict(batch), self.local_mesh, self.rules.compute)

  def local_gradient(self, state: TrainState, batch: dict[str, jax.Array]):
    """``Σ loss / X`` and ``Σ ∇loss / X`` over this worker's rows, packed for `combine`.

    Programs are compiled ahead of time per share size and kept in memory (`SharePrograms`);
    `compiles`, `compile_s` and `last_compile_s` count only the compiles a call waited for, so
    the caller can keep compilation out of measured compute (and out of time dilation).
    """
    rows = len(next(iter(batch.values())))
    if rows == 0:
      self.programs.last_compile_s = 0.0
      return self._zero()
    return self.programs(self._add, self.local_view(state.params), batch)

  def zero_gradient(self):
    """A packed gradient of zeros: what a worker that computed no rows contributes."""
    return self._zero()

  def accumulate(self, packed, more):
    """The sum of two packed gradients (each already divided by the global batch)."""
    return self._add(packed, more)

  def combine(self, state: TrainState, packed, busy_s: float = 0.0, load: float = 0.0,
              sampled: bool | float = True, rows: int = 0, compile_s: float = 0.0,
              ready: float = 1.0):
    """Sums every worker's packed loss and gradient and applies the optimizer (collective).

    This worker's ``busy_s`` (compute and emulated padding), ``load`` (its host-load input),
    ``sampled`` (False: its time is not a speed sample, e.g. it ran a new size as pieces while
    the size's program compiled), ``rows`` (rows it computed), ``compile_s`` (seconds it
    compiled during the step) and ``ready`` (1: it can run the share a policy prepared without
    waiting for a compile) ride in named slots of the same
    all-reduce (`StepHead`), so every worker learns every worker's values without another
    message: the inputs of a deterministic, identical policy decision everywhere.

    Returns:
      ``(state, head)``: the new state and the summed head (`StepHead.read` names its parts).
    """
    return self._update(state, *self.stacked(packed, busy_s, load, sampled, rows, compile_s,
                                             ready))

  def stacked(self, packed, busy_s: float = 0.0, load: float = 0.0, sampled: bool | float = True,
              rows: int = 0, compile_s: float = 0.0,
              ready: float = 1.0) -> tuple[jax.Array, list[jax.Array]]:
    """``packed`` with this worker's values in its slots of the head, stacked over workers as
    global arrays: what `combine`'s all-reduce sums (each worker holds its own shards)."""
    fused, separate = packed
    fused = self._stamp(fused, np.array([busy_s, load, float(sampled), rows, compile_s,
                                         float(ready)], np.float32))
    return self._stack_fused(fused), [
        self._stack(x, sh) for x, sh in zip(separate, self._separate_stacked, strict=True)]

  def read_head(self, head) -> dict[str, np.ndarray]:
    """The summed head of `combine` as named host arrays (waits for the combine)."""
    return self._layout_head.read(np.asarray(head, np.float64))

  def step(self, state: TrainState, work: Work, shares) -> tuple[TrainState, StepStats]:
    """One BSP iteration on ``work`` with the given shares (the `StepProgram` shape).

    Builds this worker's slice (``data_s``), compiles its program if the share size is new
    (``compile_s``), computes its partial gradient and waits for it (``compute_s``), pads the
    step to its emulated host's time (``dilation_s``, `hetjax.core.Pace.pad`; all of it
    `partial_gradient`), then joins the combine and optimizer update, waits for it and pads it
    to the emulated network's time (``collective_s``, `hetjax.core.Pace.exchange`; under the
    server exchange this worker's own transfer comes first). Timing needs those waits, so
    unlike an SPMD step this one syncs.
    """
    prepare_upcoming(self, shares)
    part = partial_gradient(self, state, work, tuple(int(s) for s in shares))
    combine = time.perf_counter()
    with self.pace.exchange(self.all_reduce_bytes) if self.pace else contextlib.nullcontext():
      state, head = jax.block_until_ready(self.combine(state, part.packed, **part.head_values()))
    end = time.perf_counter()
    local = part.timing(self.worker, end - combine, end)
    return state, self.stats(work.step, self.read_head(head), end - part.start, part.compile_s,
                             local)

  def stats(self, step: int, head: dict[str, np.ndarray], iter_s: float, compile_s: float,
            local: WorkerTiming, tokens: tuple[int, ...] = ()) -> StepStats:
    """The `StepStats` of a step from the summed head; ``sync_s`` is this worker's iteration
    less its data time and the slowest worker's busy time.

    A compile anywhere in the job makes the step no speed sample for any worker: workers that
    share a machine (several processes on one host) compete for its cores, and a compile's
    contention shows as "compute" on every worker of a step, many times what its own rows take.
    A worker whose step was padded to its emulated host's time with
    room to spare stays a sample: its busy time is the host's (``sampled`` 2 in the head)."""
    busy, compiled = head['busy_s'], np.maximum(head['compile_s'], 0.0)
    sampled, exact = head['sampled'] > 0.5, head['sampled'] > 1.5
    if not sampled.all() or (compiled > 0).any():
      sampled = exact  # only a step padded to its host's time with room to spare stays one
    return StepStats(
        step, tuple(int(r) for r in np.rint(head['rows'])), tuple(busy.tolist()),
        sync_s=max(iter_s - local.data_s - float(busy.max()), 0.0),
        iter_s=iter_s, load=tuple(head['load'].tolist()),
        sampled=tuple(bool(x) for x in sampled), compile_s=compile_s,
        bytes=self.all_reduce_bytes, loss=head['loss'], tokens=tokens,
        local=local, worker_compile_s=tuple(float(c) for c in compiled),
        worker_ready=tuple(bool(r) for r in head['ready'] > 0.5),
        worker_exact=tuple(bool(x) for x in exact))

  def time_gradient(self, state: TrainState, rows: int, repeats: int = 3) -> tuple[float, ...]:
    """``repeats`` timed local gradients of ``rows`` rows (step 0's first rows), after one
    untimed run that compiles the size (and waits for its own program)."""
    batch = self.place(self.task.data.global_batch(self.seed, 0, rows))
    jax.block_until_ready(self.local_gradient(state, batch))
    self.programs.wait()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(self.local_gradient(state, batch))
      times.append(time.perf_counter() - start)
      self.programs.observe(rows, times[-1])
    return tuple(times)

  def measure_speed(self, state: TrainState, rows: int, repeats: int = 3) -> float:
    """This worker's rows/s on its local gradient for ``rows`` rows, as its host runs them:
    the reference speed of `hetjax.runtime.Cluster`.

    The best of `time_gradient`'s runs, padded to the emulated host's time at step 0 (a 3x slow
    host measures 3x slower, as it will run).
    """
    best = min(self.time_gradient(state, rows, repeats))
    slept = self.pace.pad(0, rows, best)[0] if self.pace else 0.0
    return rows / (best + slept)

