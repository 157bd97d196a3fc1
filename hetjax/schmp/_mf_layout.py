"""`MFLayout`: where matrix factorisation's users, items and ratings sit on P devices.

Users are cut into P row blocks of consecutive ids, one per device (its share of the users,
equal by default, or as given: a faster device gets more users). Items are cut into P column
blocks of consecutive ids holding about equal numbers of *ratings* (`split_items`): in a round
every device works on a different column block and the round lasts as long as its slowest
device, so a block holding hot items slows every round it is in. On 10⁵ × 10⁴ with 10⁶ Zipf
ratings, blocks of equal item counts left the slowest device of a round up to 1.25× (P = 4)
and 1.5× (P = 8) the devices' mean work; blocks of equal ratings, 1.04× and 1.13×. A device's
work in a round is then about its share of the ratings, that is of the users (the generator
scatters the hot users over the ids), whichever column block it holds.

A device's ratings are those of its users. They are put in P *slots* of one padded length L,
so that every device holds P × L ratings and the executor can shard the arrays' leading axis
evenly:

- for the static rotation, slot c holds the ratings of block (p, c): in the round of offset s,
  device p reads slot (p + s) mod P;
- for the unscheduled baseline, slot k holds the k-th of P equal chunks of the device's ratings
  (every column mixed): round t reads slot t mod P.

Within a slot the ratings keep a given order (the app's seeded epoch order) and come first;
the padding after them is marked ``observed = 0``. L is the largest slot, so unequal blocks
cost padding memory but no compute: a round stops at each slot's real count.

Example (4 users, 2 items, 2 devices, the rotation)::

  ratings (user, item): (0, 0) (3, 1) (1, 1) (2, 0) (0, 1)    # in the epoch order
  row blocks: users 0-1 on device 0, users 2-3 on device 1; column blocks: item 0 | item 1
  device 0: slot 0 = [(0, 0)], slot 1 = [(1, 1), (0, 1)]     # L = 2, one pad in slot 0
  device 1: slot 0 = [(2, 0)], slot 1 = [(3, 1)]
  data['user'] (local row in the device's W block) = [0, _, 1, 0 | 0, _, 1, _]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.data import Ratings

#: the per-rating arrays of an `MFLayout`'s data, each [P × P × L]
FIELDS = ('user', 'item', 'value', 'observed', 'user_reg', 'item_reg')


@dataclasses.dataclass(frozen=True, eq=False)
class MFLayout:
  """The blocks of one rating matrix on ``devices`` devices (module docstring).

  Attributes:
    devices: P.
    row_starts, row_counts: int64[P], the first user and the users of each row block.
    col_starts, col_counts: int64[P], the first item and the items of each column block.
    counts: int64[P, P], the real ratings of device p's slot s.
    slot: L, the padded length of every slot.
    data: the ratings by `FIELDS`, each of length P × P × L, device p's slot s at
      [(p × P + s) × L, …): ``user`` int32, the row in the device's W block; ``item`` int32,
      the row in its column block's H (rotation) or in all of H (chunks); ``value`` float32;
      ``observed`` float32, 1 for a rating, 0 for padding; ``user_reg`` and ``item_reg``
      float32, 1 / the ratings of the rating's user and item (each rating carries that part
      of its rows' regulariser, so one pass over the ratings regularises each row once).
  """

  devices: int
  row_starts: np.ndarray
  row_counts: np.ndarray
  col_starts: np.ndarray
  col_counts: np.ndarray
  counts: np.ndarray
  slot: int
  data: dict[str, np.ndarray]

  @property
  def row_pad(self) -> int:
    """Rows of every device's W block (the largest share)."""
    return int(self.row_counts.max())

  @property
  def col_pad(self) -> int:
    """Rows of every H block (the largest column block)."""
    return int(self.col_counts.max())


