"""Gradient accumulation: one step's gradient computed in micro-batches, summed before the update.

Every step program computes ``Σ_rows loss / denominator`` and its gradient over the rows it
holds (the whole batch, a worker's share, a token); `summed_value_and_grad` does it in passes of
at most ``micro_rows`` rows, under `jax.lax.scan`, so activations are held for one micro-batch
at a time. The sum is the same sum, in another order: one batch of k·m rows and k micro-batches
of m rows give the same loss and gradient up to float rounding.

  >>> import jax.numpy as jnp
  >>> per_row = lambda p, b: (b['x'] * p) ** 2
  >>> batch = {'x': jnp.arange(6.0)}
  >>> whole = summed_value_and_grad(per_row, 1.0, batch, 6)
  >>> parts = summed_value_and_grad(per_row, 1.0, batch, 6, micro_rows=4)   # 2 passes, 2 padded
  >>> bool(jnp.allclose(whole[1], parts[1]))
  True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hetjax._errors import ConfigError
from hetjax.train._trainable import merge_trainable, split_trainable

PyTree = Any


def micro_batches(rows: int, micro_rows: int | None) -> int:
  """Passes of at most ``micro_rows`` rows that ``rows`` take (1 for None or 0)."""
  return 1 if not micro_rows or micro_rows >= rows else math.ceil(rows / micro_rows)


def micro_rows_of(rows: int, accumulate: int, degree: int = 1) -> int | None:
  """Rows of each of ``accumulate`` micro-batches of ``rows``, rounded up to a multiple of the
  data-parallel ``degree`` (each micro-batch is split over the same devices); None for one.

  Raises:
    ConfigError: ``accumulate`` below 1.
  """
  if accumulate < 1:
    raise ConfigError(f'accumulate must be an integer >= 1, got {accumulate!r}')
  if accumulate == 1:
    return None
  rows = math.ceil(rows / accumulate)
  return max(degree, math.ceil(rows / degree) * degree)


def summed_value_and_grad(
    per_example: Callable[[PyTree, dict[str, jax.Array]], jax.Array],
    params: PyTree,
    batch: dict[str, jax.Array],
    denominator: float,
    micro_rows: int | None = None,
) -> tuple[jax.Array, PyTree]:
  """``(Σ loss / denominator, its gradient)`` over ``batch``'s rows, in micro-batches.

  ``per_example(params, batch) -> float32[B]``. With ``micro_rows`` below the batch's rows the
  rows are cut into ``ceil(B / micro_rows)`` micro-batches of ``micro_rows`` rows (the last
  padded with rows of weight 0); micro-batch j holds rows j, j + k, j + 2k, …, so a batch
  split evenly over devices gives every micro-batch an even share of each device's rows.
  Gradients are summed in the parameters' dtype, and are those of ``params``'s float leaves
  only (``split_trainable(params)[0]``'s structure): its other leaves (a dropout stream's key
  and count) are passed to ``per_example`` unchanged.
  """
  rows = _rows(batch)
  k = micro_batches(rows, micro_rows)
  trainable, fixed = split_trainable(params)

  def summed(t, b, weight=None):
    losses = per_example(merge_trainable(t, fixed), b)
    return jnp.sum(losses if weight is None else losses * weight) / denominator

  if k == 1:
    return jax.value_and_grad(summed)(trainable, batch)
  m = micro_rows
  pad = k * m - rows

  def cut(a):  # [k·m, ...] -> [k, m, ...]: micro-batch j takes rows j, j + k, …
    return jnp.swapaxes(a.reshape((m, k, *a.shape[1:])), 0, 1)

  def padded(a):  # repeats of the first row fill the last micro-batch (weighing 0)
    return jnp.concatenate([a, jnp.broadcast_to(a[:1], (pad, *a.shape[1:]))]) if pad else a

  parts = jax.tree.map(lambda a: cut(padded(a)), batch)
  weights = cut(jnp.concatenate([jnp.ones((rows,), jnp.float32),
                                 jnp.zeros((pad,), jnp.float32)]))

  def body(carry, xs):
    value, grads = carry
    b, w = xs
    v, g = jax.value_and_grad(summed)(trainable, b, w)
    return (value + v, jax.tree.map(jnp.add, grads, g)), None

  zeros = jax.tree.map(jnp.zeros_like, trainable)
  (value, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), (parts, weights))
  return value, grads


def _rows(batch: dict[str, jax.Array]) -> int:
  sizes = {a.shape[0] for a in jax.tree.leaves(batch)}
  if len(sizes) != 1:
    raise ValueError(f'batch arrays disagree on the batch size: {sorted(sizes)}')
  return sizes.pop()
