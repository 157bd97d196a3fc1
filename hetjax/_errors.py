"""Errors that hetjax raises for bad input.

Every error a user can cause by a flag, a config or a plan is a `ConfigError`: entry points print
its one-line message and exit with status 2 instead of showing a traceback.
"""

from __future__ import annotations

import enum
from typing import TypeVar

E = TypeVar('E', bound=enum.Enum)


class ConfigError(ValueError):
  """Bad input: a config, flag, mesh, rule set or checkpoint that cannot be used as given."""


class ShardingError(ConfigError):
  """A logical-axis rule cannot be applied to an array (e.g. the mesh axes do not divide it)."""


def parse_choice(choices: type[E], value: str | E, what: str) -> E:
  """``choices(value)`` for an enum of named options, or a `ConfigError` listing the names.

  Example::

    >>> parse_choice(Strategy, 'hybrid', 'strategy')
    <Strategy.HYBRID: 'hybrid'>
  """
  if isinstance(value, choices):
    return value
  try:
    return choices(value)
  except ValueError:
    known = ', '.join(c.value for c in choices)
    raise ConfigError(f'unknown {what} {value!r}; choose one of: {known}') from None
