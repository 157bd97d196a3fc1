"""Refusing to resume a run from a checkpoint that belongs to another run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetjax._errors import ConfigError

#: Entries of a checkpoint's meta that must match for a resume to continue the same training.
MUST_MATCH = ('task', 'data')


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any], where: str) -> None:
  """Raises if ``saved`` (a checkpoint's meta) was made by another model, model size or data.

  The layout (mesh, strategy, plan) may change between runs: restoring onto another layout is
  supported. The task (model name and arguments) and the data (seed, global batch) may not,
  since the restored state would then not continue the same training.

  Raises:
    ConfigError: one line naming the first entry that differs and both values.
  """
  for key in MUST_MATCH:
    old, new = saved.get(key), current.get(key)
    if old != new:
      raise ConfigError(
          f'cannot resume from {where}: its {key} is {_short(old)} but this run has {_short(new)}')


def _short(value: Any) -> str:
  if isinstance(value, Mapping):
    return '{' + ', '.join(f'{k}={v!r}' for k, v in value.items()) + '}'
  return repr(value)
