"""A jitted SPMD train step for one task on one mesh under one rule set."""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax._errors import ConfigError
from hetjax.core import Pace, StepStats, Work
from hetjax.data import Batch
from hetjax.sharding import ShardingRules, activation_rules, batch_sharding, put_batch
from hetjax.train._accumulate import micro_rows_of, summed_value_and_grad
from hetjax.train._state import TrainState
from hetjax.train._state_layout import init_state, state_layout
from hetjax.train._task import Task
from hetjax.train._trainable import trainable_value_and_grad

PyTree = Any


class Trainer:
  """Owns the compiled train step of ``task`` on ``mesh`` under ``rules``.

  Everything is derived abstractly at construction (shapes from `nnx.eval_shape`, shardings
  from the logical names), so a bad rule or batch size fails here, before any device work.

  ``mesh`` may span the devices of several processes (``make_mesh(shape)`` in every worker of
  ``python -m hetjax.launch``): one jitted step over the global mesh, as MaxText runs
  multi-host jobs, so FSDP and tensor parallelism span hosts. Every process then runs the same
  calls: each places the rows of the global batch that its devices hold
  (`hetjax.sharding.put_batch`), the state is created and restored in its global shardings,
  and the loss comes back replicated, so ``float(stats.loss)`` works in every process.
  Parameters are global arrays then: `jax.experimental.multihost_utils.process_allgather`
  reads one whole on the host. On the CPU backend such a step runs in lock step (`step` waits
  for it): several of its executions left in flight across processes hung the gloo collectives
  (4 processes x 2 devices, 50 steps: 3 of 6 runs hung; waiting for each step, 0 of 7), as
  programs over overlapping processes did in `hetjax.pipeline`.

  Example::

    trainer = Trainer(task, optax.adam(1e-3), 256, mesh, Strategy.HYBRID.rules())
    state = trainer.init_state()
    state, stats = trainer.step(state, Work(0, trainer.global_batch_at(0)), None)

  Args:
    task: the model, loss and data.
    optimizer: an optax transformation.
    global_batch: examples per step over the whole mesh.
    mesh: the devices to run on.
    rules: where parameters live (``rules.params``) and how compute is split (``rules.compute``).
    seed: initialises parameters and selects the data (the batch of step s is a function of
      ``(seed, s)`` only).
    accumulate: gradient accumulation: the step's gradient is computed in this many
      micro-batches of ``global_batch / accumulate`` rows, summed before the one update
      (`summed_value_and_grad`).

  Raises:
    ConfigError: if the global batch does not divide over the data-parallel degree (times
      ``accumulate``), or a parameter dimension does not divide over the mesh axes its rule
      maps it onto.
  """

  def __init__(
      self,
      task: Task,
      optimizer: optax.GradientTransformation,
      global_batch: int,
      mesh: Mesh,
      rules: ShardingRules,
      seed: int = 0,
      *,
      accumulate: int = 1,
  ):
    self.task, self.optimizer, self.mesh, self.rules = task, optimizer, mesh, rules
    self.global_batch, self.seed = global_batch, seed
    batch_axes = rules.compute.mesh_axes(('batch',))[0]
    self.data_parallel_degree = math.prod(mesh.shape[a] for a in batch_axes)
    if global_batch <= 0 or global_batch % self.data_parallel_degree:
      raise ConfigError(
          f'global batch {global_batch} is not divisible by the data-parallel degree '
          f'{self.data_parallel_degree} (batch split over mesh axes {batch_axes} of '
          f'{dict(mesh.shape)})')
    if accumulate < 1 or global_batch % (accumulate * self.data_parallel_degree):
      raise ConfigError(
          f'global batch {global_batch} is not divisible by accumulate {accumulate} x the '
          f'data-parallel degree {self.data_parallel_degree}: every micro-batch is split over '
          'the same devices')
    self.micro_rows = micro_rows_of(global_batch, accumulate, self.data_parallel_degree)

    self.layout = state_layout(task, optimizer, mesh, rules.params, seed)
    self.graphdef = self.layout.graphdef
    self.state_shardings = self.layout.shardings
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self._last_return: float | None = None
    self._evaluate = None
    self._lockstep = mesh.is_multi_process and mesh.devices.flat[0].platform == 'cpu'
    self._step = jax.jit(
        self._train_step,
        in_shardings=(self.state_shardings, None),
        out_shardings=(self.state_shardings, self.replicated),
        donate_argnums=0)

  def abstract_state(self) -> TrainState:
    """Shapes, dtypes and shardings of the state: the restore target for a checkpoint."""
    return self.layout.abstract_state()

  def close(self) -> None:
    """Nothing to release: the program holds only compiled functions and arrays."""

  def evaluate(self, state: TrainState, batch: Batch) -> dict[str, float]:
    """Mean loss (and the task's metrics) of the host ``batch`` under ``state.params``: a
    forward pass over the mesh (`hetjax.core.StepProgram.evaluate`); the batch's rows divide
    over the data-parallel degree."""
    if self._evaluate is None:
      def means(params, b):
        model = nnx.merge(self.graphdef, params)
        with activation_rules(self.mesh, self.rules.compute):
          return self.task.eval_means(model, b)
      self._evaluate = jax.jit(means, in_shardings=(self.state_shardings.params, None),
                               out_shardings=self.replicated)
    return {k: float(v) for k, v in self._evaluate(state.params, self.put_batch(batch)).items()}

  def use_host(self, host: Pace | None) -> None:
    """None only: one program over every device has no host of its own to pad to."""
    if host is not None:
      raise ConfigError('an SPMD step runs every device in one program and has no emulated '
                        'host: slowed hosts need mode shares, tokens, plan, replicas or ps')

  def whole_model(self, state: TrainState) -> nnx.Module | None:
    """The model with ``state``'s parameters (`hetjax.core.HasModel`); None when the mesh
    spans processes."""
    return None if self.mesh.is_multi_process else nnx.merge(self.graphdef, state.params)

  def init_state(self) -> TrainState:
    """Fresh parameters and optimizer state, created directly in their sharded layout."""
    return init_state(self.task, self.optimizer, self.layout, self.seed)

  def batch_sharding(self, ndim: int) -> NamedSharding:
    """Sharding of a batch array of rank ``ndim``: the leading axis is ``'batch'``."""
    return batch_sharding(self.mesh, self.rules.compute, ndim)

  def put_batch(self, batch: Batch) -> dict[str, jax.Array]:
    """Places a host batch on the mesh, split along the batch axis (one transfer call)."""
    return put_batch(dict(batch), self.mesh, self.rules.compute)

  def global_batch_at(self, step: int) -> Batch:
    """The host global batch of ``step`` (a function of the seed and the step only)."""
    return self.task.data.global_batch(self.seed, step, self.global_batch)

  def loss(self, params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean loss of ``batch`` under ``params``, traced with this trainer's activation rules."""
    model = nnx.merge(self.graphdef, params)
    with activation_rules(self.mesh, self.rules.compute):
      return jnp.mean(self.task.loss(model, batch))

  def per_example_loss(self, params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
    """Every example's loss under ``params``, traced with this trainer's activation rules."""
    model = nnx.merge(self.graphdef, params)
    with activation_rules(self.mesh, self.rules.compute):
      return self.task.loss(model, batch)

  def _train_step(self, state: TrainState, batch: dict[str, jax.Array]):
    if self.micro_rows is None:
      loss, grads = trainable_value_and_grad(self.loss)(state.params, batch)
    else:
      loss, grads = summed_value_and_grad(self.per_example_loss, state.params, batch,
                                          self.global_batch, self.micro_rows)
    return state.apply_gradients(self.optimizer, grads), {'loss': loss}

  def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes, dtypes and shardings of a placed global batch (from step 0's host batch)."""
    host = self.global_batch_at(0)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.batch_sharding(v.ndim))
            for k, v in host.items()}

  def trace_step(self) -> jax.stages.Traced:
    """The train step traced to a jaxpr, on abstract state and batch (nothing allocated): what
    `hetjax.train.program_flops` counts."""
    return self._step.trace(self.abstract_state(), self.abstract_batch())

  def lower_step(self) -> jax.stages.Lowered:
    """The train step lowered to HLO without compiling or allocating: its ``cost_analysis()``
    counts the model's FLOPs before XLA's passes (`hetjax.bench.compiled_flops` reads it)."""
    return self.trace_step().lower()

  def compile_step(self) -> jax.stages.Compiled:
    """The train step compiled ahead of time, without allocating state: what a plan check
    inspects (`memory_analysis()`, `cost_analysis()`, `as_text()` for its collectives)."""
    return self.lower_step().compile()

  def train_step(
      self, state: TrainState, batch: dict[str, jax.Array]
  ) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step; ``state`` is donated. Returns the new state and device metrics."""
    return self._step(state, batch)

  def step(self, state: TrainState, work: Work, decision: None = None
           ) -> tuple[TrainState, StepStats]:
    """One optimizer step on ``work`` (the `StepProgram` shape); ``state`` is donated.

    An SPMD step does not wait for the device, so its times are host-side: ``iter_s`` is the
    time since the previous step returned (in steady state, with dispatch running ahead, the
    device's step time), not a measured compute, so ``sampled`` is False and no policy reads it
    as a speed. ``stats.loss`` is a device scalar. On a CPU mesh over several processes the
    step is waited for (class docstring), so ``iter_s`` is then its whole time.
    """
    if decision is not None:
      raise ConfigError(f'an SPMD step takes no decision, got {decision!r}')
    start = time.perf_counter()
    state, metrics = self._step(state, self.put_batch(work.batch))
    if self._lockstep:
      state, metrics = jax.block_until_ready((state, metrics))
    end = time.perf_counter()
    iter_s = end - (start if self._last_return is None else self._last_return)
    self._last_return = end
    return state, StepStats(work.step, (self.global_batch,), (iter_s,), iter_s=iter_s,
                            sampled=(False,), loss=metrics['loss'])
