"""Built-in parallel strategies, each a pair of logical-axis rule tables.

All strategies run on a 2-D mesh with axes ``('data', 'model')`` (`hetjax.sharding.DEFAULT_AXES`);
the mesh shape decides the degrees, the strategy decides what each axis splits.

| strategy          | batch split over     | parameters split                                  |
|-------------------|----------------------|---------------------------------------------------|
| ``data_parallel`` | data × model         | none (replicated)                                 |
| ``fsdp``          | data × model         | ``table``, else ``embed``, else the largest divisible dimension, over data × model |
| ``tensor_parallel`` | none (replicated)  | ``mlp``, ``heads``, ``vocab``, ``table`` over data × model |
| ``hybrid``        | data                 | ``mlp``, ``heads``, ``vocab``, ``table`` over model |

Both tensor-parallel tables split ``kv_heads`` (grouped-query attention's key and value heads)
with ``heads`` where their count divides the degree, and leave them whole where it does not
(`LogicalRules.optional`): one key/value head (multi-query) is replicated, never an error.

FSDP shards every parameter, named or not: one that names no ``table`` or ``embed`` dimension is
split along its largest dimension that the device count divides (the first of equal ones), and
replicated only when none divides (`LogicalRules.fallback`).

Each parameter table decides every name of `PARAMETER_AXES` (the names hetjax's models put on
their parameters), replicating those it does not split, so that a run's start-up line lists
only names a model brings of its own (`hetjax.sharding.unmapped_names`). A run's
``parallelism.rules`` go on top of both tables (``rules(extra)``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from hetjax._errors import ConfigError, parse_choice
from hetjax.sharding import DEFAULT_AXES, LogicalRules, ShardingRules

_ALL = ('data', 'model')
_MODEL_PARALLEL_AXES = ('mlp', 'heads', 'kv_heads', 'vocab', 'table')
#: Split where their count divides the degree, else whole: a model's key/value heads (grouped-query
#: attention has fewer of them than query heads, multi-query attention one).
_OPTIONAL_AXES = ('kv_heads',)
#: The logical names on the parameters of hetjax's models: every built-in table decides them.
PARAMETER_AXES = ('embed', 'mlp', 'heads', 'kv_heads', 'head_dim', 'vocab', 'table', 'seq',
                  'classes')


def _deciding(rules: LogicalRules) -> LogicalRules:
  """``rules`` with a replicating rule, last, for each of `PARAMETER_AXES` it does not name:
  the same layout, and a table that says so."""
  named = rules.named()
  return dataclasses.replace(
      rules, rules=rules.rules + tuple((n, ()) for n in PARAMETER_AXES if n not in named))


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
    ``'strategy hybrid with parallelism.rules'`` when `rules` put a run's rules on top of
    them, or ``'these rules'``."""
    given = rules.params.sources  # the names `overlay` put first, in order
    extra = {name: axes for (name, axes), _ in zip(rules.params.rules, given, strict=False)}
    given = given if all(set(axes) <= set(DEFAULT_AXES) for axes in extra.values()) else ()
    for s in cls:
      if s.rules() == rules:
        return f'strategy {s.value}'
      if given and s.rules(extra, given[0][1]) == rules:
        return f'strategy {s.value} with {given[0][1]}'
    return 'these rules'

  def rules(self, extra: Mapping[str, str | Sequence[str] | None] | None = None,
            source: str = 'parallelism.rules') -> ShardingRules:
    """The strategy's parameter and compute tables, with ``extra``'s rules on top of both.

    ``extra`` is ``{logical name: mesh axis, tuple of mesh axes, or None}`` (a run's
    ``parallelism.rules``); its rule for a name comes first, so it wins, and ``None``
    replicates the name whatever the strategy's rule was (`LogicalRules.overlay`).

    Example::

      Strategy.TENSOR_PARALLEL.rules({'heads': None})   # 'heads' replicated, 'mlp' split
      Strategy.HYBRID.rules({'kv': 'model'})           # a 'kv' dimension over 'model'

    Args:
      extra: rules given on top, or None.
      source: what to call ``extra`` in errors (a dimension it does not divide names
        ``parallelism.rules['kv']``).

    Raises:
      ConfigError: a rule of ``extra`` onto a mesh axis other than ``'data'`` and ``'model'``.
    """
    base = self._tables()
    if not extra:
      return base
    for name, axes in extra.items():
      for axis in (() if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)):
        if axis not in DEFAULT_AXES:
          raise ConfigError(f'{source}[{name!r}]: mesh axis {axis!r} is not an axis of the '
                            f'strategy mesh {DEFAULT_AXES}')
    return base.overlay(extra, source)

  def _tables(self) -> ShardingRules:
    if self is Strategy.DATA_PARALLEL:
      return ShardingRules(params=_deciding(LogicalRules()),
                           compute=LogicalRules.of({'batch': _ALL}))
    if self is Strategy.FSDP:
      return ShardingRules(
          params=_deciding(LogicalRules.of({'table': _ALL, 'embed': _ALL}, fallback=_ALL)),
          compute=LogicalRules.of({'batch': _ALL}))
    if self is Strategy.TENSOR_PARALLEL:
      tp = LogicalRules.of({name: _ALL for name in _MODEL_PARALLEL_AXES}, optional=_OPTIONAL_AXES)
      return ShardingRules(params=_deciding(tp), compute=tp)
    if self is Strategy.HYBRID:
      tp = {name: 'model' for name in _MODEL_PARALLEL_AXES}
      return ShardingRules(
          params=_deciding(LogicalRules.of(tp, optional=_OPTIONAL_AXES)),
          compute=LogicalRules.of({'batch': 'data', **tp}, optional=_OPTIONAL_AXES))
    raise AssertionError(self)
