"""From a `Config` to everything a run drives: the one place that reads ``mode``.

Every mode's builder returns one `Built` — the step program, the policy that decides its steps,
the host, the checkpointer, the restore target and the extras — so the runner
(`hetjax.run.train`) runs them all with one loop, one checkpoint protocol and one set of hooks.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from hetjax import (
  ConfigError,
  balance,
  checkpoint,
  emulation,
  models,
  pipeline,
  planner,
  ps,
  runtime,
  schmp,
  sharding,
  train,
)
from hetjax._errors import parse_choice
from hetjax.core import ShareRules
from hetjax.pipeline import PipelineTrainer
from hetjax.run import _comm_options, _hosts, _replicas, _restarts, _rules
from hetjax.run._config import Config, Mode
from hetjax.run._config_files import import_function
from hetjax.run._sections import PRECISION_FIELDS, PipelineConfig

SYNC_DEFAULT = PipelineConfig.sync


#: ``checkpoints(workdir, resume) -> checkpointer`` (`hetjax.checkpoint.CheckpointerProtocol`).
Checkpoints = Callable[[pathlib.Path, bool], checkpoint.CheckpointerProtocol]


@dataclasses.dataclass(frozen=True)
class Built:
  """Everything the runner (`hetjax.run.train`) drives, for one mode on this worker: the one
  value each mode's builder returns, so that the runner reads no mode and probes no program.

  Attributes:
    program: the `hetjax.core.StepProgram`.
    policy: the policy that decides its steps (shares, tokens, a sync or SchMP scheduler), or
      None.
    devices: where it runs, for the first line a run prints.
    mode: the mode it runs in.
    host: this worker's host of known speed (``--slowdown``), or None.
    describe: the run's first line after the model's name (mode, layout and devices).
    worker: this process's index among the training workers (a ps job's servers not counted).
    workers: the training workers of the job.
    checkpoints: this worker's checkpointer under the run directory (a resume restores its
      newest good checkpoint); `default_checkpoints` for one state saved by `Checkpointer`.
    restore_target: the abstract state a checkpoint of a step restores into.
    start: ``start(resume) -> (state, policy state)`` when the state is not this worker's to
      restore (a parameter-server worker pulls it from the servers); None: from ``checkpoints``.
    measure_speed: the share and token modes: ``measure_speed(state, the policy's first
      decision) -> samples/s`` of this worker on its first share or a token, padded to its
      host (``cluster.json``; its telemetry then goes to ``telemetry.jsonl``); None: no probe.
    warm_up: run once before the first step (pipeline replicas compile and connect their
      groups before the scheduler's clock starts), or None.
    finish: ``finish(state or None on failure) -> summary fields``, always called after the
      loop (the replicas' scheduler stops and reports; a ps worker says it is done).
    serve: ``serve(workdir)``: a parameter server's process serves instead of training; None
      for a worker.
    run_info: ``run.json``'s fields beyond the common ones.
  """

  program: Any
  policy: Any
  devices: str
  mode: Mode
  host: Any = None
  describe: str = ''
  worker: int = 0
  workers: int = 1
  checkpoints: Checkpoints | None = None
  restore_target: Callable[[int], Any] | None = None
  start: Callable[[bool], tuple[Any, Any]] | None = None
  measure_speed: Callable[[Any, Any], float] | None = None
  warm_up: Callable[[Any], Any] | None = None
  finish: Callable[[Any], dict] = lambda state: {}
  serve: Callable[[pathlib.Path], None] | None = None
  run_info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def default_checkpoints(config: Config) -> Checkpoints:
  """One `hetjax.checkpoint.Checkpointer` in ``WORKDIR/checkpoints``."""
  return lambda workdir, resume: checkpoint.Checkpointer(
      workdir / 'checkpoints', asynchronous=config.checkpoint.asynchronous)


def make_task(config: Config) -> train.Task:
  """The config's task: a shipped model by name, or ``'module:function'`` of your own, called
  with ``model.args`` and the ``model.dtype``, ``param_dtype`` and ``remat`` that are set.

  Raises:
    ConfigError: arguments the model does not take (a precision or remat setting for a model
      without that argument says so).
  """
  args = config.model.task_args()
  if ':' in config.model.name:
    make = import_function(config.model.name, 'model')
    try:
      inspect.signature(make).bind(**args)
    except ValueError:  # no signature to check (a builtin): the call will tell
      pass
    except TypeError as e:
      _refuse_precision(config, inspect.signature(make).parameters)
      raise ConfigError(f'model {config.model.name!r} does not take model_args '
                        f'{dict(args)}: {e}') from None
    task = make(**args)
    if not isinstance(task, train.Task):
      raise ConfigError(f'model {config.model.name!r} returned {type(task).__name__}, not a '
                        'hetjax.train.Task')
    return task
  if config.model.name in models.NAMES:
    factory = importlib.import_module(f'hetjax.models.{config.model.name}').make_task
    _refuse_precision(config, inspect.signature(factory).parameters)
  return models.make_task(config.model.name, **args)


def _refuse_precision(config: Config, accepted) -> None:
  for field in PRECISION_FIELDS:
    if getattr(config.model, field) is not None and field not in accepted:
      raise ConfigError(f'model.{field}: model {config.model.name!r} takes no {field} argument '
                        '(the gpt model does; a model of your own takes it as a make_task '
                        'keyword)')


def optimizer_of(config: Config) -> tuple[Any, Callable[[int], float]]:
  """``(the optax transformation, learning_rate(step))`` of ``config.optimizer``: its named
  optimizer with the schedule, clipping and weight decay the config gives."""
  opt = config.optimizer
  rate = train.learning_rate_schedule(opt.learning_rate, opt.decay_steps or opt.steps,
                                      opt.schedule, opt.warmup, opt.final_fraction)
  tx = train.Optimizer.parse(opt.name).make(rate, weight_decay=opt.weight_decay,
                                            clip_norm=opt.clip_norm)
  return tx, (rate if callable(rate) else lambda step: rate)


def mode_of(config: Config, ctx: runtime.WorkerContext) -> Mode:
  """The mode ``config`` runs in here; ``auto`` picks:

  - ``schmp`` for a SchMP app, ``ps`` in a job with parameter servers, ``plan`` given a plan;
  - ``shares`` for anything only shares use (fixed shares, a policy, a slowdown), and under
    several workers with an emulated network or the all-reduce scheduler, whose device counts
    differ, or whose mesh is each worker's own (``parallelism.mesh`` the size of one worker's
    devices);
  - else ``spmd``: one jitted step over the mesh of every device of the job, as a homogeneous
    multi-host job runs (on one process, over its devices).
  """
  mode = parse_choice(Mode, config.parallelism.mode, 'mode')
  if mode is Mode.AUTO and config.model.name in schmp.APPS:
    return Mode.SCHMP
  if mode is Mode.AUTO and os.environ.get(ps.ENV_NUM_SERVERS):
    return Mode.PS
  if mode is Mode.AUTO and config.parallelism.plan:
    return Mode.PLAN
  if mode is not Mode.AUTO:
    return mode
  if (config.balance.shares or config.emulation.slowdown or ctx.slowdown
      or config.balance.policy != 'uniform'):
    return Mode.SHARES
  if ctx.workers == 1:
    return Mode.SPMD
  if config.parallelism.overlap or config.emulation.network or ctx.network:
    return Mode.SHARES  # the all-reduce of per-worker shares is what they schedule and pad
  counts = {sum(d.process_index == w for d in jax.devices()) for w in range(ctx.workers)}
  spans = math.prod(sharding.parse_mesh_shape(config.parallelism.mesh)) == jax.device_count()
  return Mode.SPMD if len(counts) == 1 and spans else Mode.SHARES


def default_bucket(global_batch: int, workers: int, degree: int,
                   devices: tuple[int, ...] | None = None) -> int:
  """The largest divisor of the global batch that is a multiple of the local degree and at
  most 1/16 of a uniform share (so a worker compiles few share sizes).

  Workers of different device counts (``devices``, one count a worker): ``degree`` is the
  least common multiple of their local degrees, and the share is the smallest worker's
  (uniform shares are equal per device, `ShareRules.devices`).

  Example::

    >>> default_bucket(256, 3, 1)  # 1/16 of 85.3 rows is 5.3: 4 divides 256
    4
    >>> default_bucket(256, 3, 2, devices=(2, 1, 1))  # 1/16 of 64 rows is 4
    4
  """
  if devices is None:
    return _divisor_at_most(global_batch, global_batch // (16 * workers), degree)
  return _divisor_at_most(global_batch, global_batch * min(devices) // (16 * sum(devices)),
                          degree)


def micro_bucket(global_batch: int, workers: int, degree: int,
                 devices: tuple[int, ...] | None = None) -> int:
  """The default bucket where shares are whole micro-batches (``balance.granularity`` micro or
  auto): the largest divisor of the global batch that is a multiple of the local degree and at
  most 1/4 of a uniform share (the smallest worker's), so a share runs in few calls.

  Example::

    >>> micro_bucket(64, 4, 1)  # a uniform share of 16 rows: micro-batches of 4
    4
  """
  smallest = global_batch // workers if devices is None else \
      global_batch * min(devices) // sum(devices)
  return _divisor_at_most(global_batch, smallest // 4, degree)


def default_token_rows(global_batch: int, workers: int, degree: int) -> int:
  """About four tokens per worker: the largest divisor of X that is a multiple of the degree
  and at most X / (4 × workers).

  Example::

    >>> default_token_rows(256, 3, 1)  # 256 / 12 = 21.3: 16 divides 256
    16
  """
  return _divisor_at_most(global_batch, global_batch // (4 * workers), degree)


def _divisor_at_most(total: int, target: int, degree: int) -> int:
  """The largest multiple of ``degree`` that divides ``total`` and is at most ``target`` (at
  least ``degree``)."""
  target = max(target, degree)
  for b in range(target - target % degree, 0, -degree):
    if total % b == 0:
      return b
  raise ConfigError(f'the local data-parallel degree {degree} does not divide the global batch '
                    f'{total}')


def _trace(config: Config, ctx: runtime.WorkerContext):
  spec = config.emulation.slowdown or ctx.slowdown
  if not spec:
    return None
  # A job restarted on fewer workers keeps its spec; each worker keeps its own host's speed.
  trace = emulation.parse_trace(spec, runtime.original_workers(ctx.workers))
  return emulation.subset(trace, runtime.hosts(ctx.workers))


def _spmd(config, ctx, task, optimizer, strategy, mesh_shape) -> Built:
  mesh = sharding.make_mesh(mesh_shape)  # every device of the job, 'data' across its workers
  trainer = train.Trainer(task, optimizer, config.data.global_batch, mesh, _rules.rules_of(config),
                          config.data.seed, accumulate=config.optimizer.accumulate)
  devices = f'{len(trainer.mesh.devices.flat)} {jax.devices()[0].platform} devices'
  if ctx.workers > 1:
    devices += f' of {ctx.workers} workers'
  _announce_fsdp(config, ctx, trainer)
  return Built(trainer, None, devices, Mode.SPMD)


def _announce_fsdp(config, ctx, trainer) -> None:
  """The chief prints `fsdp_notice` of a run under FSDP (modes spmd, shares and tokens)."""
  if (train.Strategy.parse(config.parallelism.strategy) is train.Strategy.FSDP and ctx.is_chief
      and (notice := fsdp_notice(trainer))):
    print(notice, flush=True)


def _plan(config, ctx, task, optimizer, trace, channel) -> Built:
  """The plan's program: one SPMD step on one process's devices, or stages on its groups."""
  if trace is not None and ctx.workers == 1:
    raise ConfigError('a slowdown emulates workers of known speed, and this plan runs on one '
                      'process: launch several workers (python -m hetjax.launch)')
  plan = planner.Plan.load(config.parallelism.plan, sharding.submodel_names(task.make_model))
  if plan.devices != jax.device_count() and runtime.original_workers(ctx.workers) > ctx.workers:
    plan = _restarts.replan(plan, task, config.data.global_batch, ctx, channel)  # workers were lost
  cap = planner.device_memory(jax.local_devices())
  compiled = planner.compile_plan(plan, task, optimizer, config.data.global_batch, cap,
                                  seed=config.data.seed,
                                  micro_batches=config.pipeline.micro_batches,
                                  schedule=config.pipeline.schedule,
                                  accumulate=config.optimizer.accumulate)
  trainer, platform = compiled.trainer, jax.devices()[0].platform
  if not compiled.stage_memory:  # one SPMD step (`train.Trainer`)
    return Built(trainer, None, f'plan {plan.name!r}: {plan.devices} {platform} devices',
                 Mode.PLAN, describe=f'plan, plan {config.parallelism.plan} (plan {plan.name!r}: '
                 f'{plan.devices} {platform} devices)')
  groups = ', '.join(f'{"+".join(names)} on {len(mesh.devices.flat)}'
                     for names, mesh in zip(trainer.stage_links, trainer.meshes, strict=True))
  devices = (f'plan {plan.name!r}: {trainer.stages} stages ({groups} {platform} devices), '
             f'{config.pipeline.micro_batches * config.optimizer.accumulate} micro-batches, '
             f'{config.pipeline.schedule}')
  host = None
  if trace is not None:
    host = _hosts.stage_host(trainer, compiled.programs, trace, ctx, channel, _hosts.MARGIN)
  checkpoints = None
  if ctx.workers > 1:  # stages on their processes: each saves its own stages' state
    checkpoints = lambda workdir, resume: pipeline.StageCheckpointer(  # noqa: E731
        workdir / 'checkpoints', trainer)
  return Built(trainer, None, devices, Mode.PLAN, host, checkpoints=checkpoints,
               restore_target=trainer.abstract_state)


def _schmp(config, ctx, mode, channel) -> Built:
  """A SchMP app's rounds over every device of the job, and its scheduler."""
  if mode is not Mode.SCHMP:
    raise ConfigError(f'{config.model.name!r} is a SchMP app: it runs in mode schmp (or auto), not '
                      f'{mode.value}')
  if config.model.name not in schmp.APPS:
    raise ConfigError(f'mode schmp runs a SchMP app, one of {", ".join(schmp.APPS)}; '
                      f'{config.model.name!r} is not one')
  unused = [f for f, v in (('plan', config.parallelism.plan), ('shares', config.balance.shares),
                           ('policy', config.balance.policy != 'uniform')) if v]
  if unused:
    raise ConfigError(f'mode schmp takes no {", ".join(unused)}: its rounds are scheduled by '
                      '--set scheduler=…')
  app = schmp.make_app(config.model.name, scheduler=config.schmp.scheduler, **config.model.args)
  devices = jax.devices()
  size = config.schmp.schedule_size or app.default_schedule_size(len(devices))
  program = schmp.SchmpProgram(app, size, devices, seed=config.data.seed,
                               staleness=config.schmp.staleness,
                               objective_every=config.schmp.objective_every,
                               last_round=config.optimizer.steps - 1)
  policy = app.policy(size, config.data.seed)
  host, retries = _trace(config, ctx), []
  if host is not None:
    host = _hosts.schmp_host(ctx, program, policy, host, channel, config.emulation.host_row_s,
                             record=retries.append)
  where = (f'{len(devices)} {devices[0].platform} devices, {size} blocks a round, scheduler '
           f'{app.scheduler}, staleness {config.schmp.staleness}')
  return Built(program, policy, where, Mode.SCHMP, host,
               describe=f'schmp, rounds of scheduled model parallelism ({where})',
               run_info={_hosts.RETRIES: retries})


def fsdp_notice(trainer: train.Trainer) -> str | None:
  """A line naming the parameters FSDP split along another dimension than their ``table`` or
  ``embed`` one, which the device count does not divide (`hetjax.sharding.fallen_back`), and
  one naming those it leaves replicated, and why: FSDP splits a ``table`` or ``embed``
  dimension, else the largest dimension the device count divides, so these have none it
  divides. None when every parameter with a dimension is sharded as named (or on one device)."""
  from flax import traverse_util

  ways = int(np.prod([trainer.mesh.shape[a] for a in trainer.rules.params.fallback]))
  _, abstract, logical = sharding.abstract_model(trainer.task.make_model, trainer.seed)
  moved = sharding.fallen_back(abstract, logical, trainer.mesh, trainer.rules.params)
  lines = []
  if moved:
    noun = 'parameter' if len(moved) == 1 else 'parameters'
    lines.append(f'fsdp: {len(moved)} {noun} split along another dimension, {ways} devices not '
                 f'dividing the named one: {", ".join(moved[:3])}{", …" if len(moved) > 3 else ""}')
  shapes = traverse_util.flatten_dict(trainer.layout.abstract.params)
  specs = traverse_util.flatten_dict(trainer.layout.shardings.params)
  whole = {k: int(np.prod(v.shape)) for k, v in shapes.items()}
  kept = sorted((k for k, s in specs.items() if shapes[k].shape and all(e is None for e in s.spec)),
                key=lambda k: -whole[k])
  if ways > 1 and kept:
    names = ', '.join(f'{"/".join(map(str, k))} {shapes[k].shape}' for k in kept[:3])
    share = sum(whole[k] for k in kept) / sum(whole.values())
    share_text = f'{share:.1%}' if share >= 1e-3 else '<0.1%'
    noun = 'parameter' if len(kept) == 1 else 'parameters'
    lines.append(f'fsdp: {len(kept)} {noun} ({share_text} of the weights) left replicated, no '
                 f'dimension divisible by {ways} devices: {names}'
                 f'{", …" if len(kept) > 3 else ""}')
  return '\n'.join(lines) or None


def _caps(config) -> tuple[int, ...] | None:
  return None if config.balance.memory_caps is None else tuple(config.balance.memory_caps)


def _share_policy(config, ctx, degree: int, trace, devices: tuple[int, ...]
                  ) -> tuple[Any, int | None]:
  """(the share policy, its bucket — None when shares never change). ``degree``: the least
  common multiple of the workers' local degrees; ``devices``: each worker's device count
  (uniform shares are equal per device)."""
  unequal = devices if len(set(devices)) > 1 else None
  if config.balance.shares is not None:
    shares = tuple(config.balance.shares)
    rules = ShareRules(config.data.global_batch, ctx.workers, degree,
                       minimum=(0,) * ctx.workers)
    return balance.Fixed(rules, shares), None
  automatic = (default_bucket if config.balance.granularity == train.Granularity.COMPILE.value
               else micro_bucket)
  bucket = config.balance.bucket or automatic(config.data.global_batch, ctx.workers, degree,
                                              unequal)
  if bucket % degree:
    raise ConfigError(f'bucket {bucket} is not a multiple of the local data-parallel degree '
                      f'{degree}' + (f' (of workers of {devices} devices)' if unequal else ''))
  rules = ShareRules(config.data.global_batch, ctx.workers, bucket, maximum=_caps(config),
                     devices=unequal)
  policy = balance.make_policy(config.balance.policy, rules, trace)
  return policy, None if isinstance(policy, balance.Uniform) else bucket


def build(config: Config, ctx: runtime.WorkerContext, channel: runtime.Channel | None
          ) -> Built:
  """Everything the runner drives for ``config`` on this worker (`Built`): its mode's step
  program, policy and host, its checkpointer and restore target, and its extras.

  Raises:
    ConfigError: options that do not fit the mode or each other, one line.
  """
  mode = mode_of(config, ctx)
  config = _hosts.reuse(config, mode, config.emulation.slowdown or ctx.slowdown)
  _comm_options.check(config, ctx, mode)
  if config.emulation.host_fixed_s and mode not in (Mode.SHARES, Mode.TOKENS):
    raise ConfigError(f'emulation.host_fixed_s pins the hosts of modes shares and tokens; mode '
                      f'{mode.value} takes host_row_s alone')
  _rules.check(config, mode)
  if mode is Mode.PS:
    from hetjax.run import _ps_run  # (imports this module)

    return _ps_run.build(config, ctx, channel)
  built = _build_mode(config, ctx, channel, mode)
  layout = f'{config.parallelism.strategy} on mesh {config.parallelism.mesh}'
  return dataclasses.replace(
      built,
      describe=built.describe or f'{built.mode.value}, {layout} ({built.devices})',
      worker=ctx.worker, workers=ctx.workers,
      checkpoints=built.checkpoints or default_checkpoints(config),
      restore_target=built.restore_target or (lambda step: built.program.abstract_state()),
      run_info={'policy': None if built.policy is None else built.policy.name, 'sync': None,
                **built.run_info,
                **_hosts.recorded(built.host, config, built.run_info.get(_hosts.RETRIES, ()))})


def _build_mode(config: Config, ctx: runtime.WorkerContext, channel: runtime.Channel | None,
                mode: Mode) -> Built:
  if mode is Mode.SCHMP or config.model.name in schmp.APPS:
    return _schmp(config, ctx, mode, channel)
  task = make_task(config)
  optimizer, _ = optimizer_of(config)
  strategy = train.Strategy.parse(config.parallelism.strategy)
  mesh_shape = sharding.parse_mesh_shape(config.parallelism.mesh)
  if config.parallelism.plan and mode is not Mode.PLAN:
    raise ConfigError(f'a plan runs in mode plan (or auto); mode {mode.value} takes strategy '
                      'and mesh instead')
  if mode is Mode.PLAN and not config.parallelism.plan:
    raise ConfigError('mode plan needs a plan: --plan=PATH (experiments/plan.py --json writes '
                      'one; hetjax/configs/plans/ has hand-written ones)')
  replicas = mode is Mode.PIPELINE and ctx.workers > 1
  if mode in (Mode.SPMD, Mode.PIPELINE, Mode.PLAN):
    slowed = replicas or mode is Mode.PLAN
    slowdown = config.emulation.slowdown or ctx.slowdown
    policy = config.balance.policy
    unused = [f for f, v in (('slowdown', not slowed and slowdown),
                             ('policy', policy != 'uniform' and policy),
                             ('shares', config.balance.shares)) if v]
    if unused:
      also = ('; a slowdown also slows pipeline replicas, under several workers'
              if mode is Mode.PIPELINE and 'slowdown' in unused else '')
      raise ConfigError(f'mode {mode.value} takes no {", ".join(unused)} (per-worker options '
                        f'of the shares and tokens modes): drop it or pick one of those '
                        f'modes{also}')
  if config.pipeline.sync != SYNC_DEFAULT and not replicas:
    raise ConfigError(f'sync {config.pipeline.sync!r} groups pipeline replicas: it takes mode '
                      'pipeline '
                      f'under several workers (this is mode {mode.value} on {ctx.workers})')
  if mode is Mode.SPMD:  # over every worker's devices: the mesh is the job's
    return _spmd(config, ctx, task, optimizer, strategy, mesh_shape)
  if mode is Mode.PLAN:
    return _plan(config, ctx, task, optimizer, _trace(config, ctx), channel)
  if mode is Mode.PIPELINE:
    trainer = PipelineTrainer(task, optimizer, config.data.global_batch, config.pipeline.stages,
                              config.pipeline.micro_batches * config.optimizer.accumulate,
                              config.pipeline.schedule,
                              jax.local_devices(),
                              seed=config.data.seed)
    devices = (f'{trainer.stages} stages x {trainer.meshes[0].size} '
               f'{jax.devices()[0].platform} devices, {config.pipeline.schedule}')
    if not replicas:  # a pipeline's step is a host int: its restore target carries the saved one
      return Built(trainer, None, devices, mode, restore_target=trainer.abstract_state)
    return _replicas.build(config, ctx, channel, trainer, _trace(config, ctx),
                           Built(trainer, None, f'{ctx.workers} replicas of {devices}, sync '
                                 f'{config.pipeline.sync}', mode))
  trace = _trace(config, ctx)
  axis_rules = _rules.rules_of(config)  # the strategy's tables with parallelism.rules on top
  degree = train.local_batch_degree(axis_rules, mesh_shape)
  devices = f'{ctx.workers} workers x {jax.local_device_count()} {jax.devices()[0].platform} ' \
            'devices'
  counts = tuple(sum(d.process_index == w for d in jax.devices()) for w in range(ctx.workers))
  if mode is Mode.TOKENS:
    if len(set(counts)) > 1:
      raise ConfigError(f'mode tokens needs workers of equal device counts (every token is one '
                        f'program shape on every worker); these have {list(counts)}: use mode '
                        'shares (LB-BSP sizes each worker\'s share) or a plan')
    if channel is None:
      channel = runtime.LocalChannel()
    rows = config.balance.token_rows or default_token_rows(config.data.global_batch, ctx.workers,
                                                           degree)
    rules = train.TokenRules(config.data.global_batch, rows, degree, config.balance.endgame,
                             config.balance.prefetch)
    trainer = train.TokenTrainer(task, optimizer, config.data.global_batch, rules, channel,
                                 mesh_shape, axis_rules, config.data.seed,
                                 accumulate=config.optimizer.accumulate)
    _announce_fsdp(config, ctx, trainer)
    retries = []
    return Built(trainer, rules, devices, mode,
                 _hosts.emulated_host(ctx, trainer, trace, channel,
                                      host_row_s=config.emulation.host_row_s,
                                      host_fixed_s=config.emulation.host_fixed_s,
                                      token_rows=rules.token_rows, record=retries.append),
                 measure_speed=lambda state, first: trainer.measure_speed(state, rules.token_rows),
                 run_info={_hosts.RETRIES: retries})
  # Workers of different device counts: shares are multiples of every worker's degree.
  degree = math.lcm(*(train.local_batch_degree(axis_rules, mesh_shape, w)
                      for w in range(ctx.workers)))
  if len(set(counts)) > 1:
    devices = f'{ctx.workers} workers of {",".join(map(str, counts))} ' \
              f'{jax.devices()[0].platform} devices'
  policy, bucket = _share_policy(config, ctx, degree, trace, counts)
  links = _comm_options.links_of(config, ctx, ctx.workers)
  if config.parallelism.overlap:
    trainer = train.OverlapTrainer(task, optimizer, config.data.global_batch, mesh_shape,
                                   axis_rules, seed=config.data.seed, bucket=bucket,
                                   links=links,
                                   bucket_bytes=config.parallelism.bucket_bytes or None,
                                   accumulate=config.optimizer.accumulate,
                                   estimate_scale=config.parallelism.overlap_scale,
                                   estimate=config.parallelism.overlap_estimate,
                                   granularity=config.balance.granularity)
    devices += ', all-reduce scheduler'
  else:
    trainer = train.WorkerTrainer(task, optimizer, config.data.global_batch, mesh_shape,
                                  axis_rules, config.data.seed, bucket=bucket, links=links,
                                  accumulate=config.optimizer.accumulate,
                                  granularity=config.balance.granularity)
  inner = trainer.sync if config.parallelism.overlap else trainer  # the synchronous pieces
  inner.check_shares(policy.update(policy.init(), None)[0])
  _announce_fsdp(config, ctx, inner)
  retries = []
  host = _hosts.emulated_host(ctx, inner, trace, channel, host_row_s=config.emulation.host_row_s,
                              host_fixed_s=config.emulation.host_fixed_s, record=retries.append)
  if isinstance(policy, balance.Oracle) and host is not None:  # the hosts' true speeds
    policy = dataclasses.replace(policy, fixed_s=host.fixed_s, row_s=tuple(
        host.row_s * min(counts) / k for k in counts))
  if isinstance(policy, balance.LBBSP) and host is not None:  # the hosts' measured curve
    row = host.row_s * config.data.global_batch / sum(counts) * min(counts)
    policy = dataclasses.replace(policy, fixed_fraction=host.fixed_s / (host.fixed_s + row)
                                 if host.fixed_s + row > 0 else 0.0)
  if links is not None and not config.parallelism.overlap and isinstance(
      policy, (balance.LBBSP, balance.Oracle)):  # a step is compute plus the worker's exchange
    policy = dataclasses.replace(policy, transfer_s=links.exchange_s(trainer.all_reduce_bytes))
  return Built(trainer, policy, devices, mode, host,
               measure_speed=lambda state, first: trainer.measure_speed(
                   state, max(first[ctx.worker], inner.local_batch_degree)),
               run_info={_hosts.RETRIES: retries})
