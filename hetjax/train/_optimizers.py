"""Optimizers by name, learning-rate schedules, clipping and weight decay, for configs and flags.

  >>> lr = learning_rate_schedule(1e-3, steps=100, schedule='cosine', warmup=10)
  >>> float(lr(0)), float(lr(10)), round(float(lr(100)), 9)
  (0.0, 0.001, 0.0)
  >>> tx = Optimizer.ADAMW.make(lr, weight_decay=0.1, clip_norm=1.0)
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import optax

from hetjax._errors import ConfigError, parse_choice

#: ``schedule(step) -> learning rate`` (`optax.Schedule`), or a constant.
LearningRate = float | Callable[[int], float]


class Optimizer(enum.Enum):
  """A named optax optimizer; `make(learning_rate)` builds it."""

  SGD = 'sgd'
  MOMENTUM = 'momentum'
  ADAM = 'adam'
  ADAMW = 'adamw'

  @classmethod
  def parse(cls, name: str | Optimizer) -> Optimizer:
    return parse_choice(cls, name, 'optimizer')

  def make(self, learning_rate: LearningRate, *, weight_decay: float | None = None,
           clip_norm: float = 0.0) -> optax.GradientTransformation:
    """The optimizer with ``learning_rate`` (a float or a schedule of the optimizer step).

    Args:
      learning_rate: the step size, or ``schedule(step)`` (`learning_rate_schedule`).
      weight_decay: adamw's decoupled weight decay (default 1e-4); for sgd, momentum and adam
        ``weight_decay · params`` added to the gradient (L2, as PyTorch's ``weight_decay``;
        default: none).
      clip_norm: clip the gradient to this global norm first (0: no clipping).

    Raises:
      ConfigError: a learning rate that is not positive, a negative decay or clip norm.
    """
    if not callable(learning_rate) and not learning_rate > 0:
      raise ConfigError(f'learning rate must be positive, got {learning_rate!r}')
    if weight_decay is not None and weight_decay < 0:
      raise ConfigError(f'weight decay must be >= 0, got {weight_decay!r}')
    if clip_norm < 0:
      raise ConfigError(f'clip norm must be >= 0 (0: no clipping), got {clip_norm!r}')
    if self is Optimizer.ADAMW:
      core = optax.adamw(learning_rate, **({} if weight_decay is None else
                                           {'weight_decay': weight_decay}))
    else:
      core = {
          Optimizer.SGD: lambda: optax.sgd(learning_rate),
          Optimizer.MOMENTUM: lambda: optax.sgd(learning_rate, momentum=0.9),
          Optimizer.ADAM: lambda: optax.adam(learning_rate),
      }[self]()
      if weight_decay:  # L2: added to the gradient (PyTorch's weight_decay)
        core = optax.chain(optax.add_decayed_weights(weight_decay), core)
    return optax.chain(optax.clip_by_global_norm(clip_norm), core) if clip_norm else core


def learning_rate_schedule(learning_rate: float, steps: int, schedule: str = 'constant',
                           warmup: int = 0, final_fraction: float = 0.0) -> LearningRate:
  """The learning rate of each optimizer step: a linear warm-up from 0 over ``warmup`` steps,
  then ``'constant'``, or a ``'cosine'`` or ``'linear'`` decay to ``final_fraction`` ×
  ``learning_rate`` at ``steps``. A constant schedule without warm-up is the float itself.

  A run no longer than its warm-up only warms up (its decay would start after its last step).

  Raises:
    ConfigError: an unknown schedule, a learning rate that is not positive, a negative warm-up.
  """
  if schedule not in ('constant', 'cosine', 'linear'):
    raise ConfigError(f'schedule must be constant, cosine or linear, got {schedule!r}')
  if not learning_rate > 0:
    raise ConfigError(f'learning rate must be positive, got {learning_rate!r}')
  if schedule == 'constant':
    if not warmup:
      return learning_rate
    return optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, warmup), optax.constant_schedule(learning_rate)],
        [warmup])
  if warmup < 0:
    raise ConfigError(f'warm-up must be >= 0 steps, got {warmup!r}')
  steps = max(steps, warmup + 1)
  end = learning_rate * final_fraction
  if schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, steps, end)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, learning_rate, warmup),
       optax.linear_schedule(learning_rate, end, steps - warmup)], [warmup])
