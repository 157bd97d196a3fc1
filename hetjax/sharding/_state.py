"""Sharded creation of Flax NNX models from the logical names on their parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.sharding._rules import LogicalRules, dimension_names, padded

PyTree = Any


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path)


def abstract_model(make_model: Callable[[nnx.Rngs], nnx.Module], seed: int = 0):
  """Returns ``(graphdef, abstract params, logical names)`` without allocating anything.

  ``abstract params`` is a pure nested dict of `jax.ShapeDtypeStruct`; ``logical names`` has the
  same structure with a tuple of logical names (or ``None``) per dimension at each leaf. A
  parameter annotated with fewer names than dimensions (Flax's ``nnx.MultiHeadAttention``
  kernels: ``('embed', 'heads')`` on ``(in_features, num_heads, head_dim)``) gets ``None`` for
  the trailing ones (`hetjax.sharding._rules.padded`), as JAX and Flax read it.
  """
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: make_model(nnx.Rngs(seed)))
  graphdef, state = nnx.split(model)
  shapes = nnx.to_pure_dict(state)
  specs = nnx.to_pure_dict(nnx.get_partition_spec(state))
  names = jax.tree.map(
      lambda spec, shape: padded(tuple(spec or ()), len(shape.shape)),
      specs, shapes, is_leaf=lambda x: x is None or isinstance(x, PartitionSpec))
  return graphdef, shapes, names


def unmapped_names(names: PyTree, rules: LogicalRules) -> tuple[str, ...]:
  """The logical names on a model's parameters that no rule of ``rules`` names, in the order
  they first appear: `LogicalRules.mesh_axes` replicates them (or ``fallback`` splits their
  parameter), which a run's start-up lines say once.

  A name that some rule names counts as mapped even where that rule cannot be used (its mesh
  axes taken by another dimension), and a name an explicit ``None`` rule replicates is mapped:
  the table decided it. A scope's rules count for every sub-model.

  Example::

    _, _, names = abstract_model(make_model)   # {'attn': {'qkv': ('embed', 'qkv')}, ...}
    unmapped_names(names, Strategy.HYBRID.rules().params)   # ('qkv',)

  Args:
    names: the logical names of `abstract_model`.
    rules: a parameter table (``ShardingRules.params``).
  """
  known = rules.named()
  found = dict.fromkeys(
      name for leaf in jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))
      for name in dimension_names(leaf) if name not in known)
  return tuple(found)


def submodel_names(make_model: Callable[[nnx.Rngs], nnx.Module]) -> tuple[str, ...]:
  """A model's sub-model names in forward order (empty if it does not name its parts)."""
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: make_model(nnx.Rngs(0)))
  return tuple(model.submodels()) if hasattr(model, 'submodels') else ()


def submodel_prefixes(make_model: Callable[[nnx.Rngs], nnx.Module]) -> dict[str, str]:
  """``{parameter path prefix: sub-model name}`` for a model with ``submodels()`` (else empty).

  Example: the transformer's ``'blocks/0'`` is its sub-model ``'block_0'``.
  """
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: make_model(nnx.Rngs(0)))
  if not hasattr(model, 'submodels'):
    return {}
  ids = {id(module): name for name, module in model.submodels().items()}
  return {'/'.join(str(k) for k in path): ids[id(node)]
          for path, node in nnx.iter_graph(model) if id(node) in ids}


def param_shardings(shapes: PyTree, names: PyTree, mesh: Mesh, rules: LogicalRules,
                    prefixes: dict[str, str] | None = None) -> PyTree:
  """Returns a `NamedSharding` per parameter, checking every split dimension divides evenly.

  Args:
    shapes, names: from `abstract_model`.
    mesh: where the parameters live.
    rules: the parameter rules; with ``scopes``, a parameter under a sub-model uses that
      sub-model's table.
    prefixes: `submodel_prefixes` of the model (needed only when ``rules`` has scopes).

  Raises:
    ShardingError: naming the parameter path, the dimension and the sizes.
  """
  def one(path, shape, logical):
    name = _path_name(path)
    spec = _table(rules, name, prefixes).checked_spec(logical, shape.shape, mesh,
                                                      f'parameter {name!r}')
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(
      one, shapes, names, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def _table(rules: LogicalRules, name: str, prefixes: dict[str, str] | None) -> LogicalRules:
  """The table for parameter path ``name``: its sub-model's scope, else ``rules``."""
  for prefix, submodel in (prefixes or {}).items():
    if name == prefix or name.startswith(prefix + '/'):
      return rules.in_scope(submodel)
  return rules


def fallen_back(shapes: PyTree, names: PyTree, mesh: Mesh, rules: LogicalRules,
                prefixes: dict[str, str] | None = None) -> tuple[str, ...]:
  """Where `param_shardings` split each parameter whose rule a fallback table set aside, the
  rule's mesh axes not dividing its dimension (`LogicalRules.relaxed`): one description a
  parameter, in tree order, for a run's start-up lines. One that no dimension divides is left
  whole and not listed here: its spec says so.

  Example: FSDP on 4 devices, a digits MLP whose ``w2`` is ``('mlp', 'embed')`` of shape
  ``(128, 10)``::

    fallen_back(shapes, names, mesh, Strategy.FSDP.rules().params)
    # ("w2 (128, 10) along dimension 0 instead of 1 ('embed')",)

  Args:
    shapes, names, mesh, rules, prefixes: as `param_shardings` takes them.
  """
  out = []
  for (path, shape), logical in zip(
      jax.tree_util.tree_flatten_with_path(shapes)[0],
      jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple)), strict=True):
    name = _path_name(path)
    table = _table(rules, name, prefixes)
    relaxed = table.relaxed(logical, shape.shape, mesh)
    if not relaxed:
      continue
    spec = padded(tuple(table.checked_spec(logical, shape.shape, mesh, name)), len(shape.shape))
    logical = padded(logical, len(shape.shape))
    split = [str(d) for d, entry in enumerate(spec) if entry is not None]
    if split:
      was = ', '.join(f'{d} ({logical[d]!r})' for d in relaxed)
      out.append(f'{name} {tuple(shape.shape)} along dimension {", ".join(split)} instead of '
                 f'{was}')
  return tuple(out)
