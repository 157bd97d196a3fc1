"""Policy states to JSON and back, for checkpoints.

A policy state is a pytree whose structure is fixed by the policy (`Policy.init` gives it);
its leaves are arrays or Python scalars of any shape and value. Encoding keeps each leaf's
kind, dtype, shape and exact values (floats through ``repr``-exact JSON numbers, NaN and inf
spelled out); decoding puts them back into ``init()``'s structure.

Example::

  >>> template = {'speeds': np.zeros(0), 'seen': 0}
  >>> data = encode_state({'speeds': np.array([1.5, np.nan]), 'seen': 3})
  >>> decode_state(template, json.loads(json.dumps(data)))
  {'seen': 3, 'speeds': array([1.5, nan])}
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from hetjax._errors import ConfigError


def _number(x: float) -> float | str:
  return x if math.isfinite(x) else repr(x)  # 'nan', 'inf', '-inf'


def _leaf(leaf: Any) -> dict[str, Any]:
  if isinstance(leaf, bool):
    return {'kind': 'bool', 'value': leaf}
  if isinstance(leaf, int):
    return {'kind': 'int', 'value': leaf}
  if isinstance(leaf, float):
    return {'kind': 'float', 'value': _number(leaf)}
  a = np.asarray(leaf)
  values = a.ravel().tolist()
  if a.dtype.kind == 'f':
    values = [_number(v) for v in values]
  return {'kind': 'array', 'dtype': a.dtype.str, 'shape': list(a.shape), 'value': values}


def _unleaf(data: dict[str, Any]) -> Any:
  kind, value = data['kind'], data['value']
  if kind == 'bool':
    return bool(value)
  if kind == 'int':
    return int(value)
  if kind == 'float':
    return float(value)
  dtype = np.dtype(data['dtype'])
  flat = [float(v) if isinstance(v, str) else v for v in value]
  return np.asarray(flat, dtype=dtype).reshape(data['shape'])


def encode_state(state: Any) -> dict[str, Any]:
  """A JSON-able record of ``state``'s leaves (in `jax.tree` order) and their count."""
  leaves = jax.tree.leaves(state)
  return {'leaves': [_leaf(x) for x in leaves]}


def decode_state(template: Any, data: dict[str, Any]) -> Any:
  """``data`` (from `encode_state`) put back into the structure of ``template``.

  Raises:
    ConfigError: if the record does not have the template's number of leaves (a state saved by
      another policy).
  """
  treedef = jax.tree.structure(template)
  leaves = data.get('leaves') if isinstance(data, dict) else None
  if not isinstance(leaves, list) or len(leaves) != treedef.num_leaves:
    got = len(leaves) if isinstance(leaves, list) else 'no'
    raise ConfigError(f'saved policy state has {got} leaves; this policy keeps '
                      f'{treedef.num_leaves} (was the run saved with another policy?)')
  return jax.tree.unflatten(treedef, [_unleaf(x) for x in leaves])
