"""Timing a sub-model's optimizer update under several parameter layouts, side by side.

Why measure: the update is memory-bound, and what sharding it saves depends on what the devices
share. A traffic formula says FSDP on 8 devices saves 7/8 of the update's bytes; where 8
virtual CPU devices share the cores and the memory bus, the small LM's block update saves far
less than the formula says when sharded: part of the update is a fixed cost per array and per
device that sharding does not remove.

What is timed: optax's ``update`` then ``apply_updates`` of the sub-model's parameters, jitted
with the layout's shardings for parameters, gradients and optimizer state (slots follow their
parameter), parameters and state donated, as the train step holds them, on the same mesh the
step runs on. Why the comparison is fair: both layouts run on the same devices, arrays of the same
shapes and the same values, the same number of arrays and dispatches; each is compiled and run
once before timing (compile, first-touch allocation); then ``repeats`` rounds alternate the
layouts, the order rotating each round so that a slow phase of the shared machine hits both
alike, each sample the mean of ``calls`` back-to-back calls ended by ``block_until_ready``; the
median over rounds discards the spikes. Costs common to both (dispatch, a call's fixed overhead)
cancel in the difference, which is what the cost model uses.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from hetjax.planner._layout import Layout
from hetjax.planner._submodel_step import optimizer_state, sharded_params


def update_seconds(module: nnx.Module, layouts: Sequence[Layout], mesh: Mesh,
                   optimizer: optax.GradientTransformation, repeats: int = 7,
                   calls: int = 5) -> tuple[float, ...]:
  """Median seconds of one optimizer update of ``module``'s parameters, per layout (module
  docstring).

  Example::

    replicated, sharded = update_seconds(block, [Layout(1), Layout(1, fsdp=True)], mesh,
                                         optax.adam(1e-3))
    sharded - replicated   # negative where sharding saves time: this machine's figure
  """
  programs = [_Update(module, layout, mesh, optimizer) for layout in layouts]
  for program in programs:
    program.run(1)  # compiles; touches the donated buffers once
  samples: list[list[float]] = [[] for _ in programs]
  for r in range(repeats):
    for i in [(r + k) % len(programs) for k in range(len(programs))]:
      samples[i].append(programs[i].run(calls))
  return tuple(statistics.median(s) for s in samples)


class _Update:
  """One layout's jitted update and the arrays it runs on (parameters 0.01, gradients 1e-3:
  ordinary magnitudes, no denormals; the optimizer state zeros, as Adam's and SGD's momentum
  start)."""

  def __init__(self, module: nnx.Module, layout: Layout, mesh: Mesh,
               optimizer: optax.GradientTransformation):
    _, params, _ = sharded_params(module, layout, mesh)
    opt_state = optimizer_state(optimizer, params, mesh)
    shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)  # noqa: E731

    def update(params, opt_state, grads):
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    self.update = jax.jit(update, out_shardings=(shardings(params), shardings(opt_state)),
                          donate_argnums=(0, 1))
    self.params = _filled(params, 0.01)
    self.grads = _filled(params, 1e-3)
    self.opt_state = _filled(opt_state, 0)  # Adam's own start (zero moments, count 0)

  def run(self, calls: int) -> float:
    """Seconds per call of ``calls`` back-to-back updates."""
    start = time.perf_counter()
    for _ in range(calls):
      self.params, self.opt_state = self.update(self.params, self.opt_state, self.grads)
    jax.block_until_ready((self.params, self.opt_state))
    return (time.perf_counter() - start) / calls


def _filled(abstract: Any, value: float) -> Any:
  """Arrays of ``abstract``'s shapes and shardings holding ``value``, put from the host (a
  jitted fill would cost a compile per layout)."""
  return jax.tree.map(
      lambda x: jax.device_put(np.full(x.shape, value, x.dtype), x.sharding), abstract)
