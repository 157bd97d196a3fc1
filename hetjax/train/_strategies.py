"""Built-in parallel strategies, each a pair of logical-axis rule tables.

All strategies run on a 2-D mesh with axes ``('data', 'model')`` (`hetjax.sharding.DEFAULT_AXES`);
the mesh shape decides the degrees, the strategy decides what each axis splits.

| strategy          | batch split over     | parameters split                                  |
|-------------------|----------------------|---------------------------------------------------|
| ``data_parallel`` | data × model         | none (replicated)                                 |
| ``fsdp``          | data × model         | ``table``, else ``embed``, else the largest divisible dimension, over data × model |
| ``tensor_parallel`` | none (replicated)  | ``mlp``, ``heads``, ``vocab``, ``table`` over data × model |
| ``hybrid``        | data                 | ``mlp``, ``heads``, ``vocab``, ``table`` over model |

FSDP shards every parameter, named or not: one that names no ``table`` or ``embed`` dimension is
split along its largest dimension that the device count divides (the first of equal ones), and
replicated only when none divides (`LogicalRules.fallback`).
"""

from __future__ import annotations

import enum

from hetjax._errors import parse_choice
from hetjax.sharding import LogicalRules, ShardingRules

_ALL = ('data', 'model')
_MODEL_PARALLEL_AXES = ('mlp', 'heads', 'vocab', 'table')


class Strategy(enum.Enum):
  """A named built-in parallel strategy; `rules()` gives its logical-axis rules."""

  DATA_PARALLEL = 'data_parallel'
  FSDP = 'fsdp'
  TENSOR_PARALLEL = 'tensor_parallel'
  HYBRID = 'hybrid'

  @classmethod
  def parse(cls, name: str | Strategy) -> Strategy:
    """``'hybrid'`` → `Strategy.HYBRID`; a clear `ConfigError` for an unknown name."""
    return parse_choice(cls, name, 'strategy')

  @classmethod
  def describe(cls, rules: ShardingRules) -> str:
    """``'strategy hybrid'``: the strategy whose rules ``rules`` are (for an error message),
    or ``'these rules'``."""
    return next((f'strategy {s.value}' for s in cls if s.rules() == rules), 'these rules')

  def rules(self) -> ShardingRules:
    if self is Strategy.DATA_PARALLEL:
      return ShardingRules(params=LogicalRules(), compute=LogicalRules.of({'batch': _ALL}))
    if self is Strategy.FSDP:
      return ShardingRules(
          params=LogicalRules.of({'table': _ALL, 'embed': _ALL}, fallback=_ALL),
          compute=LogicalRules.of({'batch': _ALL}))
    if self is Strategy.TENSOR_PARALLEL:
      tp = LogicalRules.of({name: _ALL for name in _MODEL_PARALLEL_AXES})
      return ShardingRules(params=tp, compute=tp)
    if self is Strategy.HYBRID:
      tp = {name: 'model' for name in _MODEL_PARALLEL_AXES}
      return ShardingRules(
          params=LogicalRules.of(tp), compute=LogicalRules.of({'batch': 'data', **tp}))
    raise AssertionError(self)
