"""Optimizers by name, for configs and flags."""

from __future__ import annotations

import enum

import optax

from hetjax._errors import ConfigError, parse_choice


class Optimizer(enum.Enum):
  """A named optax optimizer; `make(learning_rate)` builds it."""

  SGD = 'sgd'
  MOMENTUM = 'momentum'
  ADAM = 'adam'
  ADAMW = 'adamw'

  @classmethod
  def parse(cls, name: str | Optimizer) -> Optimizer:
    return parse_choice(cls, name, 'optimizer')

  def make(self, learning_rate: float) -> optax.GradientTransformation:
    if not learning_rate > 0:
      raise ConfigError(f'learning rate must be positive, got {learning_rate!r}')
    return {
        Optimizer.SGD: lambda: optax.sgd(learning_rate),
        Optimizer.MOMENTUM: lambda: optax.sgd(learning_rate, momentum=0.9),
        Optimizer.ADAM: lambda: optax.adam(learning_rate),
        Optimizer.ADAMW: lambda: optax.adamw(learning_rate),
    }[self]()
