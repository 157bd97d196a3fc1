"""The names a config's enumerated options take, free of JAX, so that a `Config` section checks
them where it is built (a mistyped strategy fails at ``--set``, not minutes later at build).

Each list spells out the library's own enum (`hetjax.train.Strategy`,
`hetjax.balance.PolicyName`, `hetjax.train.Optimizer`, `hetjax.replicas.SyncName`, …), and
``tests/test_config_fields.py`` checks that each equals it, so the two cannot drift. This module
imports the standard library and `hetjax._errors` only.

A section field declares its names with `choice`; the section's ``__post_init__`` checks them all
with `check_choices`, and a name that is not one of them is one line naming the closest::

  >>> choose('gpipe2', PIPELINE_SCHEDULES, 'pipeline.schedule')
  Traceback (most recent call last):
  hetjax._errors.ConfigError: unknown pipeline.schedule 'gpipe2'; did you mean 'gpipe'? choose
  one of: gpipe, 1f1b
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hetjax._errors import ConfigError

#: `hetjax.train.Strategy`: the built-in parallel strategies.
STRATEGIES = ('data_parallel', 'fsdp', 'tensor_parallel', 'hybrid')
#: `hetjax.balance.PolicyName`: the share policies, LB-BSP's named with its predictor.
POLICIES = ('uniform', 'proportional', 'oracle', 'lbbsp', 'lbbsp-last', 'lbbsp-ewma', 'lbbsp-ar',
            'lbbsp-narx', 'lbbsp-regime', 'lbbsp-gpu')
#: `hetjax.train.Optimizer`.
OPTIMIZERS = ('sgd', 'momentum', 'adam', 'adamw')
#: The learning-rate schedules of `hetjax.train.learning_rate_schedule`.
LR_SCHEDULES = ('constant', 'cosine', 'linear')
#: The pipeline schedules by name (`hetjax.pipeline.PipelineTrainer`'s ``schedule``).
PIPELINE_SCHEDULES = ('gpipe', '1f1b')
#: `hetjax.replicas.SyncName`: the policies that group pipeline replicas.
SYNC_NAMES = ('all-reduce', 'random-pairs', 'periodic-average', 'sdpipe')
#: Sync names of before → today's (`hetjax.replicas.RENAMED_SYNC_NAMES`).
RENAMED_SYNC_NAMES = {'ad-psgd': 'random-pairs', 'ps': 'periodic-average'}
#: `hetjax.ps.Consistency`: a parameter server's modes.
PS_CONSISTENCIES = ('bsp', 'asp', 'ssp')
#: `hetjax.ps.LrRule`: a parameter server's ``lr=`` option.
PS_LR_RULES = ('constant', 'staleness')
#: `hetjax.train.OverlapEstimate`: what the overlapped step's estimate starts from.
OVERLAP_ESTIMATES = ('own', 'int8')
#: The compute and parameter dtypes (`hetjax.models.gpt.DTYPES`).
DTYPES = ('float32', 'bfloat16', 'float16')
#: Rematerialisation of a model's blocks (`hetjax.models.gpt.Remat`).
REMATS = ('none', 'full', 'save_dots')
#: `hetjax.train.Granularity`: how a worker computes a share size it has no program of.
GRANULARITIES = ('compile', 'micro', 'auto')


def closest(value: str, names: Sequence[str]) -> str | None:
  """The name ``value`` most likely misspells (case aside first, then `difflib`'s closest), or
  None."""
  same = [n for n in names if n.lower() == value.lower()]
  return (same or difflib.get_close_matches(value, names, n=1) or [None])[0]


def _hint(value: Any, names: Sequence[str]) -> str:
  near = closest(value, names) if isinstance(value, str) else None
  return f'; did you mean {near!r}?' if near else ';'


def choose(value: Any, names: Sequence[str], what: str, *, note: str = '',
           renamed: Mapping[str, str] | None = None) -> str:
  """``value`` if it is one of ``names`` (an enum member counts as its value), else a one-line
  `ConfigError` naming the closest.

  Args:
    value: the name given.
    names: the names there are.
    what: what is named, for the message (``'parallelism.strategy'``).
    note: said after the list, e.g. ``" (or None: the model's default)"``.
    renamed: names of before → today's: an old name says its new one.

  Example::

    >>> choose('cosin', LR_SCHEDULES, 'optimizer.schedule')
    ConfigError: unknown optimizer.schedule 'cosin'; did you mean 'cosine'? choose one of:
    constant, cosine, linear
  """
  if isinstance(value, enum.Enum):
    value = value.value
  if isinstance(value, str) and value in names:
    return value
  known = f'choose one of: {", ".join(names)}{note}'
  if isinstance(value, str) and value in (renamed or {}):
    raise ConfigError(f'{what} {value!r} is now {renamed[value]!r} (named for what it does); '
                      f'{known}')
  raise ConfigError(f'unknown {what} {value!r}{_hint(value, names)} {known}')


def choice(default: str | None, names: Sequence[str], *, note: str = '',
           renamed: Mapping[str, str] | None = None,
           parse: Callable[[str, str], Any] | None = None) -> Any:
  """A section field (`dataclasses.field`) that takes one of ``names`` (`check_choices`).

  Args:
    default: the field's default; None: None is allowed too (a default chosen elsewhere).
    names: the names there are.
    note: added to the message's list (`choose`).
    renamed: old names (`choose`).
    parse: instead of a name, a text form ``parse(value, what)`` checks (its first word one of
      ``names``), e.g. `ps_protocol`.

  Example::

    strategy: str = choice('hybrid', STRATEGIES)
  """
  return dataclasses.field(default=default, metadata={
      'choices': tuple(names), 'note': note, 'renamed': dict(renamed or {}), 'parse': parse})


def check_choices(section: Any) -> None:
  """Checks every field of ``section`` (a frozen section dataclass with a ``NAME``) declared with
  `choice`, named ``NAME.field`` in the message; an enum member given is kept as its value.

  Raises:
    ConfigError: a name that is not one of the field's, in one line naming the closest.
  """
  for field in dataclasses.fields(section):
    if 'choices' not in field.metadata:
      continue
    value, meta = getattr(section, field.name), field.metadata
    what = f'{section.NAME}.{field.name}'
    if value is None and field.default is None:
      continue
    if meta['parse'] is not None:
      meta['parse'](value, what)
      continue
    object.__setattr__(section, field.name, choose(value, meta['choices'], what,
                                                   note=meta['note'], renamed=meta['renamed']))


#: The options after a parameter server's mode (`ps_protocol`).
PS_OPTIONS = ('eager', 'lr', 'dc', 'max_staleness')


def ps_protocol(spec: Any, what: str = 'ps.protocol') -> dict[str, Any]:
  """A parameter server's protocol text (``'bsp'``, ``'asp,eager,lr=staleness'``,
  ``'ssp:2'``) checked as `hetjax.ps.parse_ps` checks it, without JAX: `hetjax.ps.PsConfig`'s
  fields, enums as their values (``tests/test_config_fields.py`` checks the two agree).

  Example::

    >>> ps_protocol('ssp:2,lr=staleness')
    {'consistency': 'ssp', 'bound': 2, 'eager': False, 'lr_rule': 'staleness',
     'dc_lambda': None, 'max_staleness': None}

  Raises:
    ConfigError: in one line, naming the closest mode or option to a mistyped one.
  """
  if not isinstance(spec, str):
    raise ConfigError(f"{what} must be text like 'asp,eager', got {type(spec).__name__}")
  head, *options = [p.strip() for p in spec.strip().split(',')]
  name, _, bound = head.partition(':')
  out = {'consistency': choose(name, PS_CONSISTENCIES, f'{what} mode'), 'bound': 0,
         'eager': False, 'lr_rule': 'constant', 'dc_lambda': None, 'max_staleness': None}
  if bound:
    if out['consistency'] != 'ssp':
      raise ConfigError(f'{what} {head!r}: only ssp takes a bound (ssp:BOUND)')
    out['bound'] = _number(int, bound, f'{what}: the ssp bound')
  elif out['consistency'] == 'ssp':
    raise ConfigError(f'{what}: ssp needs its bound, e.g. ssp:2')
  for option in options:
    key, eq, value = option.partition('=')
    if key == 'eager' and not eq:
      out['eager'] = True
    elif key == 'lr' and eq:
      out['lr_rule'] = choose(value, PS_LR_RULES, f'{what} lr rule')
    elif key == 'dc':
      out['dc_lambda'] = _number(float, value, f'{what}: dc lambda') if eq else 0.04
    elif key == 'max_staleness' and eq:
      out['max_staleness'] = _number(int, value, f'{what}: max_staleness')
    else:
      raise ConfigError(f'unknown {what} option {option!r}{_hint(key, PS_OPTIONS)} expected '
                        'eager, lr=constant|staleness, dc[=LAMBDA] or max_staleness=N')
  if out['consistency'] == 'bsp' and out['eager']:
    raise ConfigError(f'{what} {spec!r}: eager pull needs asp or ssp: under bsp every worker '
                      'waits for the round anyway')
  if out['consistency'] == 'bsp' and (out['lr_rule'] == 'staleness' or out['dc_lambda']):
    raise ConfigError(f'{what} {spec!r}: bsp gradients are never stale: lr=staleness and dc= '
                      'need asp or ssp')
  return out


def _number(kind: type, text: str, what: str) -> int | float:
  """``text`` as a finite ``kind`` >= 0 (`hetjax.ps.PsConfig`'s bound, dc lambda and
  max_staleness)."""
  try:
    value = kind(text)
  except ValueError:
    raise ConfigError(f'{what} {text!r} is not {"an integer" if kind is int else "a number"}'
                      ) from None
  if not math.isfinite(value) or value < 0:
    raise ConfigError(f'{what} must be >= 0, got {text}')
  return value
