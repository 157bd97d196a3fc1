"""Sharded creation of Flax NNX models from the logical names on their parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.sharding._rules import LogicalRules

PyTree = Any


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


def abstract_model(make_model: Callable[[nnx.Rngs], nnx.Module], seed: int = 0):
  """Returns ``(graphdef, abstract params, logical names)`` without allocating anything.

  ``abstract params`` is a pure nested dict of `jax.ShapeDtypeStruct`; ``logical names`` has the
  same structure with a tuple of logical names (or ``None`` per dimension) at each leaf.
  """
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: make_model(nnx.Rngs(seed)))
  graphdef, state = nnx.split(model)
  shapes = nnx.to_pure_dict(state)
  specs = nnx.to_pure_dict(nnx.get_partition_spec(state))
  names = jax.tree.map(
      lambda spec, shape: tuple(spec) if spec else (None,) * len(shape.shape),
      specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))
  return graphdef, shapes, names


def param_shardings(shapes: PyTree, names: PyTree, mesh: Mesh, rules: LogicalRules) -> PyTree:
  """Returns a `NamedSharding` per parameter, checking every split dimension divides evenly.

  Raises:
    ShardingError: naming the parameter path, the dimension and the sizes.
  """
  def one(path, shape, logical):
    spec = rules.checked_spec(logical, shape.shape, mesh, f'parameter {_path_name(path)!r}')
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(
      one, shapes, names, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def init_sharded(
    make_model: Callable[[nnx.Rngs], nnx.Module],
    mesh: Mesh,
    rules: LogicalRules,
    seed: int = 0,
) -> tuple[nnx.GraphDef, PyTree, PyTree]:
  """Creates a model's parameters directly in their sharded layout.

  Abstract first: shapes and logical names come from `nnx.eval_shape`, shardings from
  ``rules``, and the real initializer runs under ``jax.jit(..., out_shardings=…)`` so no device
  ever holds a full copy of a parameter that is meant to be split.

  Example::

    graphdef, params, shardings = init_sharded(lambda r: MLP(rngs=r), mesh, rules)
    model = nnx.merge(graphdef, params)

  Returns:
    ``(graphdef, params, shardings)``: params as a pure dict of arrays, and their shardings.
  """
  graphdef, shapes, names = abstract_model(make_model, seed)
  shardings = param_shardings(shapes, names, mesh, rules)

  def init():
    with nnx.use_eager_sharding(False):
      return nnx.to_pure_dict(nnx.state(make_model(nnx.Rngs(seed))))

  params = jax.jit(init, out_shardings=shardings)()
  return graphdef, params, shardings
