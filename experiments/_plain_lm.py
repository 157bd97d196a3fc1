"""`PlainLM`: a hand-written `jax.jit` training step of a task, the reference `bench_lm.py`,
`bench_overhead.py` and `gpu_check.py` time hetjax's `Trainer` against, and `SideBySide`, which
runs the two on the same batches for them.

It uses from hetjax only the task (model factory, per-example loss, data) and, optionally, the
model's own activation constraints (`hetjax.sharding.activation_rules`): parameters and
optimizer state laid out by hand-made `NamedSharding`s and donated, the batch split over every
mesh axis, one `jax.jit` of `jax.value_and_grad` of the mean loss and `optax.apply_updates`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.sharding import activation_rules
from hetjax.train import training_steps

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
    specs: a `PartitionSpec` per parameter (a pure dict, as `nnx.to_pure_dict` gives); None:
      every parameter replicated (plain data parallelism).
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
    self.graphdef, abstract = nnx.split(nnx.eval_shape(self._make))
    abstract_params = nnx.to_pure_dict(abstract)
    self.param_shardings = (
        jax.tree.map(lambda _: replicated, abstract_params) if specs is None else
        jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                     is_leaf=lambda x: isinstance(x, PartitionSpec)))
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
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


class SideBySide:
  """hetjax's ``trainer`` and the ``plain`` loop on the same task, from their own initial
  states (the same seed), each traced (``*_traced``, their FLOPs: `hetjax.train.program_flops`)
  and lowered (``*_lowered``) and,
  unless ``compile_ahead`` is False, compiled ahead of time (``*_compiled``, ``*_compile_s``;
  else None: on a GPU a compile is seconds, and the first step compiles anyway), and run ``n``
  steps at a time on the same batches, every step's loss kept, so a benchmark can interleave
  the two and compare their losses.

  Example::

    sides = SideBySide(trainer, plain)
    sides.run_hetjax(1), sides.run_plain(1)        # warm-up
    times = _harness.interleave({'hetjax': ..., 'plain': ...}, rounds)
    diff, identical = sides.loss_difference()
  """

  def __init__(self, trainer, plain: PlainLM, compile_ahead: bool = True):
    self.trainer, self.plain = trainer, plain
    self.state = trainer.init_state()
    self.params, self.opt_state = plain.init()
    self.hetjax_traced = trainer.trace_step()
    self.plain_traced = plain.step.trace(self.params, self.opt_state, plain.batch_at(0))
    self.hetjax_lowered = self.hetjax_traced.lower()
    self.plain_lowered = self.plain_traced.lower()
    self.hetjax_compiled = self.plain_compiled = None
    self.hetjax_compile_s = self.plain_compile_s = None
    if compile_ahead:
      start = time.perf_counter()
      self.hetjax_compiled = self.hetjax_lowered.compile()
      self.hetjax_compile_s = time.perf_counter() - start
      start = time.perf_counter()
      self.plain_compiled = self.plain_lowered.compile()
      self.plain_compile_s = time.perf_counter() - start
    self.hetjax_losses: list = []
    self.plain_losses: list = []

  def run_hetjax(self, n: int) -> None:
    """``n`` more steps of hetjax's loop (`training_steps`), waited for."""
    state, until = self.state, len(self.hetjax_losses) + n
    for info in training_steps(self.trainer, state, until=until):
      state = info.state
      self.hetjax_losses.append(info.stats.loss)
    self.state = jax.block_until_ready(state)
    jax.block_until_ready(self.hetjax_losses[-n:])

  def run_plain(self, n: int) -> None:
    """``n`` more steps of the plain loop on the same batches, waited for."""
    params, opt_state, first = self.params, self.opt_state, len(self.plain_losses)
    for step in range(first, first + n):
      params, opt_state, loss = self.plain.step(params, opt_state, self.plain.batch_at(step))
      self.plain_losses.append(loss)
    self.params, self.opt_state = jax.block_until_ready((params, opt_state))
    jax.block_until_ready(self.plain_losses[-n:])

  def losses(self) -> tuple[np.ndarray, np.ndarray]:
    """Every step's loss so far: ``(hetjax, plain)``."""
    return (np.array([float(x) for x in self.hetjax_losses]),
            np.array([float(x) for x in self.plain_losses]))

  def loss_difference(self) -> tuple[float, bool]:
    """The largest relative difference of hetjax's losses from the plain loop's, and whether
    they are bit-identical."""
    het, plain = self.losses()
    return float(np.max(np.abs(het - plain) / np.abs(plain))), bool(np.array_equal(het, plain))
