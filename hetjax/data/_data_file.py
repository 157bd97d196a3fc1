"""The user's own data file (``.npy``, ``.npz`` or ``.csv``) read into numpy arrays, every
failure one line.

The SchMP apps train on a path as well as on their bundled or generated data. What the arrays
mean is each reader's business (`read_design`, `read_ratings`, `read_documents`); how a file
becomes arrays, and what is wrong with it when it does not, is this module's:

* ``.npy``: one array (`numpy.save`), read without pickles;
* ``.npz``: named arrays (`numpy.savez`), read without pickles;
* ``.csv``: numbers separated by commas, one row a line (``#`` starts a comment, blank lines
  are skipped); a first line that is not all numbers is a header: skipped as data, its fields
  kept (a reader may take them as names, e.g. LDA's words).

Example::

  >>> f = read_data_file('ratings.csv')          # "user,item,rating" then numbers
  >>> f.header, f.table().shape
  (('user', 'item', 'rating'), (20000, 3))
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import warnings
import zipfile

import numpy as np

from hetjax._errors import ConfigError

#: the suffixes a data file may have
SUFFIXES = ('.npy', '.npz', '.csv')
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, UnicodeDecodeError)


def is_data_path(data: str | os.PathLike) -> bool:
  """Whether ``data`` names a file rather than a data set: a path object, or a name with a
  suffix or a directory (``mydata.csv``, ``runs/x``); the data sets' names have neither."""
  if isinstance(data, os.PathLike):
    return True
  return isinstance(data, str) and any(c in data for c in ('.', '/', os.sep))


@dataclasses.dataclass(frozen=True, eq=False)
class DataFile:
  """The arrays of one data file.

  Attributes:
    path: the path as given (what messages name).
    suffix: ``'.npy'``, ``'.npz'`` or ``'.csv'``.
    arrays: ``.npz``: its arrays by name; ``.npy`` and ``.csv``: the one array, named ``''``
      (a CSV's as float64[rows, columns]).
    header: a CSV's header fields (empty without one, and for the other formats).
  """

  path: str
  suffix: str
  arrays: dict[str, np.ndarray]
  header: tuple[str, ...] = ()

  @property
  def name(self) -> str:
    """The file's name without its directory (what a data set's name records)."""
    return os.path.basename(self.path)

  def has(self, key: str) -> bool:
    return key in self.arrays

  def array(self, key: str) -> np.ndarray:
    """The ``.npz`` array ``key``.

    Raises:
      ConfigError: the file has none of that name (one line listing those it has).
    """
    if key not in self.arrays:
      have = ', '.join(sorted(self.arrays)) or 'none'
      raise ConfigError(f'data file {self.path!r} has no array {key!r} (it has: {have})')
    return self.arrays[key]

  def table(self) -> np.ndarray:
    """The one array of a ``.npy`` or ``.csv`` file."""
    return self.arrays['']

  def numeric(self, array: np.ndarray, what: str) -> np.ndarray:
    """``array`` if it holds numbers (bool, integers, floats) and has any, as is.

    Raises:
      ConfigError: another dtype (strings, objects, complex numbers), or no elements.
    """
    if not (array.dtype == bool or np.issubdtype(array.dtype, np.integer)
            or np.issubdtype(array.dtype, np.floating)):
      raise ConfigError(f'data file {self.path!r}: {what} must hold real numbers, not '
                        f'{array.dtype}')
    if array.size == 0:
      raise ConfigError(f'data file {self.path!r}: {what} is empty (shape {array.shape})')
    return array

  def integers(self, array: np.ndarray, what: str, low: int = 0) -> np.ndarray:
    """``array`` as int64 if it holds whole numbers >= ``low`` (a CSV's come as floats).

    Raises:
      ConfigError: not numbers, a fraction or a non-finite value, or one below ``low``.
    """
    array = self.numeric(array, what)
    if not np.issubdtype(array.dtype, np.integer) and array.dtype != bool:
      bad = ~np.isfinite(array) | (array != np.round(array)) | (np.abs(array) >= 2.0 ** 62)
      if bad.any():
        at = np.argwhere(bad)[0]
        raise ConfigError(f'data file {self.path!r}: {what} must be whole numbers; '
                          f'{_at(array, at)}')
    array = array.astype(np.int64)
    if array.min() < low:
      at = np.argwhere(array < low)[0]
      raise ConfigError(f'data file {self.path!r}: {what} must be >= {low}; '
                        f'{_at(array, at)}')
    return array

  def floats(self, array: np.ndarray, what: str) -> np.ndarray:
    """``array`` as float32 if every value is finite there.

    Raises:
      ConfigError: not numbers, or a NaN, an infinity or a value beyond float32's range.
    """
    array = self.numeric(array, what)
    with np.errstate(over='ignore'):
      out = array.astype(np.float32)
    if not np.isfinite(out).all():
      at = np.argwhere(~np.isfinite(out))[0]
      raise ConfigError(f'data file {self.path!r}: {what} must be finite (in float32); '
                        f'{_at(array, at)}')
    return out


