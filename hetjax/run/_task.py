"""A config's task and optimizer: the model it names (shipped, or ``module:function`` of your
own) and the optax transformation of its optimizer section."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from hetjax import ConfigError, models, schmp, train
from hetjax.run._config import Config
from hetjax.run._config_files import import_function
from hetjax.run._sections import PRECISION_FIELDS


def trains_app(config: Config) -> bool:
  """Whether ``config`` trains a SchMP app (`hetjax.schmp.APPS`) rather than a model (a
  `hetjax.train.Task`): told apart by the apps' registry, by name, never by the task's type."""
  return config.model.name in schmp.APPS


def make_task(config: Config) -> train.Task:
  """The config's task: a shipped model by name, or ``'module:function'`` of your own, called
  with ``model.args`` and the ``model.dtype``, ``param_dtype`` and ``remat`` that are set.

  Raises:
    ConfigError: arguments the model does not take (a precision or remat setting for a model
      without that argument says so).
  """
  args = config.model.task_args()
  if ':' in config.model.name:
    make = import_function(config.model.name, 'model')
    try:
      inspect.signature(make).bind(**args)
    except ValueError:  # no signature to check (a builtin): the call will tell
      pass
    except TypeError as e:
      _refuse_precision(config, inspect.signature(make).parameters)
      raise ConfigError(f'model {config.model.name!r} does not take model_args '
                        f'{dict(args)}: {e}') from None
    task = make(**args)
    if not isinstance(task, train.Task):
      raise ConfigError(f'model {config.model.name!r} returned {type(task).__name__}, not a '
                        'hetjax.train.Task')
    return task
  if config.model.name in models.NAMES:
    factory = importlib.import_module(f'hetjax.models.{config.model.name}').make_task
    _refuse_precision(config, inspect.signature(factory).parameters)
  return models.make_task(config.model.name, **args)


def _refuse_precision(config: Config, accepted) -> None:
  for field in PRECISION_FIELDS:
    if getattr(config.model, field) is not None and field not in accepted:
      raise ConfigError(f'model.{field}: model {config.model.name!r} takes no {field} argument '
                        '(the gpt model does; a model of your own takes it as a make_task '
                        'keyword)')


def optimizer_of(config: Config) -> tuple[Any, Callable[[int], float]]:
  """``(the optax transformation, learning_rate(step))`` of ``config.optimizer``: its named
  optimizer with the schedule, clipping and weight decay the config gives."""
  opt = config.optimizer
  rate = train.learning_rate_schedule(opt.learning_rate, opt.decay_steps or opt.steps,
                                      opt.schedule, opt.warmup, opt.final_fraction)
  tx = train.Optimizer.parse(opt.name).make(rate, weight_decay=opt.weight_decay,
                                            clip_norm=opt.clip_norm)
  return tx, (rate if callable(rate) else lambda step: rate)
