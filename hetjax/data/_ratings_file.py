"""Ratings for matrix factorisation read from the user's own file.

The formats (`read_data_file` reads them), one rating per observed cell:

* ``.npz`` with arrays ``rows`` (user ids), ``cols`` (item ids) and ``values`` (the ratings),
  one entry per rating, and optionally ``shape`` = (users, items) — the matrix's size when its
  last users or items have no rating;
* ``.csv`` of (row, col, value) triples, one a line (a header line is skipped);
* ``.npy``: one n × 3 array of (row, col, value) triples.

Ids are whole numbers from 0; without ``shape`` the matrix has max id + 1 users and items.
A cell rated twice is refused (a `Ratings` holds one rating per cell), naming the cell.

Example::

  np.savez('mine.npz', rows=user, cols=item, values=stars, shape=(6040, 3706))
  ratings = read_ratings('mine.npz')
"""

from __future__ import annotations

import os

import numpy as np

from hetjax._errors import ConfigError
from hetjax.data._data_file import read_data_file
from hetjax.data._ratings import Ratings

_MAX_ID = 2 ** 31 - 1  # ids are int32


def read_ratings(path: str | os.PathLike) -> Ratings:
  """The ratings in the file at ``path`` (module docstring), in the file's order.

  Raises:
    ConfigError: a file that is missing or does not read, arrays of the wrong shape or dtype,
      ids that are not whole numbers >= 0 (or beyond ``shape``), a value that is not finite, a
      cell rated twice (one line each).
  """
  file = read_data_file(path)
  if file.suffix == '.npz':
    rows, cols, values = (file.array(k) for k in ('rows', 'cols', 'values'))
    if not rows.ndim == cols.ndim == values.ndim == 1 or not (
        rows.shape == cols.shape == values.shape):
      raise ConfigError(f'data file {file.path!r}: rows, cols and values must be 1-D, one entry '
                        f'per rating; got shapes {rows.shape}, {cols.shape}, {values.shape}')
  else:
    table = file.table()
    if table.ndim != 2 or table.shape[1] != 3:
      raise ConfigError(f'data file {file.path!r}: need (row, col, value) triples, an n × 3 '
                        f'array; got shape {table.shape}')
    rows, cols, values = table.T
  user, item = file.integers(rows, 'rows'), file.integers(cols, 'cols')
  value = file.floats(values, 'values')
  users, items = int(user.max()) + 1, int(item.max()) + 1
  if file.has('shape'):
    shape = file.integers(file.array('shape'), 'shape', low=1)
    if shape.shape != (2,):
      raise ConfigError(f'data file {file.path!r}: shape must be (users, items), got '
                        f'{shape.tolist()}')
    if shape[0] < users or shape[1] < items:
      raise ConfigError(f'data file {file.path!r}: ids up to ({users - 1}, {items - 1}) do not '
                        f'fit shape {tuple(shape.tolist())}')
    users, items = int(shape[0]), int(shape[1])
  if max(users, items) > _MAX_ID:
    raise ConfigError(f'data file {file.path!r}: ids must be below 2**31, got a matrix of '
                      f'{users} × {items}')
  cells = user * items + item
  distinct, first, seen = np.unique(cells, return_index=True, return_counts=True)
  if distinct.size < cells.size:
    k = int(np.argmax(seen > 1))
    at = first[k]
    raise ConfigError(f'data file {file.path!r}: cell ({user[at]}, {item[at]}) is rated '
                      f'{seen[k]} times; give one rating per cell')
  return Ratings(users, items, user.astype(np.int32), item.astype(np.int32), value)
