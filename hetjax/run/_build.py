"""Each mode's builder: from a `Config` to the `Built` its runner drives on this worker.

`hetjax.run.MODES` holds one entry per mode, with its builder from here (mode ps's is
`hetjax.run._ps_run.build`); which builder runs, and which options a mode refuses, is decided
there, so a builder reads only what its own mode takes. Every builder returns a complete
`Built` (`_complete`): the step program, the policy that decides its steps, the host, the
checkpointer, the restore target and the extras, so the runner (`hetjax.run.train`) runs them
all with one loop, one checkpoint protocol and one set of hooks.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from hetjax import (
  ConfigError,
  balance,
  emulation,
  pipeline,
  planner,
  runtime,
  schmp,
  sharding,
  train,
)
from hetjax.core import ShareRules
from hetjax.pipeline import PipelineTrainer
from hetjax.run import _comm_options, _hosts, _replicas, _restarts, _rules
from hetjax.run._built import Built, default_checkpoints
from hetjax.run._config import Config, Mode
from hetjax.run._sections import check_rounds
from hetjax.run._task import make_task, optimizer_of


def _complete(config: Config, ctx: runtime.WorkerContext, built: Built) -> Built:
  """``built`` with what every mode but ps shares filled in where its builder left it out: the
  first line's description, this worker's index, one `Checkpointer` of the whole state, the
  program's abstract state as the restore target, and ``run.json``'s policy and hosts."""
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


def _model(config: Config):
  """(the task, its optimizer, the mesh shape) of a mode that trains a model."""
  return (make_task(config), optimizer_of(config)[0],
          sharding.parse_mesh_shape(config.parallelism.mesh))


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


def build_spmd(config: Config, ctx: runtime.WorkerContext, channel) -> Built:
  """Mode spmd: one jitted step over a mesh of every device of the job, 'data' across its
  workers (`hetjax.train.Trainer`)."""
  task, optimizer, mesh_shape = _model(config)
  mesh = sharding.make_mesh(mesh_shape)
  trainer = train.Trainer(task, optimizer, config.data.global_batch, mesh, _rules.rules_of(config),
                          config.data.seed, accumulate=config.optimizer.accumulate)
  devices = f'{len(trainer.mesh.devices.flat)} {jax.devices()[0].platform} devices'
  if ctx.workers > 1:
    devices += f' of {ctx.workers} workers'
  _announce_fsdp(config, ctx, trainer)
  return _complete(config, ctx, Built(trainer, None, devices, Mode.SPMD))


def _announce_fsdp(config, ctx, trainer) -> None:
  """The chief prints `fsdp_notice` of a run under FSDP (modes spmd, shares and tokens)."""
  if (train.Strategy.parse(config.parallelism.strategy) is train.Strategy.FSDP and ctx.is_chief
      and (notice := fsdp_notice(trainer))):
    print(notice, flush=True)


def build_plan(config: Config, ctx: runtime.WorkerContext, channel) -> Built:
  """Mode plan: the plan's program, one SPMD step on one process's devices, or stages on its
  groups of workers."""
  if not config.parallelism.plan:
    raise ConfigError('mode plan needs a plan: --plan=PATH (experiments/plan.py --json writes '
                      'one; hetjax/configs/plans/ has hand-written ones)')
  task, optimizer, _ = _model(config)
  trace = _trace(config, ctx)
  if trace is not None and ctx.workers == 1:
    raise ConfigError('a slowdown emulates workers of known speed, and this plan runs on one '
                      'process: launch several workers (python -m hetjax.launch)')
  plan = planner.Plan.load(config.parallelism.plan, sharding.submodel_names(task.make_model))
  if plan.devices != jax.device_count() and runtime.original_workers(ctx.workers) > ctx.workers:
    plan = _restarts.replan(plan, task, config.data.global_batch, ctx, channel)  # workers were lost
  cap = runtime.device_memory(jax.local_devices())
  compiled = planner.compile_plan(plan, task, optimizer, config.data.global_batch, cap,
                                  seed=config.data.seed,
                                  micro_batches=config.pipeline.micro_batches,
                                  schedule=config.pipeline.schedule,
                                  accumulate=config.optimizer.accumulate)
  trainer, platform = compiled.trainer, jax.devices()[0].platform
  if not compiled.stage_memory:  # one SPMD step (`train.Trainer`)
    return _complete(config, ctx, Built(
        trainer, None, f'plan {plan.name!r}: {plan.devices} {platform} devices', Mode.PLAN,
        describe=f'plan, plan {config.parallelism.plan} (plan {plan.name!r}: {plan.devices} '
        f'{platform} devices)'))
  groups = ', '.join(f'{"+".join(names)} on {len(mesh.devices.flat)}'
                     for names, mesh in zip(trainer.stage_links, trainer.meshes, strict=True))
  devices = (f'plan {plan.name!r}: {trainer.stages} stages ({groups} {platform} devices), '
             f'{config.pipeline.micro_batches * config.optimizer.accumulate} micro-batches, '
             f'{config.pipeline.schedule}')
  if trace is not None:  # paced per action: no cost per row to record (Built.host stays None)
    _hosts.stage_host(trainer, compiled.programs, trace, ctx, channel, _hosts.MARGIN)
  checkpoints = None
  if ctx.workers > 1:  # stages on their processes: each saves its own stages' state
    checkpoints = lambda workdir, resume: pipeline.StageCheckpointer(  # noqa: E731
        workdir / 'checkpoints', trainer)
  return _complete(config, ctx, Built(trainer, None, devices, Mode.PLAN,
                                      checkpoints=checkpoints,
                                      restore_target=trainer.abstract_state))


def build_pipeline(config: Config, ctx: runtime.WorkerContext, channel) -> Built:
  """Mode pipeline: stages on groups of this process's devices; under several workers each is
  one SDPipe replica of the whole pipeline, grouped by the sync policy, or under local SGD
  (``local.inner_steps``) an outer step from the replicas' mean every round (`_replicas`)."""
  if ctx.workers > 1:
    _replicas.check_local(config)  # before anything is built
  task, optimizer, _ = _model(config)
  trainer = PipelineTrainer(task, optimizer, config.data.global_batch, config.pipeline.stages,
                            config.pipeline.micro_batches * config.optimizer.accumulate,
                            config.pipeline.schedule, jax.local_devices(), seed=config.data.seed)
  devices = (f'{trainer.stages} stages x {trainer.meshes[0].size} '
             f'{jax.devices()[0].platform} devices, {config.pipeline.schedule}')
  if ctx.workers == 1:  # a pipeline's step is a host int: its restore target carries the saved one
    return _complete(config, ctx, Built(trainer, None, devices, Mode.PIPELINE,
                                        restore_target=trainer.abstract_state))
  sync = f'sync {config.pipeline.sync}'
  if config.local.inner_steps:
    sync += f', local SGD every {config.local.inner_steps} steps (outer {config.local.outer})'
  return _complete(config, ctx, _replicas.build(
      config, ctx, channel, trainer, _trace(config, ctx),
      Built(trainer, None, f'{ctx.workers} replicas of {devices}, {sync}', Mode.PIPELINE)))


