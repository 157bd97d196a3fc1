"""A design (X, y) for the sparse models read from the user's own file.

The formats (`read_data_file` reads them):

* ``.npz`` with arrays ``X`` (n × d) and ``y`` (n, or n × 1);
* ``.csv`` of n rows of d + 1 numbers, the target in the last column (a header line, any first
  line that is not all numbers, is skipped);
* ``.npy``: one 2-D array, n × (d + 1), the target in the last column.

The data are used as given: unlike the bundled and synthetic designs, the columns are not
standardised and the target is not centred, and the models fit no intercept — centre (or add
a column of ones) beforehand where one is wanted. For logistic regression the labels are 0/1
or −1/+1 (the file's choice; 0 is read as −1: the model's labels are ±1), anything else is
refused, naming the first such row.

Example::

  np.savez('mine.npz', X=x, y=y)
  design = read_design('mine.npz', Response.LINEAR)      # float32 X and y, as given
"""

from __future__ import annotations

import os

import numpy as np

from hetjax._errors import ConfigError, parse_choice
from hetjax.data._data_file import read_data_file
from hetjax.data._sparse_design import Response, SparseDesign


def read_design(path: str | os.PathLike, response: Response | str) -> SparseDesign:
  """The design in the file at ``path`` (module docstring), named by the file's name.

  Raises:
    ConfigError: a file that is missing or does not read, arrays of the wrong shape or dtype,
      a value that is not finite, logistic labels other than 0/1 or −1/+1 (one line each).
  """
  response = parse_choice(Response, response, 'response')
  file = read_data_file(path)
  if file.suffix == '.npz':
    x, y = file.array('X'), file.array('y')
    if x.ndim != 2:
      raise ConfigError(f'data file {file.path!r}: X must be 2-D (rows × features), got shape '
                        f'{x.shape}')
    if y.ndim == 2 and y.shape[1] == 1:
      y = y[:, 0]
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
      raise ConfigError(f'data file {file.path!r}: y must have one value per row of X '
                        f'({x.shape[0]}), got shape {y.shape}')
  else:
    table = file.table()
    if table.ndim != 2 or table.shape[1] < 2:
      raise ConfigError(f'data file {file.path!r}: need rows of features then the target (a '
                        f'2-D array of at least 2 columns), got shape {table.shape}')
    x, y = table[:, :-1], table[:, -1]
  x, y = file.floats(x, 'X'), file.floats(y, 'y')
  if response is Response.LOGISTIC:
    y = _labels(file.path, y)
  return SparseDesign(file.name, np.ascontiguousarray(x), y)


def _labels(path: str, y: np.ndarray) -> np.ndarray:
  """±1 labels from 0/1 or ±1 ones."""
  values = set(np.unique(y).tolist())
  if values <= {0.0, 1.0}:
    return np.where(y > 0, 1.0, -1.0).astype(np.float32)
  if values <= {-1.0, 1.0}:
    return y
  odd = np.flatnonzero((y != 0) & (y != 1) & (y != -1))
  if odd.size:
    raise ConfigError(f'data file {path!r}: logistic regression labels must be 0/1 or -1/+1; '
                      f'row {odd[0]} has {float(y[odd[0]]):g}')
  raise ConfigError(f'data file {path!r}: logistic regression labels must be 0/1 or -1/+1, '
                    'not a mix of 0, 1 and -1')
