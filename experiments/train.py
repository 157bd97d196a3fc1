"""Trains one of the shipped configs on the local devices.

  python experiments/train.py --config=wide_deep --strategy=hybrid --mesh=4x2 \
      --jax_num_cpu_devices=8 --steps=100 --workdir=runs/wd

Under ``python -m hetjax.launch --workers N …`` (or SLURM, Open MPI, Kubernetes, Cloud TPU) it runs
one worker of a multi-worker job: each worker computes its share of the global batch on its own
devices (``--mesh`` is then the per-worker mesh), gradients are combined across workers, and
worker 0 writes ``telemetry.jsonl`` (per-step, per-worker timings) beside the metrics:

  python -m hetjax.launch --workers 4 --slowdown static:1,1,1,3 -- \
      python experiments/train.py --config=mlp --mesh=1x1 --workdir=runs/bsp

Bad input (unknown config, model, strategy or field; a mesh that does not match the devices; a
batch that does not divide; a checkpoint of another model) prints one line and exits with 2.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

if __package__ in (None, ''):  # run as a script: make the checkout's packages importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
from absl import flags

import models
from experiments import _cli, configs
from hetjax import ConfigError, balance, checkpoint, planner, runtime, sharding, train

_CONFIG = flags.DEFINE_string('config', None, f'config name: one of {configs.names()}')
_SET = flags.DEFINE_multi_string('set', [], 'override a config field: key=value (repeatable)')
_STRATEGY = flags.DEFINE_string('strategy', None, 'parallel strategy (default: the config\'s)')
_MESH = flags.DEFINE_string('mesh', None, 'mesh shape data x model, e.g. 4x2')
_STEPS = flags.DEFINE_integer('steps', None, 'total steps (default: the config\'s)')
_WORKDIR = flags.DEFINE_string('workdir', None, 'run directory (default: runs/CONFIG)')
_RESUME = flags.DEFINE_bool('resume', False, 'continue from the latest checkpoint in --workdir')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'delete an existing run in --workdir first')
_SHARES = flags.DEFINE_list('shares', None, 'per-worker batch shares (default: uniform, i.e. BSP)')
_POLICY = flags.DEFINE_string(
    'policy', 'uniform', 'share policy of a multi-worker run: uniform (BSP), proportional, '
    'lbbsp[-last|-ewma|-ar|-narx], lbbsp-gpu, oracle')
_BUCKET = flags.DEFINE_integer(
    'bucket', None, 'shares are multiples of this (default: 1/16 of a uniform share)')
_DILATION_BASE = flags.DEFINE_float(
    'dilation_base', 1.0, 'multiply every worker\'s slowdown by this, so that workers sharing '
    'a few cores sleep most of a step and stop contending (4 workers on 2 cores: 4)')
_COMPILATION_CACHE = flags.DEFINE_bool(
    'compilation_cache', True, 'keep compiled programs across runs (~/.cache/hetjax/jax)')
_MEMORY_CAPS = flags.DEFINE_list(
    'memory_caps', None, 'most rows each worker can hold per step (one per worker, bucket multiples)')
_PLAN = flags.DEFINE_string(
    'plan', None, 'a plan JSON (experiments/plan.py --json, or experiments/plans/): its mesh and '
    'per-sub-model rules replace --strategy and --mesh; compiled and memory-checked first')
_SLOWDOWN = flags.DEFINE_string(
    'slowdown', None, 'emulated slowdown trace, e.g. static:1,3 (default: the launcher\'s)')


def _config() -> configs.Config:
  if not _CONFIG.value:
    raise ConfigError(f'--config is required: one of {", ".join(configs.names())}')
  config = configs.override(configs.load(_CONFIG.value), _SET.value)
  cli = {'strategy': _STRATEGY.value, 'mesh': _MESH.value, 'steps': _STEPS.value}
  config = configs.override(config, [f'{k}={v!r}' for k, v in cli.items() if v is not None])
  if config.steps < 1 or config.log_every < 1 or config.checkpoint_every < 1:
    raise ConfigError('steps, log_every and checkpoint_every must be positive')
  return config


def _prepare_workdir(workdir: pathlib.Path) -> None:
  exists = (workdir / 'checkpoints').exists() or (workdir / 'metrics.jsonl').exists()
  if exists and not _RESUME.value:
    if not _OVERWRITE.value:
      raise ConfigError(f'{workdir} already holds a run; pass --resume or --overwrite')
    shutil.rmtree(workdir)
  if _RESUME.value and not exists:
    raise ConfigError(f'--resume: no run in {workdir}')
  workdir.mkdir(parents=True, exist_ok=True)


def _multi_worker(ctx: runtime.WorkerContext) -> bool:
  return ctx.workers > 1 or bool(_SHARES.value or _SLOWDOWN.value or ctx.slowdown) \
      or _POLICY.value != 'uniform' or _DILATION_BASE.value != 1.0


class _FixedShares:
  """The shares given by --shares, every step."""

  name = 'fixed'

  def __init__(self, shares: tuple[int, ...]):
    self.values = shares

  def shares(self, step, history):
    return self.values


def _policy(config: configs.Config, ctx: runtime.WorkerContext, degree: int, trace):
  """(the share policy, its bucket — None when shares never change)."""
  if _SHARES.value:
    try:
      return _FixedShares(tuple(int(s) for s in _SHARES.value)), None
    except ValueError:
      raise ConfigError(f'--shares {",".join(_SHARES.value)} are not integers') from None
  # Default: 16 buckets per worker's uniform share, so a worker compiles only a few sizes.
  bucket = _BUCKET.value or degree * max(1, config.global_batch // (16 * ctx.workers * degree))
  if bucket < 1 or bucket % degree:
    raise ConfigError(f'--bucket {bucket} is not a positive multiple of the local data-parallel '
                      f'degree {degree}')
  caps = None
  if _MEMORY_CAPS.value:
    try:
      caps = tuple(int(c) for c in _MEMORY_CAPS.value)
    except ValueError:
      raise ConfigError(f'--memory_caps {",".join(_MEMORY_CAPS.value)} are not integers') from None
  rules = balance.ShareRules(config.global_batch, ctx.workers, bucket, maximum=caps)
  policy = balance.make_policy(_POLICY.value, rules, trace)
  return policy, None if isinstance(policy, balance.Uniform) else bucket


def _build(config, ctx, task, optimizer, strategy, mesh_shape):
  """The trainer, its state factory and the loop, for one process or for a worker of many."""
  if not _multi_worker(ctx):
    if _PLAN.value:
      plan = planner.Plan.load(_PLAN.value, sharding.submodel_names(task.make_model))
      cap = planner.device_memory(jax.devices())
      trainer = planner.compile_plan(plan, task, optimizer, config.global_batch, cap,
                                     seed=config.seed).trainer
      devices = f'plan {plan.name!r}: {plan.devices} {jax.devices()[0].platform} devices'
    else:
      mesh = sharding.make_mesh(mesh_shape)
      trainer = train.Trainer(
          task, optimizer, mesh, strategy.rules(), config.global_batch, config.seed)
      devices = f'{len(trainer.mesh.devices.flat)} {jax.devices()[0].platform} devices'
    return trainer, devices, lambda state, hooks, _: train.training_steps(
        trainer, state, config.steps, hooks)
  spec = _SLOWDOWN.value or ctx.slowdown
  trace = runtime.parse_slowdown(spec, ctx.workers) if spec else None
  dilation = None
  if trace or _DILATION_BASE.value != 1.0:
    trace = trace or runtime.parse_slowdown('none', ctx.workers)
    dilation = runtime.TimeDilation(trace, ctx.worker, _DILATION_BASE.value)
  policy, bucket = _policy(
      config, ctx, train.local_batch_degree(strategy.rules(), mesh_shape), trace)
  trainer = train.WorkerTrainer(task, optimizer, config.global_batch, mesh_shape,
                                strategy.rules(), config.seed, bucket=bucket)
  trainer.check_shares(tuple(policy.shares(0, [])))
  devices = f'{ctx.workers} workers x {jax.local_device_count()} {jax.devices()[0].platform} devices'

  def loop(state, hooks, telemetry):
    speed = train.measure_speed(trainer, state, max(policy.shares(0, [])[ctx.worker], 1),
                                dilation=dilation)
    cluster = runtime.discover_cluster(speed, telemetry.channel)
    if ctx.is_chief:
      (telemetry.path.parent / 'cluster.json').write_text(
          json.dumps(cluster.to_json(), indent=2) + '\n')
      print('workers: ' + ', '.join(f'{w.worker}: {w.speed:,.0f} samples/s on {len(w.devices)} '
                                    f'{w.device_kind}' for w in cluster.workers), flush=True)
    return train.worker_steps(trainer, state, config.steps, policy, dilation, telemetry, hooks)

  return trainer, devices, loop


def run() -> dict | None:
  ctx = runtime.initialize()
  if _COMPILATION_CACHE.value:
    runtime.enable_compilation_cache()
  config = _config()
  strategy = train.Strategy.parse(config.strategy)
  mesh_shape = sharding.parse_mesh_shape(config.mesh)
  task = models.make_task(config.model, **config.model_args)
  optimizer = train.Optimizer.parse(config.optimizer).make(config.learning_rate)
  if _PLAN.value and _multi_worker(ctx):
    raise ConfigError('--plan runs on the devices of one process; multi-worker runs take '
                      '--strategy and --mesh per worker')
  trainer, devices, loop = _build(config, ctx, task, optimizer, strategy, mesh_shape)

  workdir = pathlib.Path(_WORKDIR.value or f'runs/{_CONFIG.value}')
  if ctx.is_chief:
    _prepare_workdir(workdir)
  channel = runtime.Channel(f'train/{workdir}') if ctx.workers > 1 else None
  if channel:
    channel.barrier('workdir-ready')
  meta = {
      'task': {'name': task.name, **task.config},
      'data': {'seed': config.seed, 'global_batch': config.global_batch},
      'layout': ({'plan': _PLAN.value, 'workers': ctx.workers} if _PLAN.value else
                 {'strategy': strategy.value, 'mesh': config.mesh, 'workers': ctx.workers}),
  }
  ckpt = checkpoint.Checkpointer(workdir / 'checkpoints')
  logger = telemetry = None
  try:
    if _RESUME.value:
      checkpoint.check_compatible(ckpt.read_meta(), meta, str(ckpt.directory))
      state, _ = ckpt.restore(trainer.abstract_state())
    else:
      state = trainer.init_state()
    start = int(state.step)
    hooks = [ckpt.hook(meta, every=config.checkpoint_every)]
    if _multi_worker(ctx):
      telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers,
                                            workdir / 'telemetry.jsonl')
    if ctx.is_chief:
      (workdir / 'config.json').write_text(json.dumps(config.to_json(), indent=2) + '\n')
      run_info = {'workers': ctx.workers, 'global_batch': config.global_batch,
                  'model': task.name, 'slowdown': _SLOWDOWN.value or ctx.slowdown,
                  'policy': 'fixed' if _SHARES.value else _POLICY.value}
      (workdir / 'run.json').write_text(json.dumps(run_info, indent=2) + '\n')
      layout = f'plan {_PLAN.value}' if _PLAN.value else f'{strategy.value} on mesh {config.mesh}'
      print(f'{task.name}: {layout} ({devices}), global batch '
            f'{config.global_batch}, steps {start}→{config.steps}, run dir {workdir}', flush=True)
      logger = train.MetricsLogger(
          workdir / 'metrics.jsonl', config.global_batch, config.steps, every=config.log_every)
      hooks.insert(0, logger.hook())
    for _ in loop(state, hooks, telemetry):
      pass
  finally:
    for closable in (logger, telemetry, ckpt, getattr(trainer, 'programs', None)):
      if closable:
        closable.close()
  if not ctx.is_chief:
    return None
  summary = logger.summary() | {'checkpoint_steps': ckpt.all_steps()}
  (workdir / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
  print('summary: ' + ', '.join(f'{k}={v}' for k, v in summary.items()), flush=True)
  return summary


if __name__ == '__main__':
  _cli.run_main('train.py', run)
