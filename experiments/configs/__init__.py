"""Experiment configs: one Python module per model, each with ``get_config() -> Config``.

A config is a frozen dataclass. Flags override single fields with ``--set key=value``, dotted for
model arguments (``--set model_args.rows=1000000``); values are Python literals checked against
the type of the field or of the value they replace.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from typing import Any

from hetjax import ConfigError


@dataclasses.dataclass(frozen=True)
class Config:
  """One experiment.

  Attributes:
    model: a name in `models.NAMES`.
    model_args: keyword arguments of that model's ``make_task``.
    global_batch: examples per step, over all devices.
    optimizer: a `hetjax.train.Optimizer` name.
    learning_rate: the optimizer's step size.
    steps: total optimizer steps of the run.
    seed: parameter initialisation and data order.
    strategy: a `hetjax.train.Strategy` name.
    mesh: mesh shape over ``('data', 'model')``, e.g. ``'4x2'``.
    log_every: steps between progress lines (and metric flushes).
    checkpoint_every: steps between checkpoints (a checkpoint is also written at the end).
  """

  model: str
  model_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  global_batch: int = 256
  optimizer: str = 'adam'
  learning_rate: float = 1e-3
  steps: int = 100
  seed: int = 0
  strategy: str = 'hybrid'
  mesh: str = '4x2'
  log_every: int = 10
  checkpoint_every: int = 50

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self) | {'model_args': dict(self.model_args)}


def names() -> list[str]:
  """The shipped config names (the modules of this package)."""
  return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith('_'))


def load(name: str) -> Config:
  """Returns config ``name``'s `Config`.

  Raises:
    ConfigError: for an unknown name.
  """
  if name not in names():
    raise ConfigError(f'unknown config {name!r}; choose one of: {", ".join(names())}')
  return importlib.import_module(f'{__name__}.{name}').get_config()


def _parse_value(key: str, text: str, current: Any) -> Any:
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text  # a bare word is a string
  if current is None or (isinstance(value, type(current))
                         and isinstance(value, bool) == isinstance(current, bool)):
    return value
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  raise ConfigError(
      f'override {key}={text!r}: expected {type(current).__name__}, got {type(value).__name__}')


def override(config: Config, assignments: Sequence[str]) -> Config:
  """Applies ``key=value`` assignments; ``model_args.NAME=value`` sets a model argument.

  Raises:
    ConfigError: for a malformed assignment, an unknown field, or a value of the wrong type.
  """
  fields = {f.name for f in dataclasses.fields(Config)}
  for assignment in assignments:
    key, sep, text = assignment.partition('=')
    key = key.strip()
    if not sep or not key:
      raise ConfigError(f'override {assignment!r} is not of the form key=value')
    if key.startswith('model_args.'):
      arg = key.removeprefix('model_args.')
      value = _parse_value(key, text, config.model_args.get(arg))
      config = dataclasses.replace(config, model_args={**config.model_args, arg: value})
    elif key in fields - {'model_args'}:
      config = dataclasses.replace(config, **{key: _parse_value(key, text, getattr(config, key))})
    else:
      raise ConfigError(
          f'override {key!r}: unknown field; fields are {", ".join(sorted(fields))} '
          f'(model arguments as model_args.NAME)')
  return config
