"""`PlainLM`: a hand-written `jax.jit` training step of a language model task, the reference
`bench_lm.py` and `gpu_check.py` time hetjax's `Trainer` against.

It uses from hetjax only the task (model factory, per-example loss, data) and, optionally, the
model's own activation constraints (`hetjax.sharding.activation_rules`): parameters and
optimizer state laid out by hand-made `NamedSharding`s and donated, the batch split over every
mesh axis, one `jax.jit` of `jax.value_and_grad` of the mean loss and `optax.apply_updates`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.sharding import activation_rules

SEED = 0


class PlainLM:
  """Hand-written `jax.jit` training of ``task`` with the parameters laid out by ``specs``.

  Example::

    plain = PlainLM(task, optax.adamw(1e-3), mesh, specs, global_batch=8)
    params, opt_state = plain.init()
    params, opt_state, loss = plain.step(params, opt_state, plain.batch_at(0))

  Args:
    task: only ``make_model``, ``loss`` and ``data`` are used.
    optimizer: an optax transformation.
    mesh: the devices; the batch's leading axis is split over all of its axes.
    specs: a `PartitionSpec` per parameter (a pure dict, as `nnx.to_pure_dict` gives).
    global_batch: rows per step.
    seed: initialises the parameters and selects the data.
    compute_rules: logical rules the model's activation constraints follow while the step is
      traced (`hetjax.sharding.activation_rules`); None: no constraints.
  """

  def __init__(self, task, optimizer: optax.GradientTransformation, mesh: Mesh, specs,
               global_batch: int, seed: int = SEED, compute_rules=None):
    self.task, self.optimizer, self.global_batch, self.seed = task, optimizer, global_batch, seed
    self.mesh, self.compute_rules = mesh, compute_rules
    replicated = NamedSharding(mesh, PartitionSpec())
    self.param_shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                        is_leaf=lambda x: isinstance(x, PartitionSpec))
    self.graphdef, abstract = nnx.split(nnx.eval_shape(self._make))
    abstract_opt = jax.eval_shape(optimizer.init, nnx.to_pure_dict(abstract))
    self.opt_shardings = optax.tree_map_params(
        optimizer, lambda _, sharding: sharding, abstract_opt, self.param_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    self.batch_sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    self.step = jax.jit(
        self._step,
        in_shardings=(self.param_shardings, self.opt_shardings, self.batch_sharding),
        out_shardings=(self.param_shardings, self.opt_shardings, replicated),
        donate_argnums=(0, 1))

  def _make(self) -> nnx.Module:
    with nnx.use_eager_sharding(False):
      return self.task.make_model(nnx.Rngs(self.seed))

  def init(self):
    """Parameters and optimizer state, created under `jax.jit` in their layout."""
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.split(self._make())[1]),
                     out_shardings=self.param_shardings)()
    opt_state = jax.jit(self.optimizer.init, out_shardings=self.opt_shardings)(params)
    return params, opt_state

  def batch_at(self, step: int) -> dict[str, jax.Array]:
    host = self.task.data.global_batch(self.seed, step, self.global_batch)
    return jax.device_put(host, self.batch_sharding)

  def _step(self, params, opt_state, batch):
    def mean_loss(p):
      return jnp.mean(self.task.loss(nnx.merge(self.graphdef, p), batch))

    if self.compute_rules is None:
      loss, grads = jax.value_and_grad(mean_loss)(params)
    else:
      with activation_rules(self.mesh, self.compute_rules):
        loss, grads = jax.value_and_grad(mean_loss)(params)
    updates, opt_state = self.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
