"""A sub-model's own training step under a layout, compiled on a mesh: its collectives as XLA
emits them.

Why compile rather than reason: which collectives a layout needs is XLA's decision, not ours.
Under FSDP a ring model assumes one reduce-scatter and one all-gather of the parameters; the
small LM's transformer block (bench_fela's ``lm_small``) compiled as ``dp8+fsdp`` on 8 CPU devices
has one all-reduce of the whole gradient (XLA:CPU reduces it in full and keeps its slice) and
13 all-gathers, one per sharded array and two arrays gathered again in the backward. The
whole-model step compiled with every block under FSDP has the same 13 per block.

The program is the sub-model alone, as `hetjax.planner.profile_submodels` compiles it, plus the
optimizer: ``vjp`` of its forward with respect to its parameters and floating-point inputs, fed a
cotangent of its output's shape, then the optimizer's ``update`` and ``apply_updates``. Its
parameters (and the optimizer state that follows them) are laid out by the layout's parameter
rules, its inputs and outputs split over the batch by its compute rules, and its activation
constraints (`hetjax.sharding.constrain`) traced under those rules, so it is the slice of the
planned step that belongs to this sub-model. As in profiling, the analysis reads the optimised
HLO, so the backend is compiled at ``xla_backend_optimization_level=0``.

Example::

  call = submodel_calls(task, 64)['block_0']           # lm_small, batch 64
  mesh = layout_mesh(jax.devices(), (2, 2, 2))
  moved = step_collectives(call, Layout(1, fsdp=True), mesh, optax.adam(1e-3), 64)
  moved.counts['all_gather'], moved.total_steps       # (13, 105): 13·7 + one all-reduce's 2·7
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hetjax.planner._hlo import CollectiveBytes, collective_bytes
from hetjax.planner._layout import Layout, axis_names
from hetjax.planner._profile import SubmodelCall
from hetjax.sharding import activation_rules

_ANALYSIS_OPTIONS = {'xla_backend_optimization_level': 0}


def layout_mesh(devices: Sequence[jax.Device], factors: tuple[int, ...]) -> Mesh:
  """The plan mesh (axes ``p0, p1, …`` of sizes ``factors``) over the first devices given."""
  count = int(np.prod(factors))
  grid = np.array(list(devices)[:count], dtype=object).reshape(factors)
  return Mesh(grid, axis_names(factors), axis_types=(AxisType.Auto,) * len(factors))


def factors_of(mesh: Mesh) -> tuple[int, ...]:
  return tuple(mesh.shape.values())


def sharded_params(module: nnx.Module, layout: Layout, mesh: Mesh) -> tuple[nnx.GraphDef, Any, Any]:
  """``(graphdef, params, rest)`` of ``module``: params a pure dict of `jax.ShapeDtypeStruct`
  sharded by the layout's parameter rules, rest (non-parameter state) replicated."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  rules = layout.params_rules(factors_of(mesh))
  is_spec = lambda x: x is None or isinstance(x, PartitionSpec)  # noqa: E731

  def place(spec, shape):
    names = tuple(spec) if spec else (None,) * len(shape.shape)
    sharding = NamedSharding(mesh, rules.checked_spec(names, shape.shape, mesh, 'parameter'))
    return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding)

  placed = jax.tree.map(place, nnx.to_pure_dict(nnx.get_partition_spec(params)),
                        nnx.to_pure_dict(params), is_leaf=is_spec)
  return graphdef, placed, _replicated(rest, mesh)


def optimizer_state(optimizer: optax.GradientTransformation, params: Any, mesh: Mesh) -> Any:
  """The optimizer state of ``params`` as sharded `jax.ShapeDtypeStruct`: slots follow their
  parameter (`optax.tree_map_params`, as the trainer lays them out), counters replicated."""
  shardings = jax.tree.map(lambda p: p.sharding, params)
  abstract = jax.eval_shape(optimizer.init, params)
  placed = optax.tree_map_params(
      optimizer, lambda _, s: s, abstract, shardings,
      transform_non_params=lambda _: NamedSharding(mesh, PartitionSpec()),
      is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, placed)


def step_collectives(call: SubmodelCall, layout: Layout, mesh: Mesh,
                     optimizer: optax.GradientTransformation, batch: int) -> CollectiveBytes:
  """The collectives of ``call``'s sub-model's training step under ``layout`` on ``mesh`` (module
  docstring), for a step of ``batch`` rows (the batch ``call`` was recorded at)."""
  return collective_bytes(_compile_step(call, layout, mesh, optimizer, batch))


def _compile_step(call: SubmodelCall, layout: Layout, mesh: Mesh,
                  optimizer: optax.GradientTransformation, batch: int) -> jax.stages.Compiled:
  compute = layout.compute_rules(factors_of(mesh))
  graphdef, params, rest = sharded_params(call.module, layout, mesh)
  opt_state = optimizer_state(optimizer, params, mesh)

  def rows(x):  # split over the batch when the leading dimension is the batch, as the step does
    names = ('batch',) + (None,) * (x.ndim - 1) if x.ndim and x.shape[0] == batch else ()
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, compute.spec(names)))

  inputs, treedef = jax.tree.flatten((call.args, call.kwargs))
  inexact = [jnp.issubdtype(x.dtype, jnp.inexact) for x in inputs]
  inputs = [rows(x) for x in inputs]
  cotangents = [rows(o) for o in jax.tree.leaves(call.out) if jnp.issubdtype(o.dtype, jnp.inexact)]

  def step(params, rest, opt_state, inputs, cotangents):
    def forward(params, floats):
      it = iter(floats)
      full = [next(it) if f else x for x, f in zip(inputs, inexact, strict=True)]
      args, kwargs = jax.tree.unflatten(treedef, full)
      with activation_rules(mesh, compute):
        out = nnx.merge(graphdef, params, rest)(*args, **kwargs)
      return [o for o in jax.tree.leaves(out) if jnp.issubdtype(o.dtype, jnp.inexact)]

    floats = [x for x, f in zip(inputs, inexact, strict=True) if f]
    outputs, pullback = jax.vjp(forward, params, floats)
    grads, input_grads = pullback(cotangents)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, outputs, input_grads

  sharding = lambda tree: jax.tree.map(lambda x: x.sharding, tree)  # noqa: E731
  floats = [x for x, f in zip(inputs, inexact, strict=True) if f]
  program = jax.jit(step, out_shardings=(sharding(params), sharding(opt_state),
                                         sharding(cotangents), sharding(floats)))
  lowered = program.lower(params, rest, opt_state, inputs, cotangents)
  return lowered.compile(compiler_options=_ANALYSIS_OPTIONS)


def _replicated(tree: Any, mesh: Mesh) -> Any:
  replicated = NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), tree)