def read_data_file(path: str | os.PathLike) -> DataFile:
  """The arrays of the ``.npy``, ``.npz`` or ``.csv`` file at ``path`` (module docstring).

  Raises:
    ConfigError: another suffix, no such file, or one that does not read (one line each).
  """
  shown = os.fspath(path)
  file = pathlib.Path(shown).expanduser()
  suffix = file.suffix.lower()
  if suffix not in SUFFIXES:
    raise ConfigError(f'data file {shown!r}: give a .npy, .npz or .csv file')
  if not file.exists():
    raise ConfigError(f'data file {shown!r} does not exist')
  if not file.is_file():
    raise ConfigError(f'data file {shown!r} is not a file')
  try:
    if suffix == '.csv':
      table, header = _read_csv(file)
    else:
      with open(file, 'rb') as f:  # closed here even when numpy fails half-way through
        if suffix == '.npy':
          return DataFile(shown, suffix, {'': np.load(f, allow_pickle=False)})
        with np.load(f, allow_pickle=False) as archive:
          return DataFile(shown, suffix, {k: archive[k] for k in archive.files})
  except _READ_ERRORS as e:
    reason = ' '.join(str(e).split()) or type(e).__name__
    raise ConfigError(f'data file {shown!r} does not read as {suffix}: {reason}') from None
  if table.size == 0:
    raise ConfigError(f'data file {shown!r} has no rows of numbers')
  return DataFile(shown, suffix, {'': table}, header)


def _read_csv(file: pathlib.Path) -> tuple[np.ndarray, tuple[str, ...]]:
  """float64[rows, columns] and the header's fields (module docstring)."""
  with open(file, encoding='utf-8-sig') as f:  # a spreadsheet's byte-order mark dropped
    lines = [line for line in f if line.split('#', 1)[0].strip()]
  header: tuple[str, ...] = ()
  if lines:
    fields = tuple(field.strip().strip('"') for field in lines[0].split('#', 1)[0].split(','))
    try:
      [float(field) for field in fields]
    except ValueError:
      header, lines = fields, lines[1:]
  if not lines:
    return np.zeros((0, 0)), header
  with warnings.catch_warnings():  # what would warn (no data) is checked by the caller
    warnings.simplefilter('ignore')
    return np.loadtxt(lines, delimiter=',', ndmin=2, dtype=np.float64, quotechar='"'), header


def _at(array: np.ndarray, at: np.ndarray) -> str:
  """``nan at row 3`` or ``1.5 at row 3, column 1``: a bad value and where numpy finds it."""
  value = array[tuple(at)]
  shown = f'{value:g}' if isinstance(value, np.floating | float) else str(value)
  if len(at) == 1:
    return f'{shown} at row {int(at[0])}'
  if len(at) == 2:
    return f'{shown} at row {int(at[0])}, column {int(at[1])}'
  return f'{shown} at [{", ".join(str(int(i)) for i in at)}]'
