"""What a server does with gradients: the optimizer on its shard, damped for staleness.

One jitted program per server applies ``optimizer`` to the server's leaves, with the update
scaled by ``scale`` (1 / max(1, τ) under the staleness-aware rule, else 1) and, with DC-ASGD's
``dc_lambda``, the gradient first compensated for its delay:
g̃ = g + λ · g ⊙ g ⊙ (w_now − w_then), w_then being the parameters the gradient was computed at.
Scaling the *update* (not the gradient) makes η / τ exact for every optax optimizer, adaptive
ones included. Updates are elementwise per leaf for the shipped optimizers (sgd, momentum, adam,
adamw), so sharding the leaves over servers changes nothing; an optimizer that looks across
leaves (global-norm clipping) would see only a server's own leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

Leaves = list[jax.Array]


class ShardUpdate:
  """``(params, opt_state, grads, scale, then) -> (params, opt_state)`` for one server's leaves.

  Args:
    optimizer: the optax transformation, the same as a single-device run's.
    dc_lambda: DC-ASGD's λ, or None (off: ``then`` is ignored).
  """

  def __init__(self, optimizer: optax.GradientTransformation, dc_lambda: float | None = None):
    self.optimizer, self.dc_lambda = optimizer, dc_lambda
    # Nothing is donated: the leaves may be on offer to a pull, or kept for DC-ASGD.
    self._apply = jax.jit(self._update)
    self._mean = jax.jit(_weighted_mean)

  def init(self, params: Leaves) -> Any:
    return jax.jit(self.optimizer.init)(params)

  def __call__(self, params: Leaves, opt_state: Any, grads: Leaves, scale: float = 1.0,
               then: Leaves | None = None) -> tuple[Leaves, Any]:
    then = params if then is None or self.dc_lambda is None else then
    return self._apply(params, opt_state, grads, jnp.float32(scale), then)

  def mean(self, grads: Sequence[Leaves], rows: Sequence[int]) -> Leaves:
    """The rows-weighted mean of workers' mean gradients: the gradient of their union."""
    return self._mean(list(grads), jnp.asarray(rows, jnp.float32))

  def _update(self, params, opt_state, grads, scale, then):
    if self.dc_lambda is not None:
      grads = [g + self.dc_lambda * g * g * (w - w0) for g, w, w0 in zip(grads, params, then,
                                                                        strict=True)]
    updates, opt_state = self.optimizer.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates)
    return optax.apply_updates(params, updates), opt_state


def _weighted_mean(grads, rows):
  total = jnp.sum(rows)
  return [sum(r * g[i] for r, g in zip(rows, grads, strict=True)) / total
          for i in range(len(grads[0]))]
