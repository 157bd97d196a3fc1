"""A run's configuration: `Config`, one frozen dataclass of sections (`hetjax.run._sections`),
and ``key=value`` overrides with a "did you mean" for a mistyped key.

  config = Config(model=ModelConfig('mlp', {'hidden': 64}), data=DataConfig(global_batch=64))
  config = override(config, ['optimizer.learning_rate=0.01', 'mesh=1x1'])

A key is dotted (``optimizer.learning_rate``) or one of the flat names the options had before
they were grouped (``learning_rate``, ``checkpoint_every``; `FLAT_NAMES`). A bare name that two
sections share is refused, naming both (``schedule``: ``optimizer.schedule`` or
``pipeline.schedule``). A mapping field takes one entry at a time (``model.args.hidden=64``,
``parallelism.rules.kv=model``, or flat ``model_args.hidden``, ``rules.kv``), and
``parallelism.rules`` also a whole mapping. Values are Python literals checked against the
field's type; a bare word is text.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from hetjax import ConfigError
from hetjax.run._sections import (
  AMBIGUOUS,
  FLAT_FORM,
  FLAT_NAMES,
  SECTIONS,
  BalanceConfig,
  CheckpointConfig,
  DataConfig,
  EmulationConfig,
  EvalConfig,
  LocalConfig,
  LoggingConfig,
  Mode,
  ModelConfig,
  OptimizerConfig,
  ParallelismConfig,
  ParameterServerConfig,
  PipelineConfig,
  SchmpConfig,
)

__all__ = ['Config', 'Mode', 'override']


@dataclasses.dataclass(frozen=True)
class Config:
  """One experiment: every option of a run, in sections, each overridable with ``--set``.

  Example (a shipped config, `hetjax.configs.mlp`)::

    Config(model=ModelConfig('mlp', {'hidden': 256, 'width': 128}),
           data=DataConfig(global_batch=256),
           optimizer=OptimizerConfig('adam', learning_rate=3e-3, steps=200),
           parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
           logging=LoggingConfig(every=20), checkpoint=CheckpointConfig(every=100))

  ``model`` may be given as a name alone (``Config(model='mlp')``).

  Attributes:
    model: the model (`ModelConfig`).
    data: the global batch and the seed (`DataConfig`).
    optimizer: the optimizer, its schedule, clipping, weight decay, gradient accumulation and
      the run's steps (`OptimizerConfig`).
    parallelism: the mode, strategy, mesh or plan (`ParallelismConfig`).
    balance: per-worker shares: the policy, fixed shares, buckets, tokens (`BalanceConfig`).
    pipeline: stages, micro-batches, schedule, the replicas' sync (`PipelineConfig`).
    schmp: scheduled model parallelism (`SchmpConfig`).
    ps: parameter servers (`ParameterServerConfig`).
    emulation: hosts of known speed and emulated links (`EmulationConfig`).
    checkpoint: checkpoints (`CheckpointConfig`).
    logging: progress lines, TensorBoard, MFU's peak (`LoggingConfig`).
    eval: periodic evaluation on the held-out split (`EvalConfig`).
    local: local SGD (DiLoCo) under mode shares (`LocalConfig`).
  """

  model: ModelConfig
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  parallelism: ParallelismConfig = dataclasses.field(default_factory=ParallelismConfig)
  balance: BalanceConfig = dataclasses.field(default_factory=BalanceConfig)
  pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
  schmp: SchmpConfig = dataclasses.field(default_factory=SchmpConfig)
  ps: ParameterServerConfig = dataclasses.field(default_factory=ParameterServerConfig)
  emulation: EmulationConfig = dataclasses.field(default_factory=EmulationConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
  eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
  local: LocalConfig = dataclasses.field(default_factory=LocalConfig)

  def __post_init__(self):
    if isinstance(self.model, str):
      object.__setattr__(self, 'model', ModelConfig(self.model))
    for name, cls in SECTIONS.items():
      if not isinstance(getattr(self, name), cls):
        raise ConfigError(f'Config.{name} must be a {cls.__name__}, got '
                          f'{type(getattr(self, name)).__name__}')

  def to_json(self) -> dict[str, Any]:
    """``{section: {field: value}}``, as a run directory's ``config.json`` holds it."""
    out = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
    out['model']['args'] = dict(self.model.args)
    return out

  @classmethod
  def from_json(cls, data: Mapping[str, Any], where: str = 'config') -> Config:
    """The config `to_json` wrote (also the flat form of older run directories).

    Raises:
      ConfigError: for a section or field this version does not know, or a refused value.
    """
    if not isinstance(data, Mapping):
      raise ConfigError(f'{where}: a config must be a JSON object, got {type(data).__name__}')
    if 'model' in data and not isinstance(data['model'], Mapping):  # the flat form
      unknown = sorted(set(data) - set(FLAT_FORM))
      if unknown:
        raise ConfigError(f'{where}: unknown config field {unknown[0]!r}{_hint(unknown[0])}')
      nested: dict[str, dict] = {}
      for key, value in data.items():
        section, field = FLAT_FORM[key].split('.')
        nested.setdefault(section, {})[field] = value
      data = nested
    sections = {}
    for name, values in data.items():
      if name not in SECTIONS:
        raise ConfigError(f'{where}: unknown config section {name!r}{_hint(name)}')
      if not isinstance(values, Mapping):
        raise ConfigError(f'{where}: section {name!r} must be an object')
      known = {f.name for f in dataclasses.fields(SECTIONS[name])}
      unknown = sorted(set(values) - known)
      if unknown:
        key = f'{name}.{unknown[0]}'
        raise ConfigError(f'{where}: unknown config field {key!r}{_hint(key)}')
      try:
        sections[name] = SECTIONS[name](**{
            k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
      except TypeError as e:
        raise ConfigError(f'{where}: section {name!r}: {e}') from None
    if 'model' not in sections:
      raise ConfigError(f'{where}: no model section')
    return cls(**sections)


def keys() -> list[str]:
  """Every key `override` takes: the dotted names and the flat ones."""
  return sorted([f'{s}.{f.name}' for s, cls in SECTIONS.items()
                 for f in dataclasses.fields(cls)] + list(FLAT_NAMES))


def _either(keys: tuple[str, ...], quote: bool = False) -> str:
  """``'a or b'``, ``'a, b or c'``."""
  keys = tuple(repr(k) if quote else k for k in keys)
  return f'{", ".join(keys[:-1])} or {keys[-1]}' if len(keys) > 1 else keys[0]


def _hint(key: str) -> str:
  """``'; did you mean …?'`` naming the closest key, or nothing."""
  candidates = keys() + list(SECTIONS) + list(AMBIGUOUS)
  close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
  if not close:  # a right field under a wrong section: match on the field alone
    field = key.rpartition('.')[2]
    close = [k for k in keys() if '.' in k and k.rpartition('.')[2] == field][:1]
  if close and close[0] in AMBIGUOUS:  # a bare name two sections share: name them all
    return f'; did you mean {_either(AMBIGUOUS[close[0]], quote=True)}?'
  return f'; did you mean {close[0]!r}?' if close else ''


@functools.cache
def _types(section: str) -> dict[str, Any]:
  """Each field of a section → its type."""
  return typing.get_type_hints(SECTIONS[section])


def _is_mapping(section: str, field: str) -> bool:
  return typing.get_origin(_types(section)[field]) in (Mapping, dict)


def _field(key: str) -> tuple[str, str] | None:
  """(section, field) of a dotted or flat key naming a field, else None."""
  section, _, field = FLAT_NAMES.get(key, key).partition('.')
  if section in SECTIONS and field in _types(section):
    return section, field
  return None


def _resolve(key: str) -> tuple[str, str, str | None]:
  """(section, field, entry or None) of an override key: the entry is the name set in a mapping
  field (``model.args.hidden``, ``rules.kv``).

  Raises:
    ConfigError: an ambiguous bare name (naming each key it could be), or an unknown key (with
      the closest known one).
  """
  if key in AMBIGUOUS:
    raise ConfigError(f'override {key!r} is ambiguous: {_either(AMBIGUOUS[key])}')
  found = _field(key)
  if found == ('model', 'args'):
    raise ConfigError('override model.args: set one argument at a time, '
                      'model.args.NAME=value')
  if found:
    return *found, None
  base, _, entry = key.rpartition('.')
  found = _field(base) if base and entry else None
  if found and _is_mapping(*found):
    return *found, entry
  raise ConfigError(f'override {key!r}: unknown key{_hint(key)} (keys are section.field, e.g. '
                    'optimizer.learning_rate, or section.field.NAME for one entry of a mapping, '
                    'e.g. model.args.hidden)')


def _allowed(section: str, field: str) -> tuple[type, ...]:
  """The types a field's value may have."""
  hint = _types(section)[field]
  args = typing.get_args(hint)
  if typing.get_origin(hint) is tuple:
    return (tuple,)
  if _is_mapping(section, field):
    return (Mapping,)
  if args:  # X | None, tuple[...] | None
    return tuple(tuple if typing.get_origin(a) is tuple else typing.get_origin(a) or a
                 for a in args)
  return (hint,)


def _literal(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    word = text.strip().lower()  # a bare word is a string; true / false as absl's flags take
    return (word == 'true') if word in ('true', 'false') else text


def _typed(key: str, text: str, allowed: tuple[type, ...]) -> Any:
  """``text`` as a value of one of the ``allowed`` types (module docstring)."""
  value = _literal(text)
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
    names = ' or '.join('None' if t is type(None) else 'a tuple of ints' if t is tuple else
                        'a mapping' if t is Mapping else t.__name__ for t in allowed)
    raise ConfigError(f'override {key}={text!r}: expected {names}, got {type(value).__name__}')
  return value


def _entry(section: str, key: str, text: str, current: Any) -> Any:
  """A mapping entry's value: a literal (its section checks it), a model argument's of the type
  of the value it replaces (if any)."""
  value = _literal(text)
  if section != 'model' or current is None:
    return value
  if isinstance(value, type(current)) and isinstance(value, bool) == isinstance(current, bool):
    return value
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  raise ConfigError(
      f'override {key}={text!r}: expected {type(current).__name__}, got {type(value).__name__}')


def override(config: Config, assignments: Sequence[str]) -> Config:
  """Applies ``key=value`` assignments (module docstring).

  Raises:
    ConfigError: for a malformed assignment, an unknown key (with the closest known one), or a
      value of the wrong type or refused by its section.
  """
  for assignment in assignments:
    key, sep, text = assignment.partition('=')
    key = key.strip()
    if not sep or not key:
      raise ConfigError(f'override {assignment!r} is not of the form key=value')
    section, field, entry = _resolve(key)
    part = getattr(config, section)
    if entry is None:
      value = _typed(key, text, _allowed(section, field))
    else:
      mapping = getattr(part, field)
      value = {**mapping, entry: _entry(section, key, text, mapping.get(entry))}
    try:
      part = dataclasses.replace(part, **{field: value})
    except TypeError as e:  # a comparison in a section's check with a value of another type
      raise ConfigError(f'override {key}={text!r}: {e}') from None
    config = dataclasses.replace(config, **{section: part})
  return config
