"""A run's configuration: `Config`, `Mode`, and loading a shipped config (`hetjax.configs`, one
module per model, each with ``get_config() -> Config``), a file of yours or ``module:function``.

A config is a frozen dataclass. Flags override single fields with ``--set key=value``, dotted for
model arguments (``--set model_args.rows=1000000``); values are Python literals checked against
the type of the field or of the value they replace.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import sys
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from hetjax import ConfigError
from hetjax._errors import parse_choice
from hetjax.pipeline._policies import parse_sync_name
from hetjax.ps import parse_ps


class Mode(enum.Enum):
  """How a step runs (`Config.mode`).

  ``auto`` is ``schmp`` for a SchMP app (`hetjax.schmp.APPS`), ``ps`` in a job with parameter
  servers (``launch --servers K``), ``plan`` when a plan is given, else ``spmd`` on one process
  and ``shares`` under several workers.
  """

  AUTO = 'auto'
  SPMD = 'spmd'          # one jitted step over one mesh (`hetjax.train.Trainer`)
  SHARES = 'shares'      # per-worker batch shares, re-sized by a policy (LB-BSP)
  TOKENS = 'tokens'      # Fela's tokens: workers pull fixed-size pieces of the batch
  PIPELINE = 'pipeline'  # stages on device groups, GPipe / 1F1B (`hetjax.pipeline`)
  PLAN = 'plan'          # a Fela plan: a layout and device group per sub-model (`compile_plan`)
  SCHMP = 'schmp'        # scheduled model parallelism: rounds over parameter blocks (`hetjax.schmp`)
  PS = 'ps'              # a parameter server: ``launch --servers K`` (`hetjax.ps`)


@dataclasses.dataclass(frozen=True)
class Config:
  """One experiment: every option of a run is a field, overridable with ``--set key=value``.

  Attributes:
    model: a name in `models.NAMES`, or ``'module:function'`` returning a `hetjax.train.Task`
      (called with ``model_args``): a model of your own; or a SchMP app (`hetjax.schmp.APPS`:
      ``lasso``, ``logreg``, ``mf``, ``lda``), trained in mode ``schmp``.
    model_args: keyword arguments of that model's ``make_task`` (or of the app's factory).
    global_batch: examples per step, over all devices and workers.
    optimizer: a `hetjax.train.Optimizer` name.
    learning_rate: the optimizer's step size.
    steps: total optimizer steps of the run.
    seed: parameter initialisation and data order.
    mode: a `Mode` value: how a step runs.
    strategy: a `hetjax.train.Strategy` name (spmd, and inside each worker).
    mesh: mesh shape over ``('data', 'model')``, e.g. ``'4x2'``; per worker in the
      multi-worker modes.
    plan: a plan JSON (`experiments/plan.py --json`, `hetjax/configs/plans/`) replacing strategy
      and mesh (mode plan): a layout and a group of workers per sub-model, compiled and
      memory-checked first; one SPMD step when every sub-model runs on all devices of one
      process, else pipeline stages on the groups (``micro_batches``, ``schedule``).
    policy: the share policy (shares mode): uniform, proportional, lbbsp[-last|-ewma|-ar|-narx],
      lbbsp-gpu, oracle.
    shares: fixed per-worker shares instead of a policy, e.g. ``(192, 64)``.
    bucket: shares are multiples of it; 0 picks a divisor of the global batch near 1/16 of a
      uniform share.
    memory_caps: most rows each worker can hold per step (bucket multiples), or None.
    slowdown: the emulated hosts' slowdown trace (`hetjax.emulation.parse_trace`), e.g.
      ``'static:1,1,1,3'``; None: the launcher's ``--slowdown``, else none.
    host_row_s: seconds per row of an undisturbed emulated host; 0 calibrates it at start.
    token_rows: rows per token (tokens mode); 0 picks X / (4 × workers) rounded to a divisor.
    endgame: tokens mode: a slow worker leaves the last tokens to faster ones.
    stages: pipeline stages (pipeline mode).
    micro_batches: micro-batches per step (pipeline mode, and plans that train as stages).
    schedule: the pipeline schedule: ``'1f1b'`` or ``'gpipe'`` (likewise).
    sync: pipeline mode under several workers (one replica each): the sync policy that groups
      the replicas, ``'sdpipe'``, ``'all-reduce'``, ``'random-pairs'`` or
      ``'periodic-average'`` (`hetjax.pipeline.make_sync_policy`).
    sync_overlap: pipeline replicas average one step late, overlapped with the next step's
      compute (`hetjax.pipeline.ReplicaDriver`'s ``overlap``); False syncs before the next step.
    scheduler: mode schmp: the app's scheduler, ``'schmp'`` (dynamic for Lasso and logistic
      regression, a static rotation for MF and LDA) or a baseline's name (``'shotgun'``,
      ``'cyclic'``, ``'unscheduled'`` …, as the app lists them).
    schedule_size: mode schmp: parameter blocks a round updates (None: the app's default for
      the device count; must be >= 1).
    staleness: mode schmp: rounds old the information each round's schedule comes from (0:
      exact, no overlap of scheduling with the devices' work).
    objective_every: mode schmp: rounds between objective evaluations.
    ps: mode ps: the parameter server's protocol (`hetjax.ps.parse_ps`), e.g. ``'bsp'``,
      ``'asp,eager,lr=staleness'`` or ``'ssp:2'``.
    network: emulated links (`hetjax.emulation.parse_links`), e.g. ``'link:1:100'``: the
      shares mode's all-reduce and the parameter server's pushes and pulls take that long;
      None: the launcher's ``--network``, else none.
    overlap: mode shares: the all-reduce scheduler (`hetjax.train.OverlapTrainer`): each step's
      all-reduce runs under the next step's gradient; False: the exact synchronous step.
    bucket_bytes: with ``overlap``, the largest gradient bucket each all-reduce carries (0: one
      fused buffer).
    log_every: steps between progress lines (and metric flushes).
    checkpoint_every: steps between checkpoints (a checkpoint is also written at the end).
    checkpoint_async: write checkpoints in the background (orbax's asynchronous save); False:
      a save completes before the next step, so a failure loses at most ``checkpoint_every``
      steps (with background saves, also the steps run while the last save was written).
    compilation_cache: keep compiled programs across runs (~/.cache/hetjax/jax).
  """

  model: str
  model_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  global_batch: int = 256
  optimizer: str = 'adam'
  learning_rate: float = 1e-3
  steps: int = 100
  seed: int = 0
  mode: str = 'auto'
  strategy: str = 'hybrid'
  mesh: str = '4x2'
  plan: str | None = None
  policy: str = 'uniform'
  shares: tuple[int, ...] | None = None
  bucket: int = 0
  memory_caps: tuple[int, ...] | None = None
  slowdown: str | None = None
  host_row_s: float = 0.0
  token_rows: int = 0
  endgame: bool = True
  stages: int = 2
  micro_batches: int = 2
  schedule: str = '1f1b'
  sync: str = 'sdpipe'
  sync_overlap: bool = False
  scheduler: str = 'schmp'
  schedule_size: int | None = None
  staleness: int = 1
  objective_every: int = 1
  ps: str = 'asp'
  network: str | None = None
  overlap: bool = False
  bucket_bytes: int = 0
  log_every: int = 10
  checkpoint_every: int = 50
  checkpoint_async: bool = True
  compilation_cache: bool = True

  def __post_init__(self):
    for name in ('global_batch', 'steps', 'log_every', 'checkpoint_every', 'stages',
                 'micro_batches', 'objective_every'):
      if getattr(self, name) < 1:
        raise ConfigError(f'{name} must be >= 1, got {getattr(self, name)}')
    for name in ('bucket', 'token_rows', 'bucket_bytes'):
      if getattr(self, name) < 0:
        raise ConfigError(f'{name} must be >= 0 (0: automatic), got {getattr(self, name)}')
    if self.schedule_size is not None and self.schedule_size < 1:
      raise ConfigError(f'schedule_size must be >= 1 (or None: the app\'s default), got '
                        f'{self.schedule_size}')
    if self.staleness < 0:
      raise ConfigError(f'staleness must be >= 0 (0: exact), got {self.staleness}')
    parse_choice(Mode, self.mode, 'mode')
    parse_sync_name(self.sync)
    parse_ps(self.ps)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self) | {'model_args': dict(self.model_args)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any], where: str = 'config') -> Config:
    """The config `to_json` wrote (a run directory's ``config.json``).

    Raises:
      ConfigError: for a field this version does not know, or a value it refuses.
    """
    if not isinstance(data, Mapping):
      raise ConfigError(f'{where}: a config must be a JSON object, got {type(data).__name__}')
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
      raise ConfigError(f'{where}: unknown config field {unknown[0]!r}')
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    try:
      return cls(**values)
    except TypeError as e:
      raise ConfigError(f'{where}: {e}') from None


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


def _allowed(key: str) -> tuple[type, ...] | None:
  """The types a field's value may have (None: not a top-level typed field)."""
  hint = typing.get_type_hints(Config).get(key)
  if hint is None:
    return None
  args = typing.get_args(hint)
  if typing.get_origin(hint) is tuple:
    return (tuple,)
  if args:  # X | None
    return tuple(typing.get_origin(a) or a for a in args)
  return (hint,)


def _parse_value(key: str, text: str, current: Any) -> Any:
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    word = text.strip().lower()  # a bare word is a string; true / false as absl's flags take
    value = (word == 'true') if word in ('true', 'false') else text
  allowed = _allowed(key) if '.' not in key else None
  if allowed is not None:
    if isinstance(value, list):
      value = tuple(value)
    if tuple in allowed and isinstance(value, int) and not isinstance(value, bool):
      value = (value,)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    if str in allowed and not isinstance(value, str) and value is not None:
      value = text.strip()  # e.g. a mesh '4x2' or a slowdown 'static:1,3' always stays text
    ok = any(isinstance(value, t) and (t is not int or not isinstance(value, bool))
             for t in allowed if t is not type(None)) or (value is None and type(None) in allowed)
    if tuple in allowed and isinstance(value, tuple) and not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value):
      ok = False
    if not ok:
      names = ' or '.join('None' if t is type(None) else
                          'a tuple of ints' if t is tuple else t.__name__ for t in allowed)
      raise ConfigError(f'override {key}={text!r}: expected {names}, got {type(value).__name__}')
    return value
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
      try:
        config = dataclasses.replace(
            config, **{key: _parse_value(key, text, getattr(config, key))})
      except TypeError as e:  # a comparison in __post_init__ with a value of another type
        raise ConfigError(f'override {key}={text!r}: {e}') from None
    else:
      raise ConfigError(
          f'override {key!r}: unknown field; fields are {", ".join(sorted(fields))} '
          f'(model arguments as model_args.NAME)')
  return config
