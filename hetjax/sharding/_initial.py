"""A model's starting parameters: drawn from its seed, or read from elsewhere (`Weights`: a
Hugging Face checkpoint), and placed straight onto their shardings.

Every program of the engine starts its parameters here (`hetjax.train`'s trainers, the pipeline's
stages, a parameter server's model), so a task's ``weights`` (`hetjax.train.Task.weights`) start
every mode alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from hetjax._errors import ConfigError
from hetjax.sharding._rules import LogicalRules
from hetjax.sharding._state import abstract_model, param_shardings, submodel_prefixes

PyTree = Any


@runtime_checkable
class Weights(Protocol):
  """Parameter values from outside the model (a pretrained checkpoint), one parameter at a time.

  ``read(path)`` returns the parameter at ``path``, the keys of the model's
  ``nnx.to_pure_dict(nnx.state(model))`` layout (``('blocks', 0, 'attn', 'query')``), as a host
  array of the parameter's shape; it is cast to the parameter's dtype when placed. It is called
  once per parameter, in the tree's order, and each array is dropped once placed: a source read
  lazily (`hetjax.models.hf.HfWeights` over a `safetensors` directory) holds one tensor at a
  time on the host, never the whole model.
  """

  def read(self, path: tuple[Any, ...]) -> Any:
    ...


def init_sharded(
    make_model: Callable[[nnx.Rngs], nnx.Module],
    mesh: Mesh,
    rules: LogicalRules,
    seed: int = 0,
    weights: Weights | None = None,
) -> tuple[nnx.GraphDef, PyTree, PyTree]:
  """Creates a model's parameters directly in their sharded layout.

  Abstract first: shapes and logical names come from `nnx.eval_shape`, shardings from
  ``rules``, and the real initializer runs under ``jax.jit(..., out_shardings=…)`` (or each
  parameter is read from ``weights`` onto its sharding), so no device ever holds a full copy of
  a parameter that is meant to be split.

  Example::

    graphdef, params, shardings = init_sharded(lambda r: MLP(rngs=r), mesh, rules)
    model = nnx.merge(graphdef, params)

  Returns:
    ``(graphdef, params, shardings)``: params as a pure dict of arrays, and their shardings.
  """
  graphdef, shapes, names = abstract_model(make_model, seed)
  prefixes = submodel_prefixes(make_model) if rules.scopes else None
  shardings = param_shardings(shapes, names, mesh, rules, prefixes)
  return graphdef, initial_params(make_model, seed, shardings, weights), shardings


def initial_params(make_model: Callable[[nnx.Rngs], nnx.Module], seed: int = 0,
                   shardings: PyTree | None = None, weights: Weights | None = None) -> PyTree:
  """The model's starting parameters as its pure nested dict: ``make_model(nnx.Rngs(seed))``'s
  (one jitted initialisation, each parameter created in its sharding), or, given ``weights``,
  each parameter read from them and placed onto its sharding (`read_weights`).

  Args:
    make_model: the task's model factory.
    seed: the initialisation's seed (the model's structure only, with ``weights``).
    shardings: the parameters' shardings (the pure dict's structure); None: the default device.
    weights: where to read the parameters from; None: initialise them from ``seed``.
  """
  if weights is None:
    def init():
      with nnx.use_eager_sharding(False):
        return nnx.to_pure_dict(nnx.state(make_model(nnx.Rngs(seed))))
    return jax.jit(init, out_shardings=shardings)()
  return read_weights(weights, abstract_model(make_model, seed)[1], shardings)


def read_weights(weights: Weights, shapes: PyTree, shardings: PyTree | None = None,
                 prefix: tuple[Any, ...] = ()) -> PyTree:
  """Every leaf of ``shapes`` (`jax.ShapeDtypeStruct`s) read from ``weights`` at ``prefix`` +
  its path and placed onto its sharding in ``shardings`` (the same structure; None: the default
  device), one at a time: `jax.make_array_from_callback` hands each device (each process, its
  own) its slice of the host array.

  Raises:
    ConfigError: a value of another shape than the parameter's.
  """
  def one(path, like, sharding=None):
    keys = prefix + tuple(_key(k) for k in path)
    value = np.asarray(weights.read(keys))
    if value.shape != tuple(like.shape):
      raise ConfigError(f'weights: parameter {"/".join(map(str, keys))} read with shape '
                        f'{value.shape}, the model has {tuple(like.shape)}')
    value = value.astype(like.dtype, copy=False)
    if sharding is None:
      return jax.device_put(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

  if shardings is None:
    return jax.tree_util.tree_map_with_path(one, shapes)
  return jax.tree_util.tree_map_with_path(one, shapes, shardings)


def _key(entry) -> Any:
  return getattr(entry, 'key', getattr(entry, 'idx', getattr(entry, 'name', entry)))
