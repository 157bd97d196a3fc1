"""Whether a checkpoint holds the tree a restore asks for: the same leaves, shapes and dtypes.

A checkpoint's record lists every leaf it holds with its shape and dtype (``'checksums'``,
`hetjax.checkpoint._record`). When a restore fails, comparing that list with the restore
target tells a checkpoint of another model (the user's model changed since it was saved: a
layer added, a width changed) from a corrupt one. Only a corrupt one is worth skipping for an
older step: the older checkpoints of a run hold the same tree as its latest, so for another
model's tree the restore stops at once with the parameters that differ.

Example::

  >>> import jax, jax.numpy as jnp
  >>> saved = {'params/w': {'sum': 7, 'shape': [8, 16], 'dtype': 'float32'}}
  >>> difference(saved, {'params': {'w': jax.ShapeDtypeStruct((8, 32), jnp.float32),
  ...                               'b': jax.ShapeDtypeStruct((32,), jnp.float32)}})
  "holds other parameters than this model (was the model changed since it was saved?): 1 not \
in the checkpoint ('params/b' [32]); 1 changed ('params/w' [8, 16] saved, [8, 32] now)"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

#: How many leaves a message names in all; the rest are counted.
LISTED = 10


def difference(saved: Mapping[str, Mapping[str, Any]], target: Any) -> str | None:
  """How the leaves of a checkpoint's record (``saved``, its `checksums`) differ from those of
  the restore ``target`` in path, shape or dtype, in a few words, or None if they are the same.

  The parameters (paths under ``params/``) are named first: where they differ, the optimizer
  state differs alike, and only they are named. A None in ``target`` stands for a part that
  another process restores (a pipeline stage it does not hold): the saved leaves under it are
  not compared.
  """
  flat = jax.tree_util.tree_flatten_with_path(target, is_leaf=lambda x: x is None)[0]
  wanted, elsewhere = {}, []
  for path, leaf in flat:
    name = jax.tree_util.keystr(path, simple=True, separator='/')
    if leaf is None:
      elsewhere.append(name)
    else:
      wanted[name] = _spec(leaf)
  held = {path: (entry.get('shape'), entry.get('dtype')) for path, entry in saved.items()
          if not any(path == part or path.startswith(f'{part}/') for part in elsewhere)}
  new = [path for path in wanted if path not in held]
  gone = [path for path in held if path not in wanted]
  changed = [path for path in wanted if path in held and _differs(held[path], wanted[path])]
  if not new and not gone and not changed:
    return None
  named_params = any(p.startswith('params/') for p in new + gone + changed)
  if named_params:  # the optimizer state of the parameters differs alike: not named
    new, gone, changed = (_params(paths) for paths in (new, gone, changed))
  groups, budget = [], LISTED
  for label, paths, show in (('not in the checkpoint', new, lambda p: str(wanted[p][0])),
                             ('only in the checkpoint', gone, lambda p: str(held[p][0])),
                             ('changed', changed, lambda p: _change(held[p], wanted[p]))):
    if paths:
      groups.append(_group(label, paths, show, budget))
      budget = max(0, budget - len(paths))
  what = ('other parameters than this model (was the model changed since it was saved?)'
          if named_params else
          "another state than this run's (was the optimizer changed since it was saved?)")
  return f'holds {what}: {"; ".join(groups)}'


def _params(paths: list[str]) -> list[str]:
  return [path for path in paths if path.startswith('params/')]


def _group(label: str, paths: list[str], show, budget: int) -> str:
  """``2 changed ('params/w' [8, 16] saved, [8, 32] now; and 1 more)``: at most ``budget``
  paths named, each with what ``show`` says of it."""
  named = [f"'{path}' {show(path)}" for path in paths[:budget]]
  if not named:
    return f'{len(paths)} {label}'
  if len(paths) > len(named):
    named.append(f'and {len(paths) - len(named)} more')
  return f'{len(paths)} {label} ({"; ".join(named)})'


def _spec(leaf: Any) -> tuple[list[int] | None, str | None]:
  """A target leaf's shape and dtype as a record lists them (None where it has none)."""
  shape = getattr(leaf, 'shape', None)
  dtype = getattr(leaf, 'dtype', None)
  return (None if shape is None else list(shape),
          None if dtype is None else str(jax.dtypes.canonicalize_dtype(dtype)))


def _differs(held: tuple, wanted: tuple) -> bool:
  """Whether a saved shape or dtype differs from the target's (where the target has one)."""
  return any(w is not None and h != w for h, w in zip(held, wanted, strict=True))


def _change(held: tuple, wanted: tuple) -> str:
  """``[8, 16] saved, [8, 32] now``; with the dtypes where they differ."""
  if wanted[1] is not None and held[1] != wanted[1]:
    return f'{held[1]}{held[0]} saved, {wanted[1]}{wanted[0]} now'
  return f'{held[0]} saved, {wanted[0]} now'
