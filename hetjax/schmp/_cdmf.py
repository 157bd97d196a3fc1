"""SchMP CD-MF: matrix factorisation by CCD++ (Yu, Hsieh, Si & Dhillon, ICDM 2012), rank-one
coordinate updates of W and H on P × P rating blocks in SGD-MF's static rotation.

The data, the blocks and the rotation are SGD-MF's (`hetjax.schmp._mf`, `MFLayout`): device p
owns user block p of W; H block j starts on device j and moves one device down the ring after
every round, so that in the round of offset s device p holds column block (p + s) mod P and
its slot of ratings (p, (p + s) mod P); P rounds are a sweep over every rating and bring the H
blocks home. The objective is SGD-MF's regularised loss ½ Σ (r − wᵤ·hᵢ)² + λ/2 (‖W‖² + ‖H‖²)
over the rated rows (``metric='loss'``, the default; ``'rmse'`` the training RMSE).

CCD++ fits one rank at a time. For rank t it keeps R̂ = R − Σ_{k≠t} w_k h_kᵀ on the observed
cells (one float per rating, a parameter sharded with the ratings) and alternates closed-form
coordinate minimisations of the loss in column t of W and of H:

  wᵤₜ ← Σᵢ R̂ᵤᵢ hᵢₜ / (λ + Σᵢ hᵢₜ²)   (over user u's ratings; every user at once)
  hᵢₜ ← Σᵤ R̂ᵤᵢ wᵤₜ / (λ + Σᵤ wᵤₜ²)   (over item i's ratings, with the new w)

``inner`` times, then moves to rank t + 1 (ranks cycle). Each update needs every rating of its
row, so each is one sweep: the W sweep adds each device's block's Σ R̂ h and Σ h² into its
users' sums (W never moves), and at the sweep's end every device sets column t of its W block;
the H sweep adds each block's users' Σ R̂ w and Σ w² into sums that travel with the H block
(`lax.ppermute` with H), and at the sweep's end every block is home and sets its column t. The
first W sweep of rank t switches R̂ as it passes each rating: R̂ ← R̂ − wᵤₛhᵢₛ + wᵤₜhᵢₜ with s the
rank before (the starting R̂ excludes the last rank, so the first switch is the same). A rank
takes 2 × ``inner`` sweeps, all ranks 2 × ``inner`` × rank sweeps (an outer iteration). Each
update is an exact minimisation in its column: the loss falls sweep by sweep (to float32).

Where SGD-MF's step reads and writes a user's and an item's row at once, so that two devices
may only run on disjoint blocks, a CCD++ update of W's column depends on H alone and H's on W
alone: a sweep's updates never conflict, and a round is vectorised over its block's ratings
(segment sums), not a loop of one step per rating. There is no unscheduled CD-MF baseline to
speak of (every CCD++ update is already conflict-free); the comparison is SGD-MF on the same
data, blocks and rotation (bench_schmp).

Example::

  app = make_app('cdmf', devices=4, rank=8, lam=0.05, users=1000, items=500, ratings=20_000)
  program = SchmpProgram(app, 4, jax.devices()[:4], staleness=0)
  for info in training_steps(program, program.init_state(), 64, policy=app.policy(4, 0)):
    print(info.step, float(info.stats.loss))          # one outer iteration: 16 sweeps
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from hetjax._errors import ConfigError
from hetjax.schmp._mf import MatrixFactorisation, _block, _slot, make_mf


@dataclasses.dataclass(frozen=True, eq=False)
class CoordinateMF(MatrixFactorisation):
  """An `App`: CCD++ matrix factorisation in the static rotation (module docstring). The
  attributes are `MatrixFactorisation`'s (``lr`` unused, ``mode`` the rotation) and:

  Attributes:
    inner: CCD++'s inner iterations, W then H sweeps, per rank.
  """

  inner: int = 1
  name: str = 'cdmf'

  # -- parameters -------------------------------------------------------------------------------

  def param_specs(self, axis: str) -> dict[str, PartitionSpec]:
    sharded, replicated = PartitionSpec(axis), PartitionSpec()
    return {'w': sharded, 'h': sharded, 'turn': replicated, 'sweep': replicated,
            'residual': sharded, 'w_sums': sharded, 'h_sums': sharded}

  def init_params(self, data, axis):
    """SGD-MF's starting factors, the residual without the last rank (so that the first switch
    is like every other) and empty sums."""
    layout, p = self.layout, lax.axis_index(axis)
    w, h = self.initial_factors()
    w = _block(w, layout.row_starts, layout.row_counts, p)
    h = _block(h, layout.col_starts, layout.col_counts, p)
    every = lax.all_gather(h, axis, tiled=True)          # block c at [c × col_pad, …)
    column = jnp.arange(data['item'].size) // layout.slot
    wu, hi = w[data['user']], every[column * layout.col_pad + data['item']]
    last = self.rank - 1
    residual = data['value'] - jnp.sum(wu * hi, -1) + wu[:, last] * hi[:, last]
    return {'w': w, 'h': h, 'turn': jnp.zeros((), jnp.int32),
            'sweep': jnp.zeros((), jnp.int32), 'residual': data['observed'] * residual,
            'w_sums': jnp.zeros((layout.row_pad, 2)), 'h_sums': jnp.zeros((layout.col_pad, 2))}

  def position(self, sweep: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(rank, h_sweep, switch)`` of sweep ``sweep``: the rank it updates, whether it is an
    H sweep (else W), whether it switches the residual to that rank (the rank's first)."""
    per_rank = 2 * self.inner
    return (sweep // per_rank) % self.rank, sweep % 2 == 1, sweep % per_rank == 0

  # -- a round ----------------------------------------------------------------------------------

  def round(self, params, shard, blocks, mask, offset, key, axis):
    del key  # deterministic
    layout = self.layout
    devices = layout.devices
    if blocks.shape[0] != devices:
      raise ConfigError(f'app cdmf rounds have {devices} slots, one per device\'s block; got a '
                        f'schedule size of {blocks.shape[0]}')
    p, turn, sweep = lax.axis_index(axis), params['turn'], params['sweep']
    in_step = offset % devices == turn
    column = (p + turn) % devices
    picked = in_step & jnp.any((blocks == column) & mask)
    t, h_sweep, switch = self.position(sweep)
    s = (t - 1) % self.rank
    ratings = _slot(shard, column, layout)
    user, item = ratings['user'], ratings['item']
    live = ratings['observed'] * picked                 # 0: padding, or an idle round
    w, h = params['w'], params['h']
    wu, hi = w[user], h[item]
    residual = params['residual'].reshape(devices, layout.slot)
    r = residual[column]
    switched = r - wu[:, s] * hi[:, s] + wu[:, t] * hi[:, t]
    r = jnp.where(switch & ~h_sweep & picked, ratings['observed'] * switched, r)
    residual = residual.at[column].set(r).reshape(-1)
    # This block's share of the sums of the column being updated: Σ R̂ × other, Σ other².
    other = jnp.where(h_sweep, wu[:, t], hi[:, t])
    terms = live[:, None] * jnp.stack([r * other, other * other], -1)
    w_sums = params['w_sums'] + jnp.where(h_sweep, 0.0, jax.ops.segment_sum(
        terms, user, layout.row_pad))
    h_sums = params['h_sums'] + jnp.where(h_sweep, jax.ops.segment_sum(
        terms, item, layout.col_pad), 0.0)
    ends = in_step & (turn == devices - 1)              # the sweep's last round
    # A W sweep's sums are complete at its end; so is each H block's, which has then been on
    # every device (it moves on after this round's update and is home for the next sweep).
    new_w = jnp.where(ends & ~h_sweep, w.at[:, t].set(self._solve(w_sums)), w)
    new_h = jnp.where(ends & h_sweep, h.at[:, t].set(self._solve(h_sums)), h)
    w_sums = jnp.where(ends & ~h_sweep, 0.0, w_sums)
    h_sums = jnp.where(ends & h_sweep, 0.0, h_sums)
    change = jnp.sqrt(jnp.sum((new_w - w) ** 2) + jnp.sum((new_h - h) ** 2))
    ring = [(q, (q - 1) % devices) for q in range(devices)]  # q's block goes to q − 1
    w = new_w
    h = jnp.where(in_step, lax.ppermute(new_h, axis, ring), new_h)
    h_sums = jnp.where(in_step, lax.ppermute(h_sums, axis, ring), h_sums)
    by_block = lax.psum(jnp.zeros(devices).at[column].set(change), axis)
    delta = jnp.where(in_step, jnp.where(mask, by_block[blocks], 0.0), jnp.nan)
    params = {'w': w, 'h': h, 'turn': jnp.where(in_step, (turn + 1) % devices, turn),
              'sweep': jnp.where(ends, sweep + 1, sweep), 'residual': residual,
              'w_sums': w_sums, 'h_sums': h_sums}
    return params, delta

  def _solve(self, sums: jax.Array) -> jax.Array:
    """Σ R̂ × other / (λ + Σ other²) per row; 0 for a row with no ratings and λ = 0."""
    denominator = self.lam + sums[:, 1]
    return jnp.where(denominator > 0, sums[:, 0] / jnp.where(denominator > 0, denominator, 1.0),
                     0.0)


def make_cdmf(scheduler: str = 'schmp', *, rank: int = 8, lam: float = 0.05, inner: int = 1,
              init_scale: float = 0.1, seed: int = 0, devices: int | None = None,
              row_shares: Sequence[int] | None = None, data: str = 'zipf', users: int = 1000,
              items: int = 500, ratings: int = 20_000, data_rank: int = 4, noise: float = 0.1,
              exponent: float = 1.0, data_seed: int = 0, metric: str = 'loss') -> CoordinateMF:
  """CCD++ matrix factorisation on SGD-MF's data and blocks: the arguments are `make_mf`'s
  (its ``lr`` aside), and ``inner`` (>= 1), CCD++'s inner iterations per rank. The objective
  is the regularised loss by default (``metric='loss'``).

  Raises:
    ConfigError: one line: a scheduler other than ``'schmp'`` (module docstring: CD-MF has no
      unscheduled baseline), ``inner`` below 1, or what `make_mf` refuses.
  """
  if scheduler != 'schmp':
    raise ConfigError(f"app 'cdmf': unknown scheduler {scheduler!r}; choose schmp (CD-MF's "
                      'updates never conflict: its comparison is app mf on the same data)')
  if isinstance(inner, bool) or not isinstance(inner, int) or inner < 1:
    raise ConfigError(f'CD-MF needs inner >= 1 (an integer), got {inner!r}')
  base = make_mf('schmp', rank=rank, lam=lam, init_scale=init_scale, seed=seed,
                 devices=devices, row_shares=row_shares, data=data, users=users, items=items,
                 ratings=ratings, data_rank=data_rank, noise=noise, exponent=exponent,
                 data_seed=data_seed, metric=metric)
  fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name != 'name'}
  config = {k: v for k, v in base.config.items() if k not in ('lr', 'metric')}
  fields['config'] = {**config, 'inner': inner, 'metric': base.metric.value}
  return CoordinateMF(**fields, inner=inner)
