"""How a parameter server synchronises: `PsConfig` and its text form.

Consistency models (``consistency``, `Consistency`):

* ``bsp``: the server waits for every worker's gradient of version v, applies their mean (rows
  weighted: the gradient of the global batch, exactly one device's step) and publishes v + 1;
  workers pull v + 1 before their next step.
* ``asp``: every push is applied when it arrives, with the staleness τ it has (the server's
  version at apply less the version the gradient was computed from).
* ``ssp``: as asp, but a worker may be at most ``bound`` pushes ahead of the slowest worker
  (its pull waits until the slowest catches up).

``eager`` (asp, ssp): the worker's communication (push, then at once a pull of the newest
version) runs on a thread while its next gradient computes, so a step costs max(compute,
communication) instead of their sum, for gradients one own step staler. ``lr_rule``: 'constant'
applies every update at the optimizer's rate; 'staleness' scales it by 1 / max(1, τ) (Zhang et
al.'s η / τ). ``dc_lambda``: DC-ASGD's delay compensation g + λ g ⊙ g ⊙ (w_now − w_then) (Zheng
et al. 2017); None: off. ``max_staleness``: pushes staler than this many versions are refused
and counted, never applied (None: no limit; ssp's default is (bound + 1) × workers).

Text form (`parse_ps`): ``bsp``, ``asp``, ``ssp:BOUND``, with options after commas:
``asp,eager,lr=staleness,dc=0.04,max_staleness=12``.
"""

from __future__ import annotations

import dataclasses
import enum

from hetjax._checks import at_least, number
from hetjax._errors import ConfigError, parse_choice


class Consistency(enum.Enum):
  """A parameter server's consistency model (module docstring)."""

  BSP = 'bsp'
  ASP = 'asp'
  SSP = 'ssp'


class LrRule(enum.Enum):
  CONSTANT = 'constant'
  STALENESS = 'staleness'


@dataclasses.dataclass(frozen=True)
class PsConfig:
  """A parameter server's protocol (module docstring)."""

  consistency: Consistency = Consistency.ASP
  bound: int = 0
  eager: bool = False
  lr_rule: LrRule = LrRule.CONSTANT
  dc_lambda: float | None = None
  max_staleness: int | None = None

  def __post_init__(self):
    if self.consistency is Consistency.BSP and self.eager:
      raise ConfigError('eager pull needs asp or ssp: under bsp every worker waits for the '
                        'round anyway')
    if self.consistency is Consistency.BSP and (self.lr_rule is LrRule.STALENESS or self.dc_lambda):
      raise ConfigError('bsp gradients are never stale: lr=staleness and dc= need asp or ssp')
    if self.consistency is not Consistency.SSP and self.bound:
      raise ConfigError(f'a staleness bound ({self.bound}) needs ssp')
    at_least(self.bound, 0, 'the ssp bound')
    if self.dc_lambda is not None:
      number(self.dc_lambda, 'dc lambda')
    if self.max_staleness is not None:
      at_least(self.max_staleness, 0, 'max_staleness')

  def refuse_above(self, workers: int) -> int | None:
    """The staleness (in versions) above which a push is refused."""
    if self.max_staleness is not None:
      return self.max_staleness
    return (self.bound + 1) * workers if self.consistency is Consistency.SSP else None

  def describe(self) -> str:
    parts = [self.consistency.value + (f':{self.bound}' if self.consistency is Consistency.SSP else '')]
    parts += ['eager'] if self.eager else []
    parts += [f'lr={self.lr_rule.value}'] if self.lr_rule is not LrRule.CONSTANT else []
    parts += [f'dc={self.dc_lambda:g}'] if self.dc_lambda is not None else []
    parts += [f'max_staleness={self.max_staleness}'] if self.max_staleness is not None else []
    return ','.join(parts)


def parse_ps(spec: str) -> PsConfig:
  """``'asp,eager,lr=staleness'`` → a `PsConfig` (module docstring); one-line errors."""
  head, *options = [p.strip() for p in spec.strip().split(',')]
  name, _, bound = head.partition(':')
  consistency = parse_choice(Consistency, name, 'parameter-server consistency')
  kwargs: dict = {'consistency': consistency}
  if bound:
    if consistency is not Consistency.SSP:
      raise ConfigError(f'{head!r}: only ssp takes a bound (ssp:BOUND)')
    kwargs['bound'] = _int(bound, 'ssp bound')
  elif consistency is Consistency.SSP:
    raise ConfigError('ssp needs its bound, e.g. ssp:2')
  for option in options:
    key, eq, value = option.partition('=')
    if key == 'eager' and not eq:
      kwargs['eager'] = True
    elif key == 'lr' and eq:
      kwargs['lr_rule'] = parse_choice(LrRule, value, 'lr rule')
    elif key == 'dc':
      kwargs['dc_lambda'] = _float(value, 'dc lambda') if eq else 0.04
    elif key == 'max_staleness' and eq:
      kwargs['max_staleness'] = _int(value, 'max_staleness')
    else:
      raise ConfigError(f'unknown parameter-server option {option!r}; expected eager, '
                        'lr=constant|staleness, dc[=LAMBDA] or max_staleness=N')
  return PsConfig(**kwargs)


def _int(text: str, what: str) -> int:
  try:
    return int(text)
  except ValueError:
    raise ConfigError(f'{what} {text!r} is not an integer') from None


def _float(text: str, what: str) -> float:
  try:
    return float(text)
  except ValueError:
    raise ConfigError(f'{what} {text!r} is not a number') from None