def build_schmp(config: Config, ctx: runtime.WorkerContext, channel) -> Built:
  """Mode schmp: a SchMP app's rounds over every device of the job, and its scheduler."""
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
  return _complete(config, ctx, Built(program, policy, where, Mode.SCHMP, host,
                                      describe=f'schmp, rounds of scheduled model parallelism '
                                      f'({where})', run_info={_hosts.RETRIES: retries}))


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


def _share_policy(config, ctx, degree: int, trace, devices: tuple[int, ...],
                  known: balance.KnownCosts | None = None) -> tuple[Any, int | None]:
  """(the share policy, its bucket — None when shares never change). ``degree``: the least
  common multiple of the workers' local degrees; ``devices``: each worker's device count
  (uniform shares are equal per device); ``known``: what the hosts and links are known to
  cost, for the policies that plan from it (`hetjax.balance.make_policy`)."""
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
  policy = balance.make_policy(config.balance.policy, rules, trace, known)
  return policy, None if policy.name == balance.PolicyName.UNIFORM.value else bucket


def build_tokens(config: Config, ctx: runtime.WorkerContext, channel) -> Built:
  """Mode tokens: Fela's token queue, workers pulling fixed-size pieces of the batch
  (`hetjax.train.TokenTrainer`)."""
  task, optimizer, mesh_shape = _model(config)
  trace = _trace(config, ctx)
  axis_rules = _rules.rules_of(config)  # the strategy's tables with parallelism.rules on top
  degree = train.local_batch_degree(axis_rules, mesh_shape)
  devices = f'{ctx.workers} workers x {jax.local_device_count()} {jax.devices()[0].platform} ' \
            'devices'
  counts = tuple(sum(d.process_index == w for d in jax.devices()) for w in range(ctx.workers))
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
  host = _hosts.emulated_host(ctx, trainer, trace, channel,
                              host_row_s=config.emulation.host_row_s,
                              host_fixed_s=config.emulation.host_fixed_s,
                              token_rows=rules.token_rows, record=retries.append)
  return _complete(config, ctx, Built(
      trainer, rules, devices, Mode.TOKENS, host,
      measure_speed=lambda state, first: trainer.measure_speed(state, rules.token_rows),
      run_info={_hosts.RETRIES: retries}))


