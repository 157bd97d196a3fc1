"""The apps by name: ``make_app('lasso', scheduler='shotgun', lam=0.1)``.

Each app lives in its own module and is imported only when asked for; its factory takes the
scheduler's name (a baseline may change the round as well as the schedule) and the app's own
arguments, checked against its signature (one line if they do not fit).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from hetjax._errors import ConfigError
from hetjax.schmp._app import App

#: name → (module, factory)
APPS = {
    'lasso': ('hetjax.schmp._lasso', 'make_lasso'),
    'logreg': ('hetjax.schmp._logreg', 'make_logreg'),
    'mf': ('hetjax.schmp._mf', 'make_mf'),
    'lda': ('hetjax.schmp._lda', 'make_lda'),
    'svm': ('hetjax.schmp._svm', 'make_svm'),
    'cdmf': ('hetjax.schmp._cdmf', 'make_cdmf'),
}


def make_app(name: str, scheduler: str = 'schmp', **kwargs: Any) -> App:
  """The app ``name`` run by ``scheduler``, made with ``kwargs``.

  Raises:
    ConfigError: an unknown app, an argument the app does not take, or what the app itself
      refuses (λ ≤ 0, an unknown scheduler, shapes that do not divide …).
  """
  if name not in APPS:
    raise ConfigError(f'unknown SchMP app {name!r}; choose one of: {", ".join(APPS)}')
  module, function = APPS[name]
  factory = getattr(importlib.import_module(module), function)
  try:
    inspect.signature(factory).bind(scheduler=scheduler, **kwargs)
  except TypeError as e:
    raise ConfigError(f'app {name!r}: {e}') from None
  return factory(scheduler=scheduler, **kwargs)
