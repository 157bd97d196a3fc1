"""Errors that hetjax raises for bad input.

Every error a user can cause by a flag, a config or a plan is a `ConfigError`: entry points print
its one-line message and exit with status 2 instead of showing a traceback.
"""


class ConfigError(ValueError):
  """Bad input: a config, flag, mesh, rule set or checkpoint that cannot be used as given."""


class ShardingError(ConfigError):
  """A logical-axis rule cannot be applied to an array (e.g. the mesh axes do not divide it)."""
