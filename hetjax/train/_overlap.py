"""The all-reduce scheduler (Jin et al., HKU 2023): step t's all-reduce runs while step t + 1
computes its gradient from approximated parameters.

The synchronous step (`WorkerTrainer`, the reference) computes gₜ at wₜ, all-reduces it to ḡₜ
and only then can step t + 1 start: wₜ₊₁ = opt(wₜ, ḡₜ). Here each worker i instead moves on at
once with its own estimate, and reconciles when the reduction lands::

  w̃ᵢ,ₜ₊₁ = opt(wₜ, gᵢ,ₜ · X / xᵢ)        its partial sum as a full-batch estimate (x rows of X)
  gᵢ,ₜ₊₁ = Σ_{its rows} ∇ℓ(w̃ᵢ,ₜ₊₁) / X   computed while ḡₜ = Σᵢ gᵢ,ₜ is being all-reduced
  wₜ₊₁   = opt(wₜ, ḡₜ)                    exactly the synchronous update, with ḡₜ

so the only approximation is that gₜ₊₁ is computed at w̃ₜ₊₁ instead of wₜ₊₁ (a worker with no
rows keeps w̃ = wₜ). The optimizer state follows ḡ only; w̃ is thrown away once used.

``estimate='int8'`` buys a better w̃ with a small exchange first: every worker quantizes its
gₜ to 8 bits (blocks of `QUANT_BLOCK` values, one float32 scale a block), the workers
all-gather those (a quarter of the bytes, one ring pass instead of two: at 4 workers half the
all-reduce's time on the links), and each takes w̃ₜ₊₁ = opt(wₜ, ĝₜ) with ĝₜ the sum of the
dequantized gradients: the same w̃ on every worker, off from wₜ₊₁ by the rounding only. That
exchange blocks the step; the exact all-reduce still runs under the gradient. At SGD η = 0.3
on 4 workers of 32 rows, where communication = compute, its step is longer than the own
estimate's but still well under the synchronous one, and it ends at 0.94× the synchronous
run's loss after 60 steps (the own estimate: 1.17×); over 8 data orders of the one-device
recurrence, 1.014 ± 0.015× at step 60, at the noise floor of that ratio.

Two launched workers on hosts of known speed (40 ms of compute a step) and links
``link:20:inf`` (a 40 ms all-reduce): the overlapped step takes about half the synchronous
one, the all-reduce hidden under the next gradient, with the final loss of 30 mlp steps at
shares (40, 24) 0.4 % above the synchronous run's (tests/test_overlap.py).

The state (`OverlapState`) is a value at every step boundary: the exact wₜ and optimizer state,
and ``pending``, the packed, not yet reduced gradient of the last batch (each worker's own
shard of one global array), so a checkpoint saves and restores it like the rest. `flush`
reduces it: after k steps and a flush the parameters are wₖ of the recurrence above.

Tensor fusion into buckets: the fused buffer (`FusedLayout`: the step's head, then the
gradients in parameter-tree leaf order, e.g. ``down, head, up`` for the MLP, whose pure dict
sorts its keys) is cut into buckets of at most ``bucket_bytes`` (`bucket_bounds`), earliest
leaves first. Each bucket is its own jitted program, one ``psum``, run one after the other on
the background thread, and each is padded to its own ring all-reduce on the emulated links
(`hetjax.core.Pace.exchange`, `hetjax.emulation.LinkedHost`): k buckets cost k latencies.
They have to be separate programs: inside one compiled program XLA:CPU's pass
``cpu-all-reduce-combiner`` merges independent all-reduces, with no byte limit and up to 256 at
a time, and no flag sets either (jaxlib 0.10.2, 4 CPU devices: 6 psums of 4-24 KB each, or of
4-24 MB each, compile to 1 tuple all-reduce, 300 psums to 2; with
``--xla_disable_hlo_passes=cpu-all-reduce-combiner``, 6 stay 6).

What XLA already does is inside one compiled step: combining collectives by size (on GPU
``--xla_gpu_all_reduce_combine_threshold_bytes``) and, on GPU, asynchronous collectives placed
by the latency-hiding scheduler (``--xla_gpu_enable_latency_hiding_scheduler``) so that a step's
all-reduce overlaps that step's own remaining compute (XLA:CPU's all-reduce is synchronous).
Neither can start step t + 1's gradient before step t's update, which needs the reduced
gradient: that cross-step overlap is what this program adds, at the price of w̃.

Only workers of equal device counts (the ``'proc'`` axis) and gradients replicated inside a
worker (data parallel) are supported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._checks import fraction
from hetjax._errors import ConfigError, parse_choice
from hetjax.core import Collective, Pace, StepStats, Work
from hetjax.data import Batch
from hetjax.sharding import ShardingRules
from hetjax.train._background import Background
from hetjax.train._head import FIELDS, StepHead
from hetjax.train._int8 import gathered_int8_sum, int8_bytes
from hetjax.train._partial import partial_gradient, prepare_upcoming
from hetjax.train._share_programs import Granularity
from hetjax.train._state import TrainState
from hetjax.train._strategies import Strategy
from hetjax.train._task import Task
from hetjax.train._worker_mesh import PROC, device_counts
from hetjax.train._workers import WorkerTrainer

PyTree = Any

class OverlapEstimate(enum.Enum):
  """What w̃, the parameters the next gradient is taken at, is estimated from."""

  OWN = 'own'    # this worker's own gradient, scaled to the batch (Jin's; no message)
  INT8 = 'int8'  # every worker's gradient in 8 bits, all-gathered first (a blocking exchange)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OverlapState:
  """The state of an overlapped run between two steps: a consistent, checkpointable value.

  Attributes:
    train: the exact state: every reduced gradient applied (``train.step`` of them).
    pending: this worker's packed partial gradient of batch ``train.step`` (computed at w̃),
      stacked over workers like `WorkerTrainer.stacked` (each worker holds its own shard); not
      yet reduced. Zeros when ``ahead`` is 0.
    ahead: int32 scalar: 1 when ``pending`` holds a batch's gradient, 0 when none (a fresh or
      flushed state).
  """

  train: TrainState
  pending: jax.Array
  ahead: jax.Array

  @property
  def step(self) -> jax.Array:
    """Batches consumed: the data position the loop resumes from."""
    return self.train.step + self.ahead


class OverlapTrainer:
  """Per-worker data parallelism whose all-reduce overlaps the next step's gradient.

  The same constructor, shares, host emulation and `StepProgram` shape as `WorkerTrainer`
  (which it runs its gradients, head and stacking with). Each `step` starts the reduction of
  the pending gradient (previous batch) on a background thread, computes this batch's gradient
  at w̃ meanwhile, then waits for the reduction and applies it. Its `StepStats` describe the
  step whose reduction landed (``stats.step`` the batch before this one: its rows, busy times
  and loss); the first step after a fresh or flushed state has none to report (``sampled`` all
  False, loss NaN). ``local.collective_s`` is the exposed communication: the wait for the
  reduction after this worker's compute, plus the 8-bit exchange before it with
  ``estimate='int8'``.

  Example (every worker, after `hetjax.runtime.initialize()`)::

    links = parse_links('link:20:inf', 2)             # hetjax.emulation: a 40 ms all-reduce
    host = LinkedHost(links, jax.process_index())
    trainer = OverlapTrainer(task, optax.sgd(0.05), 256, host=host)
    state = trainer.init_state()
    for info in training_steps(trainer, state, 100):
      state = info.state
    state = trainer.flush(state)          # state.train: the exact parameters of 100 steps
    trainer.close()

  Args:
    task, optimizer, global_batch, local_shape, rules, seed, bucket, accumulate, granularity:
      as for `WorkerTrainer`.
    host: the pace of the emulated host and links (`hetjax.core.Pace`, also given later by
      `use_host`): the synchronous pieces pad their compute to it, and each bucket's
      all-reduce is padded to its ring all-reduce time on the slowest link
      (`Collective.ALL_REDUCE`), on the background thread; links that exchange through a
      server have no ring to emulate and are refused at the first reduction. None: none.
    bucket_bytes: the fusion threshold: buckets of at most this many bytes, each its own
      all-reduce (`bucket_bounds`). None: one bucket, the whole fused buffer.
    estimate_scale: α in (0, 1]: w̃ = opt(w, α · g · X / x), this worker's estimate shrunk
      toward wₜ. 1 (the default) is Jin's "apply the local gradient first"; below 1 trades a
      little of the step for less of the worker's sampling noise, which helps at large
      learning rates (SGD at η = 0.3, 4 workers of 32 rows: the loss at step 60 is 1.22×
      synchronous training's at α = 1 and 1.05× at 0.5; at η = 0.1, 1.006× at α = 1, and 0.5
      does not help).
    estimate: an `OverlapEstimate` or its name: ``'own'`` (the default) or ``'int8'``, every
      worker's gradient exchanged first in 8 bits (module docstring); α scales either.

  Raises:
    ConfigError: workers of different device counts, or gradients split inside a worker.
  """

  def __init__(
      self,
      task: Task,
      optimizer: optax.GradientTransformation,
      global_batch: int,
      local_shape: tuple[int, int] | None = None,
      rules: ShardingRules | None = None,
      *,
      seed: int = 0,
      bucket: int | None = None,
      host: Pace | None = None,
      bucket_bytes: int | None = None,
      accumulate: int = 1,
      estimate_scale: float = 1.0,
      estimate: OverlapEstimate | str = OverlapEstimate.OWN,
      granularity: Granularity | str = Granularity.COMPILE,
  ):
    estimate_scale = fraction(estimate_scale, "the all-reduce scheduler's estimate_scale")
    self.estimate = parse_choice(OverlapEstimate, estimate, 'all-reduce scheduler estimate')
    sync = WorkerTrainer(task, optimizer, global_batch, local_shape, rules, seed, bucket, host,
                         accumulate=accumulate, granularity=granularity)
    if sync.mesh.axis_names[0] != PROC:
      raise ConfigError(f'the overlapped all-reduce needs workers of equal device counts, got '
                        f'{device_counts()}')
    if sync.fused_layout.separate:
      raise ConfigError(f'the overlapped all-reduce needs every gradient replicated inside a '
                        f'worker (data parallel); {Strategy.describe(sync.rules)} splits '
                        f'{len(sync.fused_layout.separate)} of them (use strategy data_parallel)')
    self.sync, self.pace, self.global_batch = sync, host, global_batch
    self.estimate_scale = estimate_scale
    self.buckets = sync.fused_layout.buckets(bucket_bytes)
    replicated = NamedSharding(sync.mesh, PartitionSpec())
    stacked = NamedSharding(sync.mesh, PartitionSpec(PROC))
    self._pending_sharding, self._ahead_sharding = stacked, replicated
    self._reduce_bucket = [jax.jit(self._bucket_psum(a, b), in_shardings=stacked,
                                   out_shardings=replicated) for a, b in self.buckets]
    self._apply = jax.jit(self._apply_reduced, out_shardings=(sync.layout.shardings, replicated),
                          donate_argnums=0)
    self._local_replicated = NamedSharding(sync.local_mesh, PartitionSpec())
    self._approximate = jax.jit(self._approximate_params, out_shardings=self._local_replicated)
    self._coarse = jax.jit(self._coarse_sum(), in_shardings=stacked,
                           out_shardings=replicated)
    grads = sync.fused_size - sync.fused_layout.head
    self.coarse_bytes = int8_bytes(grads)   # int8 values, a scale a block
    self._rows_slot = StepHead(sync.workers).slots(sync.worker)[FIELDS.index('rows')]
    size = sync.workers * sync.fused_size
    self._zeros = jax.device_put(np.zeros((size,), np.float32), stacked)
    self._ahead = {k: jax.device_put(np.int32(k), replicated) for k in (0, 1)}
    self._background = Background('hetjax-all-reduce')

  @property
  def workers(self) -> int:
    return self.sync.workers

  @property
  def task(self) -> Task:
    return self.sync.task

  def close(self) -> None:
    """Waits for the background reduction if one is running (its thread never outlives the
    program) and drops queued background compiles."""
    self._background.close()
    self.sync.close()

  def evaluate(self, state: OverlapState, batch: Batch) -> dict[str, float]:
    """Mean loss (and metrics) of ``batch`` under the exact parameters (``state.train``: every reduced
    gradient applied; the pending one is not yet)."""
    return self.sync.evaluate(state.train, batch)

  def use_host(self, host: Pace | None) -> None:
    """The synchronous pieces' host (`WorkerTrainer.use_host`): the forward and backward pad
    to it; the overlapped reduction's buckets and the 8-bit exchange to its links."""
    self.pace = host
    self.sync.use_host(host)

  # -- state -------------------------------------------------------------------------------------

  def whole_model(self, state: OverlapState) -> Any:
    """`WorkerTrainer.whole_model` of the synchronous state (`hetjax.core.HasModel`)."""
    return self.sync.whole_model(state.train)

  def init_state(self) -> OverlapState:
    """`WorkerTrainer.init_state`, nothing pending."""
    return OverlapState(self.sync.init_state(), self._zeros, self._ahead[0])

  def abstract_state(self) -> OverlapState:
    size = self.sync.workers * self.sync.fused_size
    return OverlapState(
        self.sync.abstract_state(),
        jax.ShapeDtypeStruct((size,), jnp.float32, sharding=self._pending_sharding),
        jax.ShapeDtypeStruct((), jnp.int32, sharding=self._ahead_sharding))

  def global_batch_at(self, step: int) -> Batch:
    return self.sync.global_batch_at(step)

  def local_view(self, tree: PyTree) -> PyTree:
    """`WorkerTrainer.local_view`: this worker's copy of a tree of global arrays (no copy)."""
    return self.sync.local_view(tree)

  def measure_speed(self, state: OverlapState, rows: int, repeats: int = 3) -> float:
    """`WorkerTrainer.measure_speed` at the exact parameters."""
    return self.sync.measure_speed(state.train, rows, repeats)

  def flush(self, state: OverlapState) -> OverlapState:
    """Reduces and applies the pending gradient (a collective: every worker calls it at the
    same step): ``state.train`` is then the exact recurrence, nothing pending."""
    if not int(state.ahead):
      return state
    train, _ = self._background.submit(self._reduce, state.train, state.pending).result()
    return OverlapState(train, self._zeros, self._ahead[0])

  # -- the programs ------------------------------------------------------------------------------

  def _bucket_psum(self, start: int, stop: int):
    """Elements ``[start, stop)`` of every worker's buffer, summed over workers."""
    return jax.shard_map(lambda fused: lax.psum(fused[start:stop], PROC), mesh=self.sync.mesh,
                         in_specs=PartitionSpec(PROC), out_specs=PartitionSpec())

  def _apply_reduced(self, train: TrainState, buckets: list[jax.Array]):
    head, grads = self.sync.fused_layout.unpack(jnp.concatenate(buckets), [])
    return train.apply_gradients(self.sync.optimizer, grads), head

  def _coarse_sum(self):
    """Every worker's gradients (the buffer past its head) in 8 bits, an absmax scale per
    `QUANT_BLOCK` values, gathered and summed dequantized: ĝ, the reduced gradients up to the
    rounding, behind a zero head."""
    head = self.sync.fused_layout.head

    def quantize_gather_sum(fused):
      total = gathered_int8_sum(fused[head:], PROC)
      return jnp.concatenate([jnp.zeros((head,), jnp.float32), total])

    # Every worker sums the same gathered values in the same order, so the sum is replicated;
    # all_gather's result is typed as varying over the axis, hence no check.
    return jax.shard_map(quantize_gather_sum, mesh=self.sync.mesh, in_specs=PartitionSpec(PROC),
                         out_specs=PartitionSpec(), check_vma=False)

  def _approximate_params(self, local: TrainState, fused: jax.Array) -> PyTree:
    """w̃ = opt(w, α · g · X / x) from this worker's stamped buffer (x: its rows slot, α:
    ``estimate_scale``); w if x = 0. With the int8 estimate ``fused`` is ĝ, the coarse sum of
    every worker's buffer: w̃ = opt(w, α · ĝ)."""
    rows = fused[self._rows_slot]
    if self.estimate is OverlapEstimate.INT8:
      rows, scale = jnp.float32(1.0), jnp.float32(self.estimate_scale)
    else:
      scale = jnp.where(rows > 0,
                        self.estimate_scale * self.global_batch / jnp.maximum(rows, 1.0), 0.0)
    _, grads = self.sync.fused_layout.unpack(fused, [])
    moved = local.apply_gradients(self.sync.optimizer, jax.tree.map(lambda g: g * scale, grads))
    return jax.tree.map(lambda m, w: jnp.where(rows > 0, m, w), moved.params, local.params)

  def _local(self, pending: jax.Array) -> jax.Array:
    """This worker's own buffer of ``pending``, as an array on its local mesh (no copy)."""
    return jax.make_array_from_single_device_arrays(
        (self.sync.fused_size,), self._local_replicated,
        [s.data for s in pending.addressable_shards])

  def _reduce(self, train: TrainState, pending: jax.Array):
    """The background job: each bucket's psum in order, padded to the links' time, then the
    update. Returns the new exact state and the summed head (host values)."""
    reduced = []
    for (start, stop), program in zip(self.buckets, self._reduce_bucket, strict=True):
      if self.pace is None:
        reduced.append(program(pending))
        continue
      with self.pace.exchange(4 * (stop - start), Collective.ALL_REDUCE):
        reduced.append(jax.block_until_ready(program(pending)))
    train, head = self._apply(train, reduced)
    return jax.block_until_ready(train), self.sync.read_head(head)

  # -- one step ----------------------------------------------------------------------------------

  def step(self, state: OverlapState, work: Work, shares) -> tuple[OverlapState, StepStats]:
    """Reduces the pending gradient in the background while this batch's is computed at w̃
    (the `StepProgram` shape); ``state`` is donated."""
    prepare_upcoming(self.sync, shares)
    shares = tuple(int(s) for s in shares)
    start = time.perf_counter()
    future, at, coarse_s = None, state.train, 0.0
    if int(state.ahead):
      local = self.sync.local_view(state.train)
      source = self._local(state.pending)
      if self.estimate is OverlapEstimate.INT8:   # the blocking 8-bit exchange, padded
        begin = time.perf_counter()
        with (self.pace.exchange(self.coarse_bytes, Collective.ALL_GATHER) if self.pace
              else contextlib.nullcontext()):
          source = self.sync.local_view(jax.block_until_ready(self._coarse(state.pending)))
        coarse_s = time.perf_counter() - begin
      # Ready before the reduction starts: its update donates the arrays w̃ is computed from.
      tilde = jax.block_until_ready(self._approximate(local, source))
      future = self._background.submit(self._reduce, state.train, state.pending)
      at = dataclasses.replace(local, params=tilde)
    part = dataclasses.replace(partial_gradient(self.sync, at, work, shares), start=start)
    pending, _ = self.sync.stacked(part.packed, **part.head_values())
    waiting = time.perf_counter()
    train, head = future.result() if future else (state.train, None)
    end = time.perf_counter()
    local_timing = part.timing(self.sync.worker, coarse_s + end - waiting, end)
    state = OverlapState(train, pending, self._ahead[1])
    if head is None:
      n = self.workers
      return state, StepStats(
          work.step, shares, (0.0,) * n, iter_s=end - start, sampled=(False,) * n,
          compile_s=part.compile_s, bytes=self.sync.all_reduce_bytes, loss=np.float32(np.nan),
          local=local_timing)
    return state, self.sync.stats(work.step - 1, head, end - start, part.compile_s, local_timing)
