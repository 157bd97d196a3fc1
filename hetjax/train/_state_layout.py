"""Where every array of the train state lives, derived abstractly from logical names."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.sharding import (
  LogicalRules,
  abstract_model,
  initial_params,
  param_shardings,
  submodel_prefixes,
)
from hetjax.train._state import TrainState
from hetjax.train._task import Task
from hetjax.train._trainable import split_trainable


@dataclasses.dataclass(frozen=True)
class StateLayout:
  """The model structure, the abstract state and its shardings on one mesh.

  Attributes:
    graphdef: the model's structure (`nnx.merge(graphdef, params)` rebuilds it).
    abstract: `TrainState` of `jax.ShapeDtypeStruct` (no shardings).
    shardings: `TrainState` of `NamedSharding`, same structure.
    param_specs: the `PartitionSpec` of every parameter, mesh-independent.
  """

  graphdef: nnx.GraphDef
  abstract: TrainState
  shardings: TrainState
  param_specs: Any

  def abstract_state(self) -> TrainState:
    """Shapes, dtypes and shardings together: a restore target for a checkpoint."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        self.abstract, self.shardings)


def state_layout(
    task: Task,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    param_rules: LogicalRules,
    seed: int = 0,
) -> StateLayout:
  """Derives the train state's layout on ``mesh`` without allocating anything.

  Parameter shardings come from ``param_rules`` (checked for divisibility); the optimizer state,
  of the float parameters only (`split_trainable`), follows its parameters
  (`optax.tree_map_params`), counters are replicated.

  Raises:
    ShardingError: a parameter dimension that its mesh axes do not divide.
  """
  graphdef, abstract_params, names = abstract_model(task.make_model, seed)
  replicated = NamedSharding(mesh, PartitionSpec())
  prefixes = submodel_prefixes(task.make_model) if param_rules.scopes else None
  params_sh = param_shardings(abstract_params, names, mesh, param_rules, prefixes)
  abstract_opt = jax.eval_shape(optimizer.init, split_trainable(abstract_params)[0])
  opt_sh = optax.tree_map_params(
      optimizer, lambda _, sharding: sharding, abstract_opt,
      split_trainable(params_sh, like=abstract_params)[0],
      transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
  abstract = TrainState(jax.ShapeDtypeStruct((), jnp.int32), abstract_params, abstract_opt)
  specs = jax.tree.map(lambda s: s.spec, params_sh)
  return StateLayout(graphdef, abstract, TrainState(replicated, params_sh, opt_sh), specs)


def init_state(task: Task, optimizer: optax.GradientTransformation, layout: StateLayout,
               seed: int = 0) -> TrainState:
  """Fresh parameters and optimizer state, created directly in ``layout``'s shardings; the
  parameters read from ``task.weights`` where it is set (`hetjax.sharding.initial_params`)."""
  def start(params):
    return TrainState(jnp.zeros((), jnp.int32), params,
                      optimizer.init(split_trainable(params)[0]))

  if task.weights is not None:
    params = initial_params(task.make_model, seed, layout.shardings.params, task.weights)
    return jax.jit(start, out_shardings=layout.shardings, donate_argnums=0)(params)

  def init():
    with nnx.use_eager_sharding(False):
      model = task.make_model(nnx.Rngs(seed))
    return start(nnx.to_pure_dict(nnx.state(model)))

  return jax.jit(init, out_shardings=layout.shardings)()
