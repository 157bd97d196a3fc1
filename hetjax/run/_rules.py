"""A run's logical-axis rules: its strategy's tables with ``parallelism.rules`` on top, in the
modes that lay a model out by a strategy, and the start-up line naming the logical names that
no rule maps.

``parallelism.rules`` (``{logical name: mesh axis, tuple of mesh axes, or None}``) is put first
in both of the strategy's tables (`hetjax.train.Strategy.rules`), so a name given there is split
as it says and ``None`` replicates it. Modes spmd, shares and tokens take it; the others lay
their parameters out themselves and refuse it in one line rather than ignore it: a plan carries
each sub-model's rules on its own mesh axes (``p0``, ``p1``, …, priced and memory-checked by the
planner: change the plan instead), pipeline stages replicate their parameters on each stage's
devices, parameter servers hold them, and a SchMP app has no logical names.
"""

from __future__ import annotations

from typing import Any

from hetjax import ConfigError, sharding, train
from hetjax.run._config import Config, Mode

#: The modes whose layout is a strategy's tables on the mesh ``('data', 'model')``.
STRATEGY_MODES = (Mode.SPMD, Mode.SHARES, Mode.TOKENS)

_ELSEWHERE = {
    Mode.PLAN: "takes each sub-model's rules from its plan (change the plan's layouts instead)",
    Mode.PIPELINE: "replicates each stage's parameters on the stage's devices",
    Mode.PS: 'keeps the parameters on its servers',
    Mode.SCHMP: 'schedules a SchMP app, which names no logical axes',
}


def check(config: Config, mode: Mode) -> None:
  """Refuses ``parallelism.rules`` in a mode that does not take a strategy (module docstring).

  Raises:
    ConfigError: one line, e.g. ``parallelism.rules maps logical names onto the strategy mesh
      of modes spmd, shares and tokens; mode plan takes each sub-model's rules from its plan
      (…): drop parallelism.rules``.
  """
  if config.parallelism.rules and mode not in STRATEGY_MODES:
    raise ConfigError(
        'parallelism.rules maps logical names onto the strategy mesh of modes '
        f'{", ".join(m.value for m in STRATEGY_MODES[:-1])} and {STRATEGY_MODES[-1].value}; '
        f'mode {mode.value} {_ELSEWHERE.get(mode, "lays its parameters out itself")}: drop '
        'parallelism.rules')


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


def notice(config: Config, mode: Mode, task: Any) -> str | None:
  """The start-up line naming the logical names on ``task``'s parameters that no rule of the
  run's parameter table maps (`hetjax.sharding.unmapped_names`), in a mode that takes a
  strategy; None when there are none (or in another mode).

  Example: a model of Flax's ``nnx.MultiHeadAttention`` layers, annotated ``('embed', 'kv')``,
  under ``hybrid``::

    rules: logical names no rule maps, replicated: kv
  """
  if mode not in STRATEGY_MODES or not isinstance(task, train.Task):
    return None
  params = rules_of(config).params
  names = sharding.unmapped_names(sharding.abstract_model(task.make_model, config.data.seed)[2],
                                  params)
  if not names:
    return None
  how = (' unless the fallback splits their parameters' if params.fallback else '')
  return f'rules: logical names no rule maps, replicated{how}: {", ".join(names)}'


def recorded(config: Config, mode: Mode) -> dict[str, Any]:
  """``run.json``'s ``rules``: the tables the run used, each a list of ``[logical name, [mesh
  axes]]`` pairs in resolution order (``[]``: replicated), in a mode that takes a strategy;
  nothing in another mode (its layout is the plan's, or replicated)."""
  if mode not in STRATEGY_MODES:
    return {}
  rules = rules_of(config)
  table = lambda t: [[name, list(axes)] for name, axes in t.rules]  # noqa: E731
  return {'rules': {'params': table(rules.params), 'params_fallback': list(rules.params.fallback),
                    'compute': table(rules.compute)}}
