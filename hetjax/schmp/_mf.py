"""SchMP matrix factorisation: SGD on P × P rating blocks in a static rotation, and its baseline.

Ratings R ≈ W Hᵀ are fitted over the observed cells by SGD (`hetjax.schmp._mf_sgd`: the
update and the regularised loss ½ Σ (r − wᵤ·hᵢ)² + λ/2 (‖W‖² + ‖H‖²) it descends). The run
logs the training RMSE, √(Σ (r − wᵤ·hᵢ)² / n), or with ``metric='loss'`` that regularised loss
(what CD-MF, `hetjax.schmp._cdmf`, reports, so the two compare on one objective): lower is
better.

``scheduler='schmp'`` (STRADS's static schedule): users are cut into P row blocks, one per
device, and items into P column blocks of about equal ratings (`MFLayout`). W block p lives on device p and never
moves; H block j starts on device j. In the round of offset s (the `StaticRotation`'s t mod P)
device p runs SGD over the ratings of block (p, (p + s) mod P) — its own users, and the one H
block it holds, which no other device touches in that round — then every device passes its H
block to the device before it on the ring (`lax.ppermute`, device q → q − 1), so that device p
holds block (p + s + 1) mod P for the next round. P rounds are one epoch over every rating;
each (row block, column block) pair is visited once; H blocks are home again. With the same
epoch order, this is exactly one device's sequential SGD (`_mf_sgd`). The parameters record the
rotation's position (``turn``: device p holds H block (p + turn) mod P), which the objective
needs to find the H rows, and a round whose offset is not ``turn`` (a schedule out of step
with the rotation) updates nothing and reports NaN.

``scheduler='unscheduled'``: parallel SGD with bulk-synchronous averaging. Each device runs SGD
over a 1/P chunk of its own ratings (every column mixed), on its W rows and a full copy of H
taken at the round's start; then H is averaged over the devices (`lax.psum` / P). P rounds are
an epoch here too. Devices that update one item in the same round overwrite each other's
progress in part: what the schedule avoids.

Measured on 4 devices at the same step size: on the default data (lr 0.1) the rotation reaches
a training RMSE of 0.2 in 15 rounds, the baseline in 30, and is ahead in every round (averaging
divides an item's steps by up to P). Being serial SGD, the rotation levels off where a step is
near SGD's limit, while averaging damps it: lr 0.2 on the default data, 0.110 after 20 epochs
against the baseline's 0.095; lr 0.1 on 10⁵ × 10⁴ with 10⁶ ratings, 0.150 against 0.099 (at
lr 0.05 there the rotation leads, 0.103 against 0.122; lr 0.2 diverges for both). A decaying
step size would let the rotation go on; it is not implemented.

Unequal workers: ``row_shares`` gives each device its users (e.g. from a `hetjax.balance`
share policy, ``ShareRules(users, P).from_weights(speeds).values``), so a faster device gets
more users and so more ratings in every round; shapes stay equal (W blocks padded to the
largest share, slots to the largest block, pads masked) and each device's loop runs its real
ratings only. The updates are the same SGD steps on a different blocking.

Example::

  app = make_app('mf', devices=4, rank=8, lam=0.05, users=1000, items=500, ratings=20_000)
  program = SchmpProgram(app, app.default_schedule_size(4), jax.devices()[:4], staleness=0)
  for info in training_steps(program, program.init_state(), 40, policy=app.policy(4, 0)):
    print(info.step, float(info.stats.loss))           # 10 epochs; RMSE falling
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from hetjax._errors import ConfigError, parse_choice
from hetjax.data import Ratings, is_data_path, read_ratings, zipf_ratings
from hetjax.schmp._mf_layout import MFLayout, mf_layout, split_users
from hetjax.schmp._mf_sgd import sgd_pass
from hetjax.schmp._static import StaticRotation

_ORDER_SALT, _W_SALT, _H_SALT = 0x0D3E, 0, 1


class MFMetric(enum.Enum):
  """What an MF app's objective reports (module docstring)."""

  RMSE = 'rmse'  # the training RMSE
  LOSS = 'loss'  # the regularised loss ½ Σ (r − wᵤ·hᵢ)² + λ/2 (‖W‖² + ‖H‖²), rated rows only


