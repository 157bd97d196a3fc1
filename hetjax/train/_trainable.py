"""Which leaves of a model's state the optimizer trains: its floating-point arrays.

`TrainState.params` is the pure dict of *all* of a model's state (``nnx.to_pure_dict``), so a
checkpoint holds the whole model and `hetjax.run.load_model` gives it back as it was. Not all
of that state can be differentiated. ``nnx.Dropout(rate, rngs=rngs)`` keeps a random stream in
the model (``dropout/rngs/count``, a uint32, and ``dropout/rngs/key``, a PRNG key), and so does
``nnx.bridge.ToNNX(module, rngs=rngs)`` (``to_nnx__rngs/default/{count,key}``); `jax.grad`
refuses them ("grad requires real- or complex-valued inputs"). So every step program
differentiates the loss with respect to the inexact (floating or complex) leaves only, the
optimizer's state is made for those only, and the other leaves are carried through the step
unchanged: for a model whose state is all floats (every shipped model) nothing differs.

The other leaves are held at their initial values. A stream stored in the model then draws the
same dropout masks at every step (the loss advances a copy of its count, which no step keeps);
a model that wants masks that change passes its ``rngs`` at call time (``model(x, rngs=key)``
with a key folded from the step, as tests/foreign/dropout_mlp.py's ``masks='example'`` does).

`split_trainable` parts a tree into the trainable leaves and the rest, each in the tree's own
structure with ``None`` in the other's places (Equinox's ``partition``); `merge_trainable`
puts them back together.

  >>> import jax.numpy as jnp
  >>> params = {'w': jnp.ones(2), 'count': jnp.zeros((), jnp.uint32)}
  >>> trainable, fixed = split_trainable(params)
  >>> trainable['count'] is None and fixed['w'] is None
  True
  >>> merge_trainable(trainable, fixed)['count'].dtype
  dtype('uint32')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any

#: Paths a start-up line names before it says how many more there are.
SHOWN_PATHS = 3


def is_trainable(leaf: Any) -> bool:
  """Whether a leaf (an array, a `jax.ShapeDtypeStruct` or a Python number) is one the
  optimizer trains: of an inexact dtype (a PRNG key is not, nor an integer counter)."""
  dtype = getattr(leaf, 'dtype', None)
  return bool(jnp.issubdtype(jnp.result_type(leaf) if dtype is None else dtype, jnp.inexact))


def split_trainable(tree: PyTree, like: PyTree | None = None) -> tuple[PyTree, PyTree]:
  """``(trainable, fixed)``: ``tree``'s leaves whose parameter is trainable (`is_trainable`),
  and the others, each in ``tree``'s structure with ``None`` where the other has a leaf.

  Example: the optimizer-state shardings of a model with a dropout stream are those of its
  float parameters only::

    trainable_shardings, _ = split_trainable(param_shardings, like=abstract_params)

  Args:
    tree: the model's parameters (``nnx.to_pure_dict``), or a tree laid out like them.
    like: the parameters whose dtypes decide, when ``tree`` holds something else per parameter
      (its `NamedSharding` or `PartitionSpec`); default ``tree`` itself.
  """
  leaves, treedef = jax.tree.flatten(tree if like is None else like)
  values = leaves if like is None else treedef.flatten_up_to(tree)
  keep = [is_trainable(leaf) for leaf in leaves]
  return (treedef.unflatten([v if k else None for v, k in zip(values, keep, strict=True)]),
          treedef.unflatten([None if k else v for v, k in zip(values, keep, strict=True)]))


def merge_trainable(trainable: PyTree, fixed: PyTree) -> PyTree:
  """The whole tree again from `split_trainable`'s two parts (``trainable`` may be updated)."""
  return jax.tree.map(lambda t, f: f if t is None else t, trainable, fixed,
                      is_leaf=lambda x: x is None)


def trainable_value_and_grad(fun: Callable[..., jax.Array]) -> Callable[..., tuple]:
  """`jax.value_and_grad` of ``fun(params, *args)`` with respect to ``params``'s trainable
  leaves only; the others are closed over, unchanged. The gradient has the structure of
  ``split_trainable(params)[0]`` (``params``'s own for a model of float parameters only).

  Example::

    loss, grads = trainable_value_and_grad(loss_fn)(state.params, batch)
    state = state.apply_gradients(optimizer, grads)
  """
  def value_and_grad(params: PyTree, *args: Any) -> tuple[jax.Array, PyTree]:
    trainable, fixed = split_trainable(params)
    return jax.value_and_grad(lambda t, *a: fun(merge_trainable(t, fixed), *a))(trainable, *args)
  return value_and_grad


def fixed_paths(params: PyTree) -> tuple[str, ...]:
  """The ``/``-joined paths of ``params``'s leaves that are not trained, in leaf order."""
  return tuple('/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)
               for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
               if not is_trainable(leaf))


def fixed_state_notice(params: PyTree) -> str | None:
  """The start-up line naming the model state that is held fixed (up to `SHOWN_PATHS` paths),
  or None when every leaf is trained.

  Example: Flax's dropout classifier, ``nnx.Dropout(rate, rngs=rngs)``::

    model state that is not a float parameter is held fixed: dropout/rngs/count,
    dropout/rngs/key (a stream stored in the model repeats its dropout masks every step; pass
    rngs at call time for masks that change)
  """
  paths = fixed_paths(params)
  if not paths:
    return None
  more = f', … ({len(paths) - SHOWN_PATHS} more)' if len(paths) > SHOWN_PATHS else ''
  return (f'model state that is not a float parameter is held fixed: '
          f'{", ".join(paths[:SHOWN_PATHS])}{more} (a stream stored in the model repeats its '
          'dropout masks every step; pass rngs at call time for masks that change)')