def split_users(users: int, devices: int, shares: Sequence[int] | None
                ) -> tuple[np.ndarray, np.ndarray]:
  """``(starts, counts)`` of the row blocks: ``shares`` users each, or as equal as they divide
  (the first ``users mod P`` blocks one more).

  Raises:
    ConfigError: fewer users than devices, or shares that are not P positive integers summing
      to ``users``.
  """
  if shares is None:
    if users < devices:
      raise ConfigError(f'MF: {users} users cannot be split into row blocks over {devices} '
                        'devices (at least one user each)')
    counts = np.full(devices, users // devices, np.int64)
    counts[:users % devices] += 1
  else:
    counts = np.asarray(shares, np.int64)
    if counts.shape != (devices,):
      raise ConfigError(f'MF: {len(shares)} row shares for {devices} devices')
    if counts.min() < 1 or counts.sum() != users:
      raise ConfigError(f'MF: row shares {tuple(int(c) for c in counts)} must be positive and '
                        f'sum to the {users} users')
  return np.cumsum(counts) - counts, counts


def split_items(per_item: np.ndarray, devices: int) -> tuple[np.ndarray, np.ndarray]:
  """``(starts, counts)`` of P column blocks of consecutive items, each cut where the running
  count of ratings ``per_item`` comes nearest to k/P of them, and at least one item each (the
  caller checks there are P items).

  Example: items rated (5, 1, 1, 1, 4, 4) times, P = 2: 8 ratings on each side of item 4::

    >>> split_items(np.array([5, 1, 1, 1, 4, 4]), 2)
    (array([0, 4]), array([4, 2]))
  """
  items = per_item.size
  running = np.cumsum(per_item, dtype=np.int64)
  edges = [0]
  for k in range(1, devices):
    target = running[-1] * k / devices
    i = int(np.searchsorted(running, target))  # running[i] >= target: cut before or after i
    before = running[i - 1] if i else 0
    edge = i + 1 if i < items and running[i] - target < target - before else i
    edges.append(min(max(edge, edges[-1] + 1), items - (devices - k)))
  edges.append(items)
  edges = np.asarray(edges, np.int64)
  return edges[:-1], np.diff(edges)


def mf_layout(ratings: Ratings, devices: int, shares: Sequence[int] | None,
              order: np.ndarray, rotation: bool) -> MFLayout:
  """The layout of ``ratings`` on ``devices`` devices, slots by column block (``rotation``)
  or by chunk, each slot's ratings in ``order`` (a permutation of the ratings).

  Raises:
    ConfigError: users that cannot be split (`split_users`), or fewer items than devices.
  """
  p_count = devices
  if ratings.items < p_count:
    raise ConfigError(f'MF: {ratings.items} items cannot be split into column blocks over '
                      f'{p_count} devices')
  row_starts, row_counts = split_users(ratings.users, p_count, shares)
  col_starts, col_counts = split_items(np.bincount(ratings.item, minlength=ratings.items),
                                       p_count)
  user, item = ratings.user[order].astype(np.int64), ratings.item[order].astype(np.int64)
  device = np.searchsorted(row_starts, user, side='right') - 1
  if rotation:
    slot = np.searchsorted(col_starts, item, side='right') - 1
    local_item = item - col_starts[slot]
  else:  # P equal chunks of each device's ratings, in order
    per_device = np.bincount(device, minlength=p_count)
    slot = _rank_within(device, per_device) * p_count // np.maximum(per_device[device], 1)
    local_item = item
  group = device * p_count + slot
  counts = np.bincount(group, minlength=p_count * p_count)
  length = max(int(counts.max()), 1)
  at = group * length + _rank_within(group, counts)
  size = p_count * p_count * length
  columns = {
      'user': (user - row_starts[device], np.int32),
      'item': (local_item, np.int32),
      'value': (ratings.value[order], np.float32),
      'observed': (np.ones(user.size), np.float32),
      'user_reg': (1.0 / np.bincount(user, minlength=ratings.users)[user], np.float32),
      'item_reg': (1.0 / np.bincount(item, minlength=ratings.items)[item], np.float32),
  }
  data = {}
  for name in FIELDS:
    values, dtype = columns[name]
    data[name] = np.zeros(size, dtype)
    data[name][at] = values
  return MFLayout(p_count, row_starts, row_counts, col_starts, col_counts,
                  counts.reshape(p_count, p_count), length, data)


def _rank_within(group: np.ndarray, sizes: np.ndarray) -> np.ndarray:
  """Each element's position among the elements of its group, in their given order."""
  index = np.argsort(group, kind='stable')
  rank = np.empty(group.size, np.int64)
  rank[index] = np.arange(group.size) - (np.cumsum(sizes) - sizes)[group[index]]
  return rank