def _local_trainer(config: Config, task, optimizer, mesh_shape, axis_rules, bucket):
  """`hetjax.train.LocalTrainer` from ``config.local`` (mode shares under local SGD)."""
  h = config.local.inner_steps
  if config.parallelism.overlap:
    raise ConfigError('local.inner_steps and parallelism.overlap both schedule the exchange: '
                      'local SGD exchanges once a round, with nothing to overlap; drop one')
  check_rounds(config)
  outer = train.outer_optimizer(config.local.outer, config.local.outer_lr,
                                config.local.outer_momentum)
  return train.LocalTrainer(task, optimizer, config.data.global_batch, mesh_shape, axis_rules,
                            config.data.seed, bucket=bucket, steps_per_round=h, outer=outer,
                            cutoff=config.local.cutoff, int8=config.local.exchange == 'int8',
                            overlap_steps=config.local.overlap_steps,
                            fragments=config.local.fragments,
                            accumulate=config.optimizer.accumulate,
                            granularity=config.balance.granularity)


def build_shares(config: Config, ctx: runtime.WorkerContext, channel) -> Built:
  """Mode shares: each worker computes its share of the batch, re-sized by a policy or
  fixed; the gradients summed (`hetjax.train.WorkerTrainer`, `OverlapTrainer` under
  ``overlap``, or every ``local.inner_steps`` by `LocalTrainer`)."""
  task, optimizer, mesh_shape = _model(config)
  trace = _trace(config, ctx)
  axis_rules = _rules.rules_of(config)  # the strategy's tables with parallelism.rules on top
  devices = f'{ctx.workers} workers x {jax.local_device_count()} {jax.devices()[0].platform} ' \
            'devices'
  counts = tuple(sum(d.process_index == w for d in jax.devices()) for w in range(ctx.workers))
  # Workers of different device counts: shares are multiples of every worker's degree.
  degree = math.lcm(*(train.local_batch_degree(axis_rules, mesh_shape, w)
                      for w in range(ctx.workers)))
  if len(set(counts)) > 1:
    devices = f'{ctx.workers} workers of {",".join(map(str, counts))} ' \
              f'{jax.devices()[0].platform} devices'
  policy, bucket = _share_policy(config, ctx, degree, trace, counts)
  links = _comm_options.links_of(config, ctx, ctx.workers)
  if config.local.inner_steps:
    trainer = _local_trainer(config, task, optimizer, mesh_shape, axis_rules, bucket)
    policy = balance.RoundPolicy(policy, config.local.inner_steps, config.local.overlap_steps)
    devices += f', local SGD every {config.local.inner_steps} steps'
  elif config.parallelism.overlap:
    trainer = train.OverlapTrainer(task, optimizer, config.data.global_batch, mesh_shape,
                                   axis_rules, seed=config.data.seed, bucket=bucket,
                                   bucket_bytes=config.parallelism.bucket_bytes or None,
                                   accumulate=config.optimizer.accumulate,
                                   estimate_scale=config.parallelism.overlap_scale,
                                   estimate=config.parallelism.overlap_estimate,
                                   granularity=config.balance.granularity)
    devices += ', all-reduce scheduler'
  else:
    trainer = train.WorkerTrainer(task, optimizer, config.data.global_batch, mesh_shape,
                                  axis_rules, config.data.seed, bucket=bucket,
                                  accumulate=config.optimizer.accumulate,
                                  granularity=config.balance.granularity)
  inner = trainer.sync if config.parallelism.overlap else trainer  # the synchronous pieces
  inner.check_shares(policy.update(policy.init(), None)[0])
  _announce_fsdp(config, ctx, inner)
  retries = []
  host = _hosts.emulated_host(ctx, inner, trace, channel, host_row_s=config.emulation.host_row_s,
                              host_fixed_s=config.emulation.host_fixed_s, record=retries.append)
  if links is not None:  # the host on the links: the step's exchange is padded too
    trainer.use_host(emulation.LinkedHost(links, ctx.worker, host))
  if host is not None or links is not None:  # the policy knows the hosts and links as built
    # A synchronous step is compute plus the worker's own exchange; an overlapped one hides it.
    # Local SGD's exchange is once a round: a step's part of it.
    transfer = () if links is None or config.parallelism.overlap else tuple(
        t / max(config.local.inner_steps, 1) for t in links.exchange_s(trainer.all_reduce_bytes))
    known = balance.KnownCosts(None if host is None else host.row_s,
                               0.0 if host is None else host.fixed_s, counts, transfer)
    policy = _share_policy(config, ctx, degree, trace, counts, known)[0]
    if config.local.inner_steps:
      policy = balance.RoundPolicy(policy, config.local.inner_steps, config.local.overlap_steps)
  return _complete(config, ctx, Built(
      trainer, policy, devices, Mode.SHARES, host,
      measure_speed=lambda state, first: trainer.measure_speed(
          state, max(first[ctx.worker], inner.local_batch_degree)),
      run_info={_hosts.RETRIES: retries}))
