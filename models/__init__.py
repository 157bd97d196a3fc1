"""Example models, each exposing ``make_task(**kwargs) -> hetjax.train.Task``.

Models name logical axes only; the strategy or plan decides what is split over which devices.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from hetjax import ConfigError
from hetjax.train import Task

NAMES = ('gpt', 'llama', 'mlp', 'transformer', 'wide_deep')

__all__ = ['NAMES', 'make_task']


def make_task(name: str, **kwargs: Any) -> Task:
  """Builds model ``name``'s task with keyword arguments checked against its signature.

  Raises:
    ConfigError: for an unknown model or an argument the model does not take.
  """
  if name not in NAMES:
    raise ConfigError(f'unknown model {name!r}; choose one of: {", ".join(NAMES)}')
  factory = importlib.import_module(f'hetjax.models.{name}').make_task
  accepted = inspect.signature(factory).parameters
  for key in kwargs:
    if key not in accepted:
      raise ConfigError(
          f'model {name!r} has no argument {key!r}; it takes: {", ".join(accepted)}')
  return factory(**kwargs)
