"""The per-stage programs of a `PipelineTrainer`, and the order they are dispatched in.

Each stage compiles (see `hetjax.pipeline.PipelineTrainer`'s module docstring for why):

* forward ``F_s(params, carry_in, batch) -> carry_out``;
* backward ``B_s(params, acc, carry_in, batch, d_carry_out) -> (acc + d_params, d_carry_in)``,
  the forward recomputed under `jax.vjp`; the last stage's runs forward and ``chain_loss`` and
  differentiates ``Σ losses / global_batch``;
* ``zeros`` (a fresh accumulator) and ``update`` (the optimizer on the stage's parameters).

Gradients, accumulators and the optimizer's state are those of the stage's float parameters
only (`hetjax.train.split_trainable`); any other state of its links is carried unchanged.

`StageProgramsMixin` holds the functions that trace them; `PipelineTrainer` supplies the stage
layouts, shardings and chain they read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hetjax.data import Batch
from hetjax.pipeline._schedule import BACKWARD, FORWARD, Action, Schedule, finish_times
from hetjax.pipeline._transfer import CarrySpecs
from hetjax.sharding import activation_rules, scope
from hetjax.train import merge_trainable, split_trainable

PyTree = Any


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


class StageProgramsMixin:
  """Tracing and compiling a `PipelineTrainer`'s per-stage programs (module docstring)."""

  def _apply(self, s: int, params: PyTree, carry: PyTree, batch: Batch) -> PyTree:
    """Stage ``s``'s links on ``carry`` (traced inside the stage's programs)."""
    with activation_rules(self.meshes[s], self.layouts[s].rules.compute):
      for name in self.stage_links[s]:
        module = nnx.merge(self.graphdefs[name], params[name])
        with scope(name):
          carry = self.links[name].apply(module, carry, batch)
    return carry

  def _backward(self, s: int, params, grads, carry, batch, d_out):
    """``(grads + d_params, d_carry_in)``; stage 0 has no carry to differentiate."""
    trainable, fixed = split_trainable(params)
    if s == 0:
      _, vjp = jax.vjp(lambda t: self._apply(s, merge_trainable(t, fixed), None, batch),
                       trainable)
      (d_params,), d_in = vjp(d_out), None
    else:
      _, vjp = jax.vjp(lambda t, c: self._apply(s, merge_trainable(t, fixed), c, batch),
                       trainable, carry)
      d_params, d_in = vjp(d_out)
    return jax.tree.map(jnp.add, grads, d_params), d_in

  def _backward_last(self, params, acc, carry, batch):
    """``(loss + Σ losses / X, grads + d_params, d_carry_in)`` for the last stage."""
    s = self.stages - 1
    loss, grads = acc
    trainable, fixed = split_trainable(params)

    def partial_loss(t, c):
      out = self._apply(s, merge_trainable(t, fixed), c, batch)
      with activation_rules(self.meshes[s], self.layouts[s].rules.compute):
        return jnp.sum(self._chain_loss(out, batch)) / self.global_batch

    if s == 0:
      part, vjp = jax.vjp(lambda t: partial_loss(t, None), trainable)
      (d_params,), d_in = vjp(jnp.ones_like(part)), None
    else:
      part, vjp = jax.vjp(partial_loss, trainable, carry)
      d_params, d_in = vjp(jnp.ones_like(part))
    return loss + part, jax.tree.map(jnp.add, grads, d_params), d_in

  def _compile(self, s: int) -> StagePrograms:
    rep, rows = self._replicated[s], self._rows[s]
    params_sh, opt_sh = self._shardings[s]
    abstract = self._abstract[s]
    grads_sh = split_trainable(params_sh, like=abstract)[0]

    def zeros():
      grads = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), split_trainable(abstract)[0])
      return (jnp.zeros((), jnp.float32), grads) if s == self.stages - 1 else grads

    def update(params, opt_state, grads):
      trainable, fixed = split_trainable(params)
      updates, opt_state = self.optimizer.update(grads, opt_state, trainable)
      return merge_trainable(optax.apply_updates(trainable, updates), fixed), opt_state

    if s == self.stages - 1:
      backward = jax.jit(self._backward_last, out_shardings=(rep, grads_sh, rows),
                         donate_argnums=1)
      acc_sh = (rep, grads_sh)
    else:
      backward = jax.jit(lambda p, acc, c, b, d: self._backward(s, p, acc, c, b, d),
                         out_shardings=(grads_sh, rows), donate_argnums=1)
      acc_sh = grads_sh
    return StagePrograms(
        forward=jax.jit(lambda p, c, b: self._apply(s, p, c, b), out_shardings=rows),
        backward=backward,
        zeros=jax.jit(zeros, out_shardings=acc_sh),
        update=jax.jit(update, out_shardings=(params_sh, opt_sh), donate_argnums=(0, 1)))

  def abstract_params(self, s: int) -> PyTree:
    """Stage ``s``'s parameters as `jax.ShapeDtypeStruct`s with their shardings."""
    return jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                        self._abstract[s], self._shardings[s][0])

  def compile_stages(self, host_batch: Batch | None = None) -> dict[int, dict[str, Any]]:
    """Every local stage's programs compiled ahead of time, without allocating anything:
    ``{stage: {'forward', 'backward', 'update': jax.stages.Compiled}}`` (the last stage has
    no forward program). What a plan check inspects (`memory_analysis()`, collectives)."""
    host_batch = self.global_batch_at(0) if host_batch is None else host_batch
    specs = (self._specs or CarrySpecs(self._apply, self._abstract, self.micro_rows))(host_batch)
    part = {k: v[:self.micro_rows] for k, v in host_batch.items()}
    out = {}
    for s in self.local_stages:
      rows = self._rows[s]
      at = lambda tree, sh: jax.tree.map(  # noqa: E731
          lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), tree)
      params = self.abstract_params(s)
      grads = split_trainable(params)[0]
      opt = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                         jax.eval_shape(self.optimizer.init, grads), self._shardings[s][1])
      batch = at(jax.eval_shape(lambda: part), rows)
      carry = None if s == 0 else at(specs[s], rows)
      program, compiled = self.programs[s], {}
      if s == self.stages - 1:
        acc = (jax.ShapeDtypeStruct((), jnp.float32, sharding=self._replicated[s]), grads)
        compiled['backward'] = program.backward.lower(params, acc, carry, batch).compile()
      else:
        d_out = at(specs[s + 1], rows)
        compiled['forward'] = program.forward.lower(params, carry, batch).compile()
        compiled['backward'] = program.backward.lower(params, grads, carry, batch,
                                                      d_out).compile()
      compiled['update'] = program.update.lower(params, opt, grads).compile()
      out[s] = compiled
    return out