class MFScheduler(enum.Enum):
  """How an MF app's rounds pick their ratings (module docstring)."""

  SCHMP = 'schmp'              # the static rotation of P × P blocks
  UNSCHEDULED = 'unscheduled'  # BSP: every device, every column, H averaged after the round


@dataclasses.dataclass(frozen=True, eq=False)
class MatrixFactorisation:
  """An `App`: SGD matrix factorisation run by ``scheduler`` (module docstring).

  Attributes:
    ratings: the observed ratings.
    rank: the factors' rank.
    lam: λ, the L2 weight.
    lr: SGD's step size.
    init_scale: the factors start N(0, init_scale²), drawn from ``seed``.
    seed: the factors' start and the epoch order (a permutation of the ratings).
    devices: P, the devices it runs on (one row block and one column block each).
    row_shares: users per device, or None for equal blocks.
    mode: the `MFScheduler`.
    config: the arguments it was made with (JSON).
    metric: the `MFMetric` its objective reports.
  """

  ratings: Ratings
  rank: int
  lam: float
  lr: float
  init_scale: float
  seed: int
  devices: int
  row_shares: tuple[int, ...] | None
  mode: MFScheduler
  config: dict
  metric: MFMetric = MFMetric.RMSE
  name: str = 'mf'

  @property
  def scheduler(self) -> str:
    return self.mode.value

  @property
  def blocks(self) -> int:
    """P: the column blocks, one per device (the baseline's H is averaged, not blocked, but
    it reads its ratings in P chunks by the same offsets)."""
    return self.devices

  @property
  def rotation(self) -> bool:
    return self.mode is MFScheduler.SCHMP

  # -- the data and where it sits ---------------------------------------------------------------

  def order(self) -> np.ndarray:
    """The epoch order: each slot's ratings come in this order (a seeded permutation)."""
    return np.random.default_rng([self.seed, _ORDER_SALT]).permutation(self.ratings.count)

  @functools.cached_property
  def layout(self) -> MFLayout:
    """Where the users, items and ratings sit on the ``devices`` devices."""
    return mf_layout(self.ratings, self.devices, self.row_shares, self.order(), self.rotation)

  def host_data(self, shards: int) -> dict[str, np.ndarray]:
    self._check_devices(shards)
    return self.layout.data

  def round_ratings(self) -> np.ndarray:
    """int64[P, P]: the ratings device p updates in the round of offset s, at [s, p]."""
    counts, n = self.layout.counts, self.devices
    s, p = np.meshgrid(np.arange(n), np.arange(n), indexing='ij')
    return counts[p, (p + s) % n] if self.rotation else counts[p, s]

  def round_work(self, offset: int) -> np.ndarray:
    """int64[P]: the ratings each device updates in a round of ``offset`` (what a host of known
    speed is timed by)."""
    return self.round_ratings()[offset % self.devices]

  def _check_devices(self, devices: int) -> None:
    if devices != self.devices:
      raise ConfigError(f'app mf was made for {self.devices} devices (one row and column '
                        f'block each), the job has {devices}; pass devices={devices}')

  # -- the schedule -----------------------------------------------------------------------------

  def policy(self, schedule_size: int, seed: int) -> StaticRotation:
    """The rotation: round t has offset t mod P (``schedule_size`` = P slots, every one
    picked). The baseline reads its chunk t mod P from the same offsets."""
    del seed  # the schedule is fixed
    if schedule_size != self.devices:
      raise ConfigError(f'app mf rounds have {self.devices} slots, one per device\'s block; got '
                        f'a schedule size of {schedule_size}')
    return StaticRotation(self.devices)

  def default_schedule_size(self, devices: int) -> int:
    self._check_devices(devices)
    return self.devices

  def reference_objective(self) -> float | None:
    return None  # the least-squares optimum of a non-convex problem is not computed here

  # -- parameters -------------------------------------------------------------------------------

  def initial_factors(self) -> tuple[jax.Array, jax.Array]:
    """``(W, H)``, float32[users, rank] and [items, rank], as every run starts (any P)."""
    key = jax.random.key(self.seed)
    shape = (self.ratings.users, self.rank), (self.ratings.items, self.rank)
    return (self.init_scale * jax.random.normal(jax.random.fold_in(key, _W_SALT), shape[0]),
            self.init_scale * jax.random.normal(jax.random.fold_in(key, _H_SALT), shape[1]))

  def param_specs(self, axis: str) -> dict[str, PartitionSpec]:
    if self.rotation:
      return {'w': PartitionSpec(axis), 'h': PartitionSpec(axis), 'turn': PartitionSpec()}
    return {'w': PartitionSpec(axis), 'h': PartitionSpec()}

  def init_params(self, data: dict[str, jax.Array], axis: str) -> dict[str, jax.Array]:
    del data
    layout, p = self.layout, lax.axis_index(axis)
    w, h = self.initial_factors()
    w = _block(w, layout.row_starts, layout.row_counts, p)
    if not self.rotation:
      return {'w': w, 'h': h}
    return {'w': w, 'h': _block(h, layout.col_starts, layout.col_counts, p),
            'turn': jnp.zeros((), jnp.int32)}

  def factors(self, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(W, H)`` as host arrays in user and item order (unpadded, H blocks unrotated)."""
    layout, rank, devices = self.layout, self.rank, self.devices
    w = np.asarray(params['w']).reshape(devices, layout.row_pad, rank)
    w = np.concatenate([w[p, :c] for p, c in enumerate(layout.row_counts)])
    if not self.rotation:
      return w, np.asarray(params['h'])
    h = np.asarray(params['h']).reshape(devices, layout.col_pad, rank)
    turn = int(params['turn'])
    return w, np.concatenate([h[(j - turn) % devices, :c] for j, c in
                              enumerate(layout.col_counts)])

  def loss(self, w: np.ndarray, h: np.ndarray) -> float:
    """The regularised loss of global ``(W, H)``: ½ Σ (r − wᵤ·hᵢ)² + λ/2 (‖W‖² + ‖H‖²) over
    the users and items that have ratings (`_mf_sgd`), in float64."""
    r = self.ratings
    w, h = np.asarray(w, np.float64), np.asarray(h, np.float64)
    error = r.value - np.einsum('nk,nk->n', w[r.user], h[r.item])
    rated_w, rated_h = w[np.unique(r.user)], h[np.unique(r.item)]
    return float(0.5 * (error ** 2).sum()
                 + 0.5 * self.lam * ((rated_w ** 2).sum() + (rated_h ** 2).sum()))

  # -- a round ----------------------------------------------------------------------------------

  def round(self, params, shard, blocks, mask, offset, key, axis):
    del key  # deterministic: the order is the layout's
    if blocks.shape[0] != self.devices:
      raise ConfigError(f'app mf rounds have {self.devices} slots, one per device\'s block; got '
                        f'a schedule size of {blocks.shape[0]}')
    layout = self.layout
    if self.rotation:
      return self._rotation_round(params, shard, blocks, mask, offset, axis, layout)
    return self._averaging_round(params, shard, blocks, mask, offset, axis, layout)

  def _rotation_round(self, params, shard, blocks, mask, offset, axis, layout):
    devices, p, turn = layout.devices, lax.axis_index(axis), params['turn']
    in_step = offset % devices == turn
    column = (p + offset) % devices
    picked = in_step & jnp.any((blocks == column) & mask)
    ratings = _slot(shard, column, layout)
    count = jnp.where(picked, _counts(layout)[p, column], 0)
    w, h = sgd_pass(params['w'], params['h'], ratings, count, self.lr, self.lam)
    change = jnp.sqrt(jnp.sum((h - params['h']) ** 2))
    by_block = lax.psum(jnp.zeros(devices).at[column].set(change), axis)
    delta = jnp.where(in_step, jnp.where(mask, by_block[blocks], 0.0), jnp.nan)
    ring = [(q, (q - 1) % devices) for q in range(devices)]  # q's block goes to q − 1
    h = jnp.where(in_step, lax.ppermute(h, axis, ring), params['h'])
    turn = jnp.where(in_step, (turn + 1) % devices, turn)
    return {'w': w, 'h': h, 'turn': turn}, delta

  def _averaging_round(self, params, shard, blocks, mask, offset, axis, layout):
    slot = offset % layout.devices
    ratings = _slot(shard, slot, layout)
    count = _counts(layout)[lax.axis_index(axis), slot]
    h = lax.pcast(params['h'], (axis,), to='varying')  # this device's copy, updated alone
    w, h = sgd_pass(params['w'], h, ratings, count, self.lr, self.lam)
    h = lax.psum(h, axis) / layout.devices
    column = np.repeat(np.arange(layout.devices), layout.col_counts)
    by_block = jnp.sqrt(jax.ops.segment_sum(jnp.sum((h - params['h']) ** 2, -1), column,
                                            layout.devices))
    return {'w': w, 'h': h}, jnp.where(mask, by_block[blocks], 0.0)

  def objective(self, params, shard, axis):
    """The training RMSE over every rating, or the regularised loss (`metric`; replicated):
    each rating carries its rows' share of the regulariser (``user_reg``, ``item_reg``: 1 / the
    ratings of its user and item), so summed over the ratings it counts each rated row once."""
    layout, item = self.layout, shard['item']
    if self.rotation:  # column block c of a rating is on device (c − turn) mod P
      h = lax.all_gather(params['h'], axis, tiled=True)
      column = jnp.arange(item.size) // layout.slot
      item = (column - params['turn']) % layout.devices * layout.col_pad + item
    else:
      h = params['h']
    w, h = params['w'][shard['user']], h[item]
    error = shard['value'] - jnp.sum(w * h, -1)
    if self.metric is MFMetric.LOSS:
      rows = shard['user_reg'] * jnp.sum(w * w, -1) + shard['item_reg'] * jnp.sum(h * h, -1)
      return lax.psum(jnp.sum(shard['observed'] * (0.5 * error ** 2 + 0.5 * self.lam * rows)),
                      axis)
    total = lax.psum(jnp.sum(shard['observed'] * error ** 2), axis)
    return jnp.sqrt(total / self.ratings.count)


def make_mf(scheduler: str = 'schmp', *, rank: int = 8, lam: float = 0.05, lr: float = 0.1,
            init_scale: float = 0.1, seed: int = 0, devices: int | None = None,
            row_shares: Sequence[int] | None = None, data: str = 'zipf', users: int = 1000,
            items: int = 500, ratings: int = 20_000, data_rank: int = 4, noise: float = 0.1,
            exponent: float = 1.0, data_seed: int = 0, metric: str = 'rmse'
            ) -> MatrixFactorisation:
  """SGD matrix factorisation on `zipf_ratings` (``users`` … ``data_seed``) or on your own
  ratings, run by ``scheduler`` (``'schmp'`` or ``'unscheduled'``).

  Args:
    rank: the factors' rank (>= 1).
    lam: λ (>= 0).
    lr: SGD's step size (> 0).
    init_scale: the factors' initial standard deviation (> 0).
    seed: the initial factors and the epoch order.
    devices: P, the devices it runs on (default: ``len(row_shares)``, else every device).
    row_shares: users per device (P positive integers summing to ``users``), e.g. a share
      policy's output for the workers' speeds; None: as equal as they divide.
    data: ``'zipf'`` (generated by `zipf_ratings` from ``users`` … ``data_seed``) or the path
      of your own ``.npz`` (arrays ``rows``, ``cols``, ``values``, optionally ``shape``),
      ``.csv`` or ``.npy`` of (row, col, value) triples (`hetjax.data.read_ratings`); with a
      file, ``users`` … ``data_seed`` keep their defaults (the shipped config names them) and
      the file gives the matrix.
    users, items, ratings, data_rank, noise, exponent, data_seed: the data (`zipf_ratings`).
    metric: what the objective reports: ``'rmse'`` (the training RMSE) or ``'loss'`` (the
      regularised loss SGD descends).

  Raises:
    ConfigError: one line: any of these out of range, an unknown scheduler, metric or data,
      generator arguments with a file, a file that does not read as ratings, fewer users or
      items than devices, row shares that do not split the users.
  """
  mode = parse_choice(MFScheduler, scheduler, 'MF scheduler')
  metric_ = parse_choice(MFMetric, metric, 'MF metric')
  generator = {'users': users, 'items': items, 'ratings': ratings, 'data_rank': data_rank,
               'noise': noise, 'exponent': exponent, 'data_seed': data_seed}
  for what, value in (('rank', rank), ('users', users), ('items', items), ('ratings', ratings),
                      ('data_rank', data_rank)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f'MF needs {what} >= 1 (an integer), got {value!r}')
  for what, value, low in (('lam', lam, 'λ >= 0'), ('lr', lr, 'lr > 0'),
                           ('init_scale', init_scale, 'init_scale > 0')):
    if not (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and (value >= 0 if what == 'lam' else value > 0)):
      raise ConfigError(f'MF needs {low}, got {what}={value!r}')
  shares = None
  if row_shares is not None:
    shares = tuple(row_shares) if isinstance(row_shares, Sequence) else (row_shares,)
    if not shares or any(isinstance(s, bool) or not isinstance(s, int | np.integer)
                         for s in shares):
      raise ConfigError(f'MF: row shares {row_shares!r} must be integers, one per device')
    shares = tuple(int(s) for s in shares)
  if devices is None:
    devices = len(shares) if shares is not None else jax.device_count()
  if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
    raise ConfigError(f'MF needs devices >= 1, got {devices!r}')
  ratings_ = _ratings(data, generator, devices, shares)
  source = {'data': os.fspath(data)} if is_data_path(data) else {'data': data, **generator}
  config = dict(rank=rank, lam=lam, lr=lr, init_scale=init_scale, seed=seed, devices=devices,
                row_shares=None if shares is None else list(shares), **source)
  if metric_ is not MFMetric.RMSE:  # recorded when not the default: older checkpoints match
    config['metric'] = metric_.value
  return MatrixFactorisation(ratings_, rank, float(lam), float(lr), float(init_scale), seed,
                             devices, shares, mode, config, metric_)


def _ratings(data: str, generator: dict[str, Any], devices: int,
             shares: tuple[int, ...] | None) -> Ratings:
  """The ratings ``data`` names, generated from ``generator`` (`zipf_ratings`'s arguments) or
  read from a file (then ``generator`` must be `make_mf`'s defaults), once their users and
  items are known to split over ``devices`` (checked before generating)."""
  if is_data_path(data):
    defaults = inspect.signature(make_mf).parameters
    given = [k for k, v in generator.items() if v != defaults[k].default]
    if given:
      raise ConfigError(f'MF: data {os.fspath(data)!r} is a file: {", ".join(given)} apply to '
                        "data='zipf' only")
    ratings = read_ratings(data)
    users, items = ratings.users, ratings.items
  elif data == 'zipf':
    ratings, users, items = None, generator['users'], generator['items']
  else:
    raise ConfigError(f"MF: unknown data {data!r}; choose zipf, or a .npz, .csv or .npy file")
  split_users(users, devices, shares)  # one line if the users do not split
  if items < devices:
    raise ConfigError(f'MF: {items} items cannot be split into column blocks over {devices} '
                      'devices')
  if ratings is None:
    g = generator
    ratings = zipf_ratings(users, items, g['ratings'], g['data_rank'], g['noise'],
                           g['exponent'], g['data_seed'])
  return ratings


def _block(full: jax.Array, starts: np.ndarray, counts: np.ndarray, p: jax.Array) -> jax.Array:
  """Device ``p``'s rows of ``full`` (``counts[p]`` from ``starts[p]``), padded with zeros to
  the largest count."""
  pad = int(counts.max())
  padded = jnp.concatenate([full, jnp.zeros((pad, full.shape[1]), full.dtype)])
  rows = lax.dynamic_slice_in_dim(padded, jnp.asarray(starts)[p], pad)
  return jnp.where((jnp.arange(pad) < jnp.asarray(counts)[p])[:, None], rows, 0.0)


def _counts(layout: MFLayout) -> jax.Array:
  """int32[P, P]: the real ratings of device p's slot s (the loop's length, exact)."""
  return jnp.asarray(layout.counts, jnp.int32)


def _slot(shard: dict[str, jax.Array], slot: jax.Array, layout: MFLayout) -> dict[str, jax.Array]:
  """The ratings of one of this device's slots."""
  return {k: v.reshape(layout.devices, layout.slot)[slot] for k, v in shard.items()}
