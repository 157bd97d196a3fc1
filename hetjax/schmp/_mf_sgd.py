"""Sequential SGD over one slot of ratings: the update every MF round runs on each device.

The update is SGD, not CCD++, because it is the one STRADS's rotation exists for: an SGD step
on rating (u, i) reads and writes wᵤ and hᵢ at once, so two devices may run at the same time
only if they share no user and no item — which is exactly what the P × P blocks and the
rotation guarantee. Run in sequence inside a device, the updates of a round are a single
device's SGD over the same ratings in the same order, operation for operation: the blocks of one
round touch disjoint rows of W and H, so the order between devices does not matter (the tests
find the factors bit-identical to this loop run on one device over the whole epoch).
(A vectorised pass over a block — all ratings from the same W and H — would be a different
algorithm, the very staleness the schedule removes.) It is deterministic: the order is the
layout's, fixed by the app's seed.

Each rating k = (u, i, r) carries its rows' share of the regulariser (1/nᵤ and 1/mᵢ: nᵤ, mᵢ
the ratings of user u and item i), so the sum over the ratings of

  fₖ = ½ (r − wᵤ·hᵢ)² + λ/2 (‖wᵤ‖² / nᵤ + ‖hᵢ‖² / mᵢ)

is the objective ½ Σ (r − wᵤ·hᵢ)² + λ/2 (‖W‖² + ‖H‖²) over the rows that have ratings, and a
step is ``w ← w − lr ∇_w fₖ``::

  e  = r − wᵤ·hᵢ
  wᵤ ← wᵤ + lr (e hᵢ − λ wᵤ / nᵤ)
  hᵢ ← hᵢ + lr (e wᵤ − λ hᵢ / mᵢ)        # with the old wᵤ

The loop keeps W and H in one table and each step reads both rows with one gather and writes
both with one scatter. Kept apart, each row's update reads the other's old row, and XLA (CPU)
then copied both whole blocks every step to keep the old values: a step cost time in proportion
to the rows, many times what it costs now, and more so the more rows; the arithmetic is the
same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def sgd_pass(w: jax.Array, h: jax.Array, ratings: dict[str, jax.Array], count: jax.Array,
             lr: float, lam: float) -> tuple[jax.Array, jax.Array]:
  """``(w, h)`` after SGD steps on the first ``count`` of ``ratings``, in order.

  A loop of ``count`` steps (a traced value: each device runs as many as its slot has real
  ratings, so padding costs nothing and a device's time follows its share of the work).

  Args:
    w: float32[rows, rank], the device's W block.
    h: float32[cols, rank], the H rows the ratings' ``item`` indices point into.
    ratings: ``user``, ``item``, ``value``, ``user_reg``, ``item_reg`` (`MFLayout.data`), of
      one slot.
    count: how many leading ratings to step on.
    lr, lam: the step size and λ.
  """
  rows = w.shape[0]

  def step(k, table):
    both = jnp.stack([ratings['user'][k], rows + ratings['item'][k]])  # wᵤ's row, hᵢ's row
    wu, hi = table[both]
    e = ratings['value'][k] - jnp.dot(wu, hi)
    new = jnp.stack([wu + lr * (e * hi - lam * ratings['user_reg'][k] * wu),
                     hi + lr * (e * wu - lam * ratings['item_reg'][k] * hi)])
    return table.at[both].set(new, unique_indices=True)

  table = lax.fori_loop(0, count, step, jnp.concatenate([w, h]))
  return table[:rows], table[rows:]
