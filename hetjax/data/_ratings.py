"""Seeded synthetic ratings: a low-rank matrix plus noise, observed at Zipf-distributed cells.

Matrix factorisation needs a rating matrix whose rows (users) and columns (items) are as skewed
as real ones — a few users rate a lot, a few items are rated by nearly everyone — because that
skew is what makes blocks of the matrix unequal in work. No such data set ships offline, so
this one is drawn, deterministically from a seed.

The issue's size is 10⁵ users × 10⁴ items. With 10⁶ ratings the three arrays take 12 MB
(int32 user, int32 item, float32 value: 12 bytes a rating) and drawing them needs about 100 MB
above the process's start; 7 % of the users have no rating, the median user 3, the hottest
user 9,321 and the hottest item 36,776. With 10⁷ (1 % of the cells, Netflix's density):
120 MB, over ten times as long to draw, a peak of 0.84 GB resident (the int64 cell keys, their
sort and the draws, 2.4 draws a kept cell); every user has at least 7 ratings (median 41) and
the hottest user and item are saturated (10⁴ items, 98 % of the users). The defaults are
small, so tests draw in a moment::

  full = zipf_ratings(users=100_000, items=10_000, ratings=1_000_000, rank=8)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hetjax._errors import ConfigError

_TRIES = 64  # rounds of drawing the missing cells before giving up (see `zipf_ratings`)
_CHUNK = 1 << 20  # ratings whose true value is computed at once (bounds the gather's memory)


@dataclasses.dataclass(frozen=True, eq=False)
class Ratings:
  """Observed cells of a users × items rating matrix, one rating per distinct cell.

  Attributes:
    users: rows of the matrix (user ids are 0 … users − 1).
    items: columns (item ids 0 … items − 1).
    user: int32[n], the user of each rating.
    item: int32[n], the item of each rating.
    value: float32[n], the rating.
  """

  users: int
  items: int
  user: np.ndarray
  item: np.ndarray
  value: np.ndarray

  @property
  def count(self) -> int:
    """How many ratings (observed cells) there are."""
    return int(self.value.size)

  def split(self, held_out: float, seed: int = 0) -> tuple[Ratings, Ratings]:
    """``(train, test)``: a seeded ``held_out`` fraction of the ratings set aside.

    Example::

      >>> train, test = zipf_ratings().split(0.1)
      >>> test.count, train.count
      (2000, 18000)
    """
    if not 0.0 < held_out < 1.0:
      raise ConfigError(f'held-out fraction must be in (0, 1), got {held_out}')
    order = np.random.default_rng([seed, 0x7E57]).permutation(self.count)
    cut = round(self.count * held_out)
    test, train = np.sort(order[:cut]), np.sort(order[cut:])
    return self._take(train), self._take(test)

  def _take(self, index: np.ndarray) -> Ratings:
    return Ratings(self.users, self.items, self.user[index], self.item[index], self.value[index])


def zipf_ratings(users: int = 1000, items: int = 500, ratings: int = 20_000, rank: int = 4,
                 noise: float = 0.1, exponent: float = 1.0, seed: int = 0) -> Ratings:
  """``ratings`` distinct cells of ``U Vᵀ + noise``, users and items drawn by Zipf's law.

  The truth: U ∈ R^{users×rank} and V ∈ R^{items×rank} with entries N(0, rank^-½), so a true
  rating u·v has variance 1; each observed value adds N(0, noise²) noise, so a model that
  recovers U Vᵀ has RMSE ≈ ``noise`` on fresh cells (a training RMSE can go below it).

  The cells: a user of Zipf rank k (k = 1 … users) is drawn with probability ∝ k^-exponent,
  independently an item likewise, each through a seeded permutation of the ids so that the hot
  ones are scattered over the id range (a block of consecutive ids gets its fair share of
  them). A cell drawn twice counts once: the missing cells are drawn again, up to 64 rounds,
  from the same laws. So a hot user keeps fewer of its draws than a cold one (it meets the hot
  items again), the hottest saturate at ``items``, and the counts fall off more gently than the
  law: by rank, as k^-0.8 rather than k^-1 at ranks 10–100 of 2000 × 2000 with 20,000 ratings.
  The order of the ratings is the order of their first draw (random).

  Example (the hottest user has rated every item, 5x the mean of 10)::

    >>> r = zipf_ratings(users=100, items=50, ratings=1000, seed=3)
    >>> r.count, r.value.dtype, len(set(zip(r.user, r.item)))
    (1000, dtype('float32'), 1000)
    >>> int(np.bincount(r.user, minlength=100).max())
    50

  Raises:
    ConfigError: sizes below 1, more ratings than cells, noise < 0, exponent <= 0, or cells
      too hot to fill (a very high exponent at a high density).
  """
  for name, v in (('users', users), ('items', items), ('ratings', ratings), ('rank', rank)):
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
      raise ConfigError(f'zipf_ratings needs {name} >= 1 (an integer), got {v!r}')
  if ratings > users * items:
    raise ConfigError(f'zipf_ratings: {ratings} ratings do not fit {users} x {items} cells')
  if not noise >= 0:
    raise ConfigError(f'zipf_ratings needs noise >= 0, got {noise}')
  if not exponent > 0:
    raise ConfigError(f'zipf_ratings needs exponent > 0, got {exponent}')
  rng = np.random.default_rng([seed, 0x4A71])
  user_ids, item_ids = rng.permutation(users), rng.permutation(items)
  user_cdf, item_cdf = _zipf_cdf(users, exponent), _zipf_cdf(items, exponent)
  cells, seen = np.empty(0, np.int64), np.empty(0, np.int64)  # draw order; sorted
  for _ in range(_TRIES):
    missing = ratings - cells.size
    if not missing:
      break
    draw = missing + missing // 4 + 16
    user = user_ids[np.minimum(np.searchsorted(user_cdf, rng.random(draw)), users - 1)]
    item = item_ids[np.minimum(np.searchsorted(item_cdf, rng.random(draw)), items - 1)]
    new = user.astype(np.int64) * items + item
    # The distinct cells (sorted) and where each was first drawn; those not drawn in earlier
    # rounds are looked up in `seen` in sorted order (random lookups into 10⁷ cells were most
    # of the time); the first `missing` of them in draw order are kept.
    distinct, first = np.unique(new, return_index=True)
    if seen.size:
      at = np.minimum(np.searchsorted(seen, distinct), seen.size - 1)
      fresh = seen[at] != distinct
      distinct, first = distinct[fresh], first[fresh]
    if first.size > missing:
      keep = first <= np.partition(first, missing - 1)[missing - 1]
      distinct, first = distinct[keep], first[keep]
    cells = np.concatenate([cells, new[np.sort(first)]])
    seen = np.insert(seen, np.searchsorted(seen, distinct), distinct)
  if cells.size < ratings:
    raise ConfigError(f'zipf_ratings: only {cells.size} of {ratings} distinct cells after '
                      f'{_TRIES} rounds; lower the exponent ({exponent}) or the ratings')
  user, item = (cells // items).astype(np.int32), (cells % items).astype(np.int32)
  scale = rank ** -0.25  # entries of variance rank^-½: a true rating of variance 1
  u_true = (rng.standard_normal((users, rank)) * scale).astype(np.float32)
  v_true = (rng.standard_normal((items, rank)) * scale).astype(np.float32)
  value = np.empty(ratings, np.float32)
  for lo in range(0, ratings, _CHUNK):
    hi = min(lo + _CHUNK, ratings)
    value[lo:hi] = np.einsum('nk,nk->n', u_true[user[lo:hi]], v_true[item[lo:hi]])
  value += (rng.standard_normal(ratings) * noise).astype(np.float32)
  for a in (user, item, value):
    a.flags.writeable = False
  return Ratings(users, items, user, item, value)


def _zipf_cdf(n: int, exponent: float) -> np.ndarray:
  cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -exponent)
  return cdf / cdf[-1]
