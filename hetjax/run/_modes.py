"""The modes a run can take, one entry each, and the one place that reads ``mode``.

A mode's entry (`ModeEntry`) holds its builder (``build(config, ctx, channel) -> Built``), the
options it takes (`OPTIONS`, by name: an option set in a mode that does not take it is refused
in one line naming the modes that do), whether its checkpoints hold the whole model (what
`hetjax.run.load_model` reads), what it trains (a model, or a SchMP app) and its one-line
description (the ``--mode`` help and the README's table are tested against it). `mode_of` is
``auto``'s rule, `build` the dispatch: nothing else in the library asks which mode it is in.

Example::

  from hetjax import run
  [entry.mode.value for entry in run.MODES.values() if entry.whole_model]
  # ['spmd', 'shares', 'tokens']
  run.MODES[run.Mode.TOKENS].takes('policy', workers=4)  # False: tokens size themselves
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping

import jax

from hetjax import ConfigError, ps, runtime, schmp, sharding
from hetjax._errors import parse_choice
from hetjax.run import _build, _comm_options, _hosts, _ps_run
from hetjax.run._built import Built
from hetjax.run._config import Config, Mode
from hetjax.run._sections import PipelineConfig
from hetjax.run._task import trains_app


@dataclasses.dataclass(frozen=True)
class Option:
  """An option only some modes take.

  Attributes:
    key: the config key a user writes (``--set KEY=…``).
    what: what it does, a few words (said when it is refused).
    given: ``given(config, ctx) -> bool``: whether the run sets it (the launcher's
      ``--slowdown`` and ``--network`` count).
  """

  key: str
  what: str
  given: Callable[[Config, runtime.WorkerContext], bool]


def _network(config: Config, ctx: runtime.WorkerContext) -> bool:
  spec = config.emulation.network or ctx.network
  return spec is not None and spec.strip() != 'none'


#: The options only some modes take, by the name a `ModeEntry` lists them under.
OPTIONS: Mapping[str, Option] = {
    'plan': Option('parallelism.plan', 'lays each sub-model out on its group of workers',
                   lambda c, ctx: bool(c.parallelism.plan)),
    'policy': Option('balance.policy', "re-sizes each worker's share",
                     lambda c, ctx: c.balance.policy != 'uniform'),
    'shares': Option('balance.shares', "fixes each worker's share",
                     lambda c, ctx: c.balance.shares is not None),
    'slowdown': Option('slowdown', 'makes every worker a host of known speed',
                       lambda c, ctx: bool(c.emulation.slowdown or ctx.slowdown)),
    'host_fixed_s': Option('emulation.host_fixed_s', "pins the hosts' fixed cost a step",
                           lambda c, ctx: bool(c.emulation.host_fixed_s)),
    'network': Option('network', "emulates each worker's link", _network),
    'overlap': Option('overlap', 'runs the all-reduce scheduler',
                      lambda c, ctx: bool(c.parallelism.overlap or c.parallelism.bucket_bytes)),
    'rules': Option('parallelism.rules', 'maps logical names onto the strategy mesh',
                    lambda c, ctx: bool(c.parallelism.rules)),
    'local': Option('local.inner_steps', 'trains each worker alone between outer steps (local '
                    'SGD)', lambda c, ctx: c.local.inner_steps > 0),
    'sync': Option('pipeline.sync', 'groups pipeline replicas',
                   lambda c, ctx: c.pipeline.sync != PipelineConfig.sync),
}


@dataclasses.dataclass(frozen=True)
class ModeEntry:
  """One mode.

  Attributes:
    mode: the mode.
    summary: what a step is in it, one line.
    build: ``build(config, ctx, channel) -> Built``: its step program, policy, host and
      checkpointer on this worker.
    options: the names of `OPTIONS` it takes on any number of workers.
    launched: those it takes only under several workers (a pipeline's replicas).
    whole_model: whether its checkpoints hold the whole model in one `TrainState`, which
      `hetjax.run.load_model` and ``evaluate`` read.
    trains: ``'model'`` (a `hetjax.train.Task`) or ``'app'`` (a SchMP app, `hetjax.schmp.APPS`).
    layout: how it lays the parameters out, a few words (said where ``parallelism.rules``,
      which only a strategy's layout takes, is refused).
    hosts: what its emulated hosts (``slowdown``) cost: ``'rows'`` (a cost per row),
      ``'rows and fixed'`` (and a fixed cost a step), ``'units'`` (of a SchMP app's work),
      ``'stages'`` (a plan's stages, paced by their roofline) or ``''`` (none): which
      recorded hosts it can reuse (``emulation.hosts``).
  """

  mode: Mode
  summary: str
  build: Callable[[Config, runtime.WorkerContext, runtime.Channel | None], Built]
  options: frozenset[str] = frozenset()
  launched: frozenset[str] = frozenset()
  whole_model: bool = False
  trains: str = 'model'
  layout: str = "lays the parameters out by the strategy's tables on the mesh"
  hosts: str = 'rows'

  def __post_init__(self):
    unknown = (self.options | self.launched) - set(OPTIONS)
    if unknown:
      raise ValueError(f'mode {self.mode.value}: unknown options {sorted(unknown)}')

  def takes(self, option: str, workers: int = 1) -> bool:
    """Whether this mode takes `OPTIONS` ``option`` on ``workers`` workers."""
    return option in self.options or (workers > 1 and option in self.launched)


#: Every mode but ``auto`` (which `mode_of` resolves to one of them), in the order docs list them.
MODES: Mapping[Mode, ModeEntry] = {entry.mode: entry for entry in (
    ModeEntry(Mode.SPMD, 'one jitted step over one mesh of every device of the job',
              _build.build_spmd, frozenset({'rules'}), whole_model=True, hosts=''),
    ModeEntry(Mode.SHARES, "each worker computes its share of the batch (re-sized by a policy such "
              'as LB-BSP, or fixed), the gradients summed', _build.build_shares,
              frozenset({'policy', 'shares', 'slowdown', 'host_fixed_s', 'network', 'overlap',
                         'rules', 'local'}), whole_model=True, hosts='rows and fixed'),
    ModeEntry(Mode.TOKENS, "Fela's tokens: workers pull fixed-size pieces of the batch, fast "
              'ones more', _build.build_tokens, frozenset({'slowdown', 'host_fixed_s', 'rules'}),
              whole_model=True, hosts='rows and fixed'),
    ModeEntry(Mode.PIPELINE, 'stages on device groups (GPipe, 1F1B), under several workers one '
              'SDPipe replica each, grouped by a sync policy', _build.build_pipeline,
              launched=frozenset({'slowdown', 'sync', 'local'}),
              layout="replicates each stage's parameters on the stage's devices"),
    ModeEntry(Mode.PLAN, 'a Fela plan: each sub-model with its own layout on its group of '
              'workers (one SPMD step, or stages on the groups)', _build.build_plan,
              frozenset({'plan', 'slowdown'}),
              layout="takes each sub-model's layout from its plan (change the plan instead)",
              hosts='stages'),
    ModeEntry(Mode.SCHMP, 'scheduled model parallelism: rounds over blocks of a SchMP '
              "app's parameters", _build.build_schmp, frozenset({'slowdown'}), trains='app',
              layout='schedules a SchMP app, which names no logical axes', hosts='units'),
    ModeEntry(Mode.PS, 'parameter servers hold the model; workers push gradients and pull '
              'parameters (bsp, asp, ssp, eager pull)', _ps_run.build,
              frozenset({'slowdown', 'network'}), layout='keeps the parameters on its servers'),
)}

#: ``auto``'s rule, as `mode_of` applies it.
AUTO_RULE = ('auto is schmp for a SchMP app, ps in a job with parameter servers, plan given a '
             'plan; shares for per-worker options (a policy, fixed shares, a slowdown, local '
             'SGD) and for '
             'several workers that differ (device counts, a network, the all-reduce scheduler, '
             "a mesh of one worker's devices); else spmd")


def describe_modes() -> str:
  """The modes, one line each, and ``auto``'s rule: the ``--mode`` help."""
  return '; '.join(f'{m.value}: {e.summary}' for m, e in MODES.items()) + f'. {AUTO_RULE}.'


def mode_of(config: Config, ctx: runtime.WorkerContext) -> Mode:
  """The mode ``config`` runs in here; ``auto`` picks (`AUTO_RULE`):

  - ``schmp`` for a SchMP app, ``ps`` in a job with parameter servers, ``plan`` given a plan;
  - ``shares`` for anything only shares use (fixed shares, a policy, a slowdown, local SGD),
    and under
    several workers with an emulated network or the all-reduce scheduler, whose device counts
    differ, or whose mesh is each worker's own (``parallelism.mesh`` the size of one worker's
    devices);
  - else ``spmd``: one jitted step over the mesh of every device of the job, as a homogeneous
    multi-host job runs (on one process, over its devices).
  """
  mode = parse_choice(Mode, config.parallelism.mode, 'mode')
  if mode is not Mode.AUTO:
    return mode
  if trains_app(config):
    return Mode.SCHMP
  if os.environ.get(ps.ENV_NUM_SERVERS):
    return Mode.PS
  if config.parallelism.plan:
    return Mode.PLAN
  if (config.balance.shares or config.emulation.slowdown or ctx.slowdown
      or config.balance.policy != 'uniform' or config.local.inner_steps):
    return Mode.SHARES
  if ctx.workers == 1:
    return Mode.SPMD
  if config.parallelism.overlap or config.emulation.network or ctx.network:
    return Mode.SHARES  # the all-reduce of per-worker shares is what they schedule and pad
  counts = {sum(d.process_index == w for d in jax.devices()) for w in range(ctx.workers)}
  spans = math.prod(sharding.parse_mesh_shape(config.parallelism.mesh)) == jax.device_count()
  return Mode.SPMD if len(counts) == 1 and spans else Mode.SHARES


def _modes_taking(option: str) -> str:
  """``'modes shares and tokens'``, ``'mode plan'``; ``…, and pipeline under several
  workers``."""
  names = [m.value for m, e in MODES.items() if option in e.options]
  launched = [m.value for m, e in MODES.items() if option in e.launched]
  if launched:
    names.append(f'{" and ".join(launched)} under several workers')
  listed = names[0] if len(names) == 1 else f'{", ".join(names[:-1])} and {names[-1]}'
  return f'mode{"s" if len(names) > 1 else ""} {listed}'


def refuse(config: Config, ctx: runtime.WorkerContext, mode: Mode) -> None:
  """Refuses, in one line, every option ``config`` sets that ``mode`` does not take.

  Example: ``mode spmd takes no balance.policy (it re-sizes each worker's share: mode shares):
  drop it or pick a mode that takes it``.

  Raises:
    ConfigError: such options; also a SchMP app outside mode schmp and a model in it.
  """
  entry = MODES[mode]
  trains = 'app' if config.model.name in schmp.APPS else 'model'
  if trains != entry.trains:
    if trains == 'app':
      raise ConfigError(f'{config.model.name!r} is a SchMP app: it runs in mode schmp (or auto), '
                        f'not {mode.value}')
    raise ConfigError(f'mode {mode.value} runs a SchMP app, one of {", ".join(schmp.APPS)}; '
                      f'{config.model.name!r} is not one')
  refused = [name for name, option in OPTIONS.items()
             if option.given(config, ctx) and not entry.takes(name, ctx.workers)]
  if not refused:
    return
  one = len(refused) == 1
  alone = ' on one worker' if all(name in entry.launched for name in refused) else ''
  why = '; '.join(f'{OPTIONS[n].key} {OPTIONS[n].what}: {_modes_taking(n)}' for n in refused)
  layout = f'; mode {mode.value} {entry.layout}' if 'rules' in refused else ''
  raise ConfigError(f'mode {mode.value} takes no {", ".join(OPTIONS[n].key for n in refused)}'
                    f'{alone} ({why}){layout}: drop {"it" if one else "them"} or pick a mode '
                    f'that takes {"it" if one else "them"}')


def build(config: Config, ctx: runtime.WorkerContext, channel: runtime.Channel | None
          ) -> Built:
  """Everything the runner drives for ``config`` on this worker (`Built`): its mode's step
  program, policy and host, its checkpointer and restore target, and its extras.

  Raises:
    ConfigError: options that do not fit the mode or each other, one line.
  """
  mode = mode_of(config, ctx)
  config = _hosts.reuse(config, mode, config.emulation.slowdown or ctx.slowdown,
                        MODES[mode].hosts)
  refuse(config, ctx, mode)
  _comm_options.check(config)
  return MODES[mode].build(config, ctx, channel)
