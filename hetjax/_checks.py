"""Checks of single input values: each returns the value checked, or raises a one-line
`ConfigError` that names it.

One wording throughout, so that a user reads the same sentence whatever module caught the value:
``'{what} must be an integer >= 1, got 0'``. Bools are not integers or numbers here (``True`` as
a worker count is a mistake, not 1), and a number must be finite (NaN and infinity fail every
bound).

Example::

  >>> positive_int(4, 'stages')
  4
  >>> positive_int(2.0, 'stages')
  Traceback (most recent call last):
  hetjax._errors.ConfigError: stages must be an integer >= 1, got 2.0
"""

from __future__ import annotations

import math
import numbers
from typing import TypeVar

from hetjax._errors import ConfigError

N = TypeVar('N', int, float)


def _is_int(value: object) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_finite(value: object) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def integer(value: object, what: str, minimum: int = 0, note: str = '') -> int:
  """``value`` as an int >= ``minimum`` (numpy integers too), or a `ConfigError` naming ``what``.

  Args:
    value: the value to check.
    what: its name in the message (``'token rules: token_rows'``).
    minimum: the smallest value allowed.
    note: said after the bound, e.g. ``' (0: exact)'``.
  """
  if not _is_int(value) or value < minimum:
    raise ConfigError(f'{what} must be an integer >= {minimum}{note}, got {value!r}')
  return int(value)


def positive_int(value: object, what: str) -> int:
  """``value`` as an int >= 1, or a `ConfigError` naming ``what`` (`integer` with minimum 1)."""
  return integer(value, what, 1)


def between(value: object, low: int, high: int, what: str) -> int:
  """``value`` as an int in ``low`` … ``high`` (both included), or a `ConfigError`.

  Example::

    >>> between(0, 1, 1024, 'workers')
    Traceback (most recent call last):
    hetjax._errors.ConfigError: workers must be between 1 and 1024, got 0
  """
  if not _is_int(value) or not low <= value <= high:
    raise ConfigError(f'{what} must be between {low} and {high}, got {value!r}')
  return int(value)


def number(value: object, what: str, minimum: float = 0.0) -> float:
  """``value`` as a finite float >= ``minimum``, or a `ConfigError` naming ``what``."""
  if not _is_finite(value) or value < minimum:
    raise ConfigError(f'{what} must be a finite number >= {minimum:g}, got {value!r}')
  return float(value)


def positive_number(value: object, what: str) -> float:
  """``value`` as a finite float > 0, or a `ConfigError` naming ``what``."""
  if not _is_finite(value) or value <= 0:
    raise ConfigError(f'{what} must be a positive finite number, got {value!r}')
  return float(value)


def fraction(value: object, what: str) -> float:
  """``value`` as a float in (0, 1], or a `ConfigError` naming ``what``.

  Example::

    >>> fraction(0, 'parallelism.overlap_scale')
    Traceback (most recent call last):
    hetjax._errors.ConfigError: parallelism.overlap_scale must be in (0, 1], got 0
  """
  if not _is_finite(value) or not 0 < value <= 1:
    raise ConfigError(f'{what} must be in (0, 1], got {value!r}')
  return float(value)


def positive_seconds(value: object, what: str) -> float:
  """``value`` as a finite float > 0 (a duration), or a `ConfigError` naming ``what``."""
  if not _is_finite(value) or value <= 0:
    raise ConfigError(f'{what} must be a positive number of seconds, got {value!r}')
  return float(value)


def at_least(value: N, minimum: N, what: str, note: str = '') -> N:
  """``value`` unchanged if it is a number >= ``minimum``, else a `ConfigError` naming ``what``.

  For values whose type is already checked (a config field): the message states only the bound.

  Example::

    >>> at_least(-1, 0, 'balance.bucket', note=' (0: automatic)')
    Traceback (most recent call last):
    hetjax._errors.ConfigError: balance.bucket must be >= 0 (0: automatic), got -1
  """
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= minimum:
    raise ConfigError(f'{what} must be >= {minimum}{note}, got {value!r}')
  return value
