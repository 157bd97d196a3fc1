"""Where a `Config` comes from: a shipped config (`hetjax.configs`, one module per model, each
with ``get_config() -> Config``), a Python file of the user's defining ``get_config()``, or
``'module:function'``; and the user's own modules, importable from where they live."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import sys

from hetjax import ConfigError
from hetjax.run._config import Config


def names() -> list[str]:
  """The shipped config names (the modules of `hetjax.configs`)."""
  import hetjax.configs as shipped

  return sorted(m.name for m in pkgutil.iter_modules(shipped.__path__)
                if not m.name.startswith('_'))


def load(name: str) -> Config:
  """Returns the `Config` of a shipped config name, a Python file defining ``get_config()``, or
  ``'module:function'`` (imported from the Python path) returning a `Config`.

  Raises:
    ConfigError: for an unknown name, a missing file or module, or a function that does not
      return a `Config`.
  """
  if name.endswith('.py'):
    path = pathlib.Path(name)
    if not path.is_file():
      raise ConfigError(f'config file {name} does not exist')
    _importable(path.resolve().parent)  # the file's own package and modules beside it
    spec = importlib.util.spec_from_file_location(f'_hetjax_config_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    make = getattr(module, 'get_config', None)
    where = f'{name}: get_config()'
  elif ':' in name:
    make, where = import_function(name, 'config'), f'{name}()'
  else:
    if name not in names():
      raise ConfigError(f'unknown config {name!r}; choose one of: {", ".join(names())}, a '
                        'file.py defining get_config(), or module:function')
    return importlib.import_module(f'hetjax.configs.{name}').get_config()
  if not callable(make):
    raise ConfigError(f'{where} is not defined')
  try:
    inspect.signature(make).bind()
  except ValueError:  # no signature to check (a builtin): the call will tell
    pass
  except TypeError as e:
    raise ConfigError(f'{where} cannot be called without arguments: {e}') from None
  config = make()
  if not isinstance(config, Config):
    raise ConfigError(f'{where} returned {type(config).__name__}, not hetjax.run.Config')
  return config


def import_function(spec: str, what: str):
  """The function named by ``'package.module:function'``.

  Raises:
    ConfigError: when the module cannot be imported or has no such function.
  """
  module_name, _, function = spec.partition(':')
  _importable(pathlib.Path.cwd())  # a console entry's sys.path holds its bin directory, not cwd
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ConfigError(f'{what} {spec!r}: cannot import {module_name!r} ({e})') from None
  made = getattr(module, function, None)
  if not callable(made):
    raise ConfigError(f'{what} {spec!r}: {module_name!r} has no function {function!r}')
  return made


def _importable(directory: pathlib.Path) -> None:
  """Puts ``directory`` on the module search path (last, so that it never shadows an installed
  package): a config or model of the user's own imports from where it lives, with no
  ``PYTHONPATH`` set by hand."""
  if str(directory) not in sys.path and not any(
      p in ('', '.') and pathlib.Path.cwd() == directory for p in sys.path):
    sys.path.append(str(directory))
