"""A hand-written data-parallel train step: the reference that `bench_overhead.py` times hetjax
against.

It uses nothing from hetjax but the task (model factory, per-example loss, data): parameters are
replicated with one `NamedSharding`, the batch is split on its leading axis over every mesh axis,
and the step is one `jax.jit` with the parameters and optimizer state donated.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

PyTree = Any


class PlainDataParallel:
  """Plain `jax.jit` data parallelism for ``task`` on ``mesh``.

  Example::

    plain = PlainDataParallel(task, optax.adam(1e-3), mesh, global_batch=256)
    params, opt_state = plain.init()
    for step in range(100):
      params, opt_state, loss = plain.step(params, opt_state, plain.batch_at(step))

  Args:
    task: a `hetjax.train.Task` (only ``make_model``, ``loss`` and ``data`` are used).
    optimizer: an optax transformation.
    mesh: the devices; the batch is split over all of its axes.
    global_batch: examples per step over the whole mesh.
    seed: initialises parameters and selects the data, as in `hetjax.train.Trainer`.
  """

  def __init__(self, task, optimizer: optax.GradientTransformation, mesh: Mesh,
               global_batch: int, seed: int = 0):
    self.task, self.optimizer, self.global_batch, self.seed = task, optimizer, global_batch, seed
    self.replicated = NamedSharding(mesh, PartitionSpec())
    self.batch_sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    self.step = jax.jit(self._step, donate_argnums=(0, 1))
    self.graphdef: nnx.GraphDef | None = None  # set by init()

  def init(self) -> tuple[PyTree, PyTree]:
    """Replicated parameters and optimizer state.

    The values are built under `jax.jit` from ``make_model(nnx.Rngs(seed))``, the same program
    the Trainer runs, so both sides of the benchmark start bit-identical.
    """
    def make() -> nnx.Module:
      with nnx.use_eager_sharding(False):
        return self.task.make_model(nnx.Rngs(self.seed))

    self.graphdef, _ = nnx.split(nnx.eval_shape(make))
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.split(make())[1]),
                     out_shardings=self.replicated)()
    opt_state = jax.jit(self.optimizer.init, out_shardings=self.replicated)(params)
    return params, opt_state

  def batch_at(self, step: int) -> dict[str, jax.Array]:
    """The global batch of ``step``, built on the host and split over the mesh."""
    host = self.task.data.global_batch(self.seed, step, self.global_batch)
    return jax.device_put(host, self.batch_sharding)

  def _loss(self, params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.mean(self.task.loss(nnx.merge(self.graphdef, params), batch))

  def _step(self, params: PyTree, opt_state: PyTree, batch: dict[str, jax.Array]):
    loss, grads = jax.value_and_grad(self._loss)(params, batch)
    updates, opt_state = self.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
