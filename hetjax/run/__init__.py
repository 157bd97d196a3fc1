"""A run, assembled in the library: `Config` and `Mode`, the builder that turns a config into a
step program, its policy and its host (`build`), and the runner that drives it (`train`).

``hetjax-train`` (``experiments/train.py``) parses flags into a `Config` and calls `train`; a
notebook does the same::

  from hetjax import run
  config = run.override(run.load_config('mlp'), ['steps=20', 'mesh=1x1'])
  summary = run.train(config, 'runs/mlp', overwrite=True)

Its config (`Config`, the sections, `override`, `load_config`) imports no JAX, so a program that
only reads or checks configs stays light; the rest (the builders, the runner, `load_model`) is
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hetjax.run._config import Config as Config
from hetjax.run._config import keys as config_keys
from hetjax.run._config import override as override
from hetjax.run._config_files import import_function as import_function
from hetjax.run._config_files import load as load_config
from hetjax.run._config_files import names as config_names
from hetjax.run._sections import BalanceConfig as BalanceConfig
from hetjax.run._sections import CheckpointConfig as CheckpointConfig
from hetjax.run._sections import DataConfig as DataConfig
from hetjax.run._sections import EmulationConfig as EmulationConfig
from hetjax.run._sections import EvalConfig as EvalConfig
from hetjax.run._sections import LocalConfig as LocalConfig
from hetjax.run._sections import LoggingConfig as LoggingConfig
from hetjax.run._sections import Mode as Mode
from hetjax.run._sections import ModelConfig as ModelConfig
from hetjax.run._sections import OptimizerConfig as OptimizerConfig
from hetjax.run._sections import ParallelismConfig as ParallelismConfig
from hetjax.run._sections import ParameterServerConfig as ParameterServerConfig
from hetjax.run._sections import PipelineConfig as PipelineConfig
from hetjax.run._sections import SchmpConfig as SchmpConfig

if TYPE_CHECKING:  # what type checkers and IDEs see
  from hetjax.run._built import Built as Built
  from hetjax.run._evaluate_run import evaluate as evaluate
  from hetjax.run._generate import generate as generate
  from hetjax.run._generate import sample as sample
  from hetjax.run._hf import load_hf as load_hf
  from hetjax.run._hf import save_hf as save_hf
  from hetjax.run._hosts import emulated_host as emulated_host
  from hetjax.run._modes import MODES as MODES
  from hetjax.run._modes import ModeEntry as ModeEntry
  from hetjax.run._modes import build as build
  from hetjax.run._modes import describe_modes as describe_modes
  from hetjax.run._modes import mode_of as mode_of
  from hetjax.run._runner import train as train
  from hetjax.run._task import make_task as make_task
  from hetjax.run._task import optimizer_of as optimizer_of
  from hetjax.run._trained import load_model as load_model

#: The names whose modules import JAX: name -> (module, attribute), imported on first use.
_LAZY = {
    'Built': ('_built', 'Built'),
    'evaluate': ('_evaluate_run', 'evaluate'),
    'emulated_host': ('_hosts', 'emulated_host'),
    'generate': ('_generate', 'generate'),
    'load_hf': ('_hf', 'load_hf'),
    'save_hf': ('_hf', 'save_hf'),
    'MODES': ('_modes', 'MODES'),
    'ModeEntry': ('_modes', 'ModeEntry'),
    'build': ('_modes', 'build'),
    'describe_modes': ('_modes', 'describe_modes'),
    'mode_of': ('_modes', 'mode_of'),
    'sample': ('_generate', 'sample'),
    'train': ('_runner', 'train'),
    'make_task': ('_task', 'make_task'),
    'optimizer_of': ('_task', 'optimizer_of'),
    'load_model': ('_trained', 'load_model'),
}


def __getattr__(name: str):
  if name in _LAZY:
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(f'hetjax.run.{module}'), attribute)
    globals()[name] = value
    return value
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted({*globals(), *_LAZY})


__all__ = [
    'MODES',
    'BalanceConfig',
    'Built',
    'CheckpointConfig',
    'Config',
    'DataConfig',
    'EmulationConfig',
    'EvalConfig',
    'LocalConfig',
    'LoggingConfig',
    'Mode',
    'ModeEntry',
    'ModelConfig',
    'OptimizerConfig',
    'ParallelismConfig',
    'ParameterServerConfig',
    'PipelineConfig',
    'SchmpConfig',
    'build',
    'config_keys',
    'config_names',
    'describe_modes',
    'emulated_host',
    'evaluate',
    'generate',
    'import_function',
    'load_config',
    'load_hf',
    'load_model',
    'make_task',
    'mode_of',
    'optimizer_of',
    'override',
    'sample',
    'save_hf',
    'train',
]
