"""A config's task and optimizer: the model it names (shipped, or ``module:function`` of your
own) and the optax transformation of its optimizer section."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
from collections.abc import Callable
from typing import Any

from hetjax import ConfigError, models, schmp, sharding, train
from hetjax.models import hf, hf_files
from hetjax.run._config import Config
from hetjax.run._config_files import import_function
from hetjax.run._sections import INIT_HF, PRECISION_FIELDS

#: The model that ``model.init=hf:PATH`` reads Hugging Face checkpoints into.
HF_MODEL = 'llama'


def trains_app(config: Config) -> bool:
  """Whether ``config`` trains a SchMP app (`hetjax.schmp.APPS`) rather than a model (a
  `hetjax.train.Task`): told apart by the apps' registry, by name, never by the task's type."""
  return config.model.name in schmp.APPS


def make_task(config: Config, *, weights: bool = True) -> train.Task:
  """The config's task: a shipped model by name, or ``'module:function'`` of your own, called
  with ``model.args`` and the ``model.dtype``, ``param_dtype`` and ``remat`` that are set.

  With ``model.init=hf:PATH`` the model is ``llama`` of the checkpoint's architecture
  (`resolved`), and the task's ``weights`` read the checkpoint's tensors (checked against the
  model here, read when a program starts its parameters). ``weights=False`` leaves them out, for
  a program that needs the model's structure only or restores a checkpoint of its own: a run
  directory's config, whose ``model.args`` the runner completed, is then read without the
  Hugging Face directory.

  Raises:
    ConfigError: arguments the model does not take (a precision or remat setting for a model
      without that argument says so); for ``model.init``, what `resolved` and
      `hetjax.models.hf.HfWeights` refuse.
  """
  if config.model.init is not None:
    if weights or not all(config.model.args.get(k) is not None for k in hf.ARCHITECTURE):
      config = resolved(config)
    task = models.make_task(HF_MODEL, **config.model.task_args())
    if not weights:
      return task
    shapes = sharding.abstract_model(task.make_model)[1]
    tensors = hf_files.SafetensorsDir(init_path(config))
    return dataclasses.replace(task, weights=hf.HfWeights(task.config, tensors, shapes))
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


def init_path(config: Config) -> str:
  """The directory of ``model.init=hf:PATH`` (``~`` expanded)."""
  return os.path.expanduser(config.model.init[len(INIT_HF):].strip())


def resolved(config: Config) -> Config:
  """``config`` with ``model.args`` completed from ``model.init``'s checkpoint: the
  architecture its ``config.json`` gives (`hetjax.models.hf.llama_args`), then ``args``'s own
  ``seq_len``, ``data`` and the rest; unchanged without ``model.init``. The run directory's
  ``config.json`` holds the result, so a finished run is read back (`load_model`) without the
  checkpoint.

  Raises:
    ConfigError: ``model.name`` is not ``llama``; no checkpoint at the path, or one of a layout
      that is not read; an argument of ``args`` that the checkpoint's architecture gives
      otherwise.
  """
  if config.model.init is None:
    return config
  if config.model.name != HF_MODEL:
    raise ConfigError(f'model.init={config.model.init}: a Hugging Face checkpoint is read into '
                      f'model {HF_MODEL!r}, not {config.model.name!r} (--set model.name=llama, '
                      'or --config=llama_finetune)')
  path = init_path(config)
  args = dict(config.model.args)
  found = hf.llama_args(hf_files.read_config(path), seq_len=args.get('seq_len'))
  for key, value in args.items():
    if key in found and key != 'seq_len' and value is not None and not _same(value, found[key]):
      raise ConfigError(f'model.args.{key}={value!r}, but {path}/config.json gives '
                        f'{found[key]!r}: leave {key} out (it comes from the checkpoint; '
                        '--config=llama_finetune sets none of them)')
  given = {k: v for k, v in args.items() if v is not None or k not in found}
  model = dataclasses.replace(config.model, args={**found, **given})
  return dataclasses.replace(config, model=model)


def _same(a: Any, b: Any) -> bool:
  if isinstance(a, bool) or isinstance(b, bool):
    return a is b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return math.isclose(a, b, rel_tol=1e-9)
  return a == b


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
