"""A run's logical-axis rules: its strategy's tables with ``parallelism.rules`` on top, in the
modes that lay a model out by a strategy, and the start-up line naming the logical names that
no rule maps.

``parallelism.rules`` (``{logical name: mesh axis, tuple of mesh axes, or None}``) is put first
in both of the strategy's tables (`hetjax.train.Strategy.rules`), so a name given there is split
as it says and ``None`` replicates it. Modes spmd, shares and tokens take it; the others lay
their parameters out themselves and refuse it in one line rather than ignore it
(`hetjax.run.MODES`): a plan carries each sub-model's rules on its own mesh axes (``p0``,
``p1``, …, priced and memory-checked by the planner: change the plan instead), pipeline stages
replicate their parameters on each stage's devices, parameter servers hold them, and a SchMP
app has no logical names.
"""

from __future__ import annotations

from typing import Any

from hetjax import sharding, train
from hetjax.run._config import Config
from hetjax.run._task import trains_app


def rules_of(config: Config) -> sharding.ShardingRules:
  """The run's tables: ``parallelism.strategy``'s with ``parallelism.rules`` on top.

  Example::

    config = run.override(run.load_config('transformer'),
                          ['strategy=tensor_parallel', 'parallelism.rules.heads=None'])
    rules_of(config).params.spec(('embed', 'heads', 'head_dim'))   # P(None, None, None)

  Raises:
    ConfigError: an unknown strategy, or a rule onto a mesh axis other than data and model.
  """
  strategy = train.Strategy.parse(config.parallelism.strategy)
  return strategy.rules(config.parallelism.rules)


def notice(config: Config, task: Any) -> str | None:
  """The start-up line naming the logical names on ``task``'s parameters that no rule of the
  run's parameter table maps (`hetjax.sharding.unmapped_names`), for a mode that takes a
  strategy; None when there are none.

  Example: a model of Flax's ``nnx.MultiHeadAttention`` layers, annotated ``('embed', 'kv')``,
  under ``hybrid``::

    rules: logical names no rule maps, replicated: kv
  """
  if trains_app(config):  # a SchMP app names no logical axes
    return None
  params = rules_of(config).params
  names = sharding.unmapped_names(sharding.abstract_model(task.make_model, config.data.seed)[2],
                                  params)
  if not names:
    return None
  how = (' unless the fallback splits their parameters' if params.fallback else '')
  return f'rules: logical names no rule maps, replicated{how}: {", ".join(names)}'


def recorded(config: Config) -> dict[str, Any]:
  """``run.json``'s ``rules``, for a mode that takes a strategy: the tables the run used, each
  a list of ``[logical name, [mesh axes]]`` pairs in resolution order (``[]``: replicated)."""
  rules = rules_of(config)
  table = lambda t: [[name, list(axes)] for name, axes in t.rules]  # noqa: E731
  return {'rules': {'params': table(rules.params), 'params_fallback': list(rules.params.fallback),
                    'compute': table(rules.compute)}}
