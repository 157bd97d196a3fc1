"""hetjax: JAX training for clusters that are not uniform.

``import hetjax`` is light: the errors are imported, and each package a user needs (`run`,
`train`, `data`, …, `__all__`) is imported the first time it is used (``hetjax.run.train(…)``,
``from hetjax import run``), so a launched worker, a CLI or ``from hetjax import ConfigError``
pays only for the packages it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hetjax._errors import ConfigError as ConfigError
from hetjax._errors import ShardingError as ShardingError

__version__ = '0.1.0'


if TYPE_CHECKING:  # what type checkers and IDEs see
  from hetjax import (
    balance,
    checkpoint,
    core,
    data,
    emulation,
    models,
    pipeline,
    planner,
    ps,
    replicas,
    report,
    run,
    runtime,
    schmp,
    sharding,
    simulation,
    train,
  )


def __getattr__(name: str):
  if name in _PACKAGES:
    return importlib.import_module(f'hetjax.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted({*globals(), *_PACKAGES})


__all__ = [
    'ConfigError',
    'ShardingError',
    'balance',
    'checkpoint',
    'core',
    'data',
    'emulation',
    'models',
    'pipeline',
    'planner',
    'ps',
    'replicas',
    'report',
    'run',
    'runtime',
    'schmp',
    'sharding',
    'simulation',
    'train',
]

#: The packages ``hetjax.NAME`` gives, imported on first use.
_PACKAGES = frozenset(__all__) - {'ConfigError', 'ShardingError'}
