"""Trains a config — shipped, a file of yours, or ``module:function`` — in any mode.

  python experiments/train.py --config=wide_deep --strategy=hybrid --mesh=4x2 \\
      --jax_num_cpu_devices=8 --steps=100 --workdir=runs/wd

Every option of a run is a field of `experiments.configs.Config`, set with ``--set key=value``
(``--set mode=tokens``, ``--set policy=lbbsp``, ``--set slowdown=static:1,1,1,3``); the flags
below are shorthands for the common ones. ``mode`` picks the step program: ``spmd`` (one mesh),
``shares`` (per-worker batch shares, LB-BSP), ``tokens`` (Fela's token queue), ``pipeline``
(stages on device groups; under several workers, one SDPipe replica per worker, grouped by the
``sync`` policy), ``plan`` (a Fela plan: each sub-model on its group of workers with its own
layout; one SPMD step, or stages on the groups), ``ps`` (a parameter server: under
``launch --servers K`` the last K processes serve, the workers push and pull; ``--set ps=…``
picks bsp, asp, ssp, eager pull and the staleness-aware rate); ``auto`` is plan given a plan,
ps in a job with servers, else spmd on one process and shares under several workers. All of
them run in one loop with the same checkpoints, metrics and telemetry.

  python -m hetjax.launch --workers 4 --servers 1 --network link:1:10 -- python \\
      experiments/train.py --config=mlp --set ps=asp,eager,lr=staleness --workdir=runs/ps

Under ``python -m hetjax.launch --workers N …`` (or SLURM, Open MPI, Kubernetes, Cloud TPU) it runs
one worker of a multi-worker job (``--mesh`` is then the per-worker mesh) and worker 0 writes
``telemetry.jsonl`` (per-step, per-worker timings) beside the metrics:

  python -m hetjax.launch --workers 4 --slowdown static:1,1,1,3 -- \\
      python experiments/train.py --config=mlp --mesh=1x1 --policy=lbbsp --workdir=runs/bsp

Pipeline replicas (each worker one replica of the whole pipeline, worker 0 also runs the group
scheduler; each replica checkpoints its own parameters under ``checkpoints/replica-W``):

  python -m hetjax.launch --workers 2 --timeout 300 -- python experiments/train.py \\
      --config=mlp --set mode=pipeline --set sync=sdpipe --slowdown persistent:1:3

A slowdown makes every worker a host of known speed: its step padded by sleep to rows × a
calibrated per-row cost × its slowdown. ``--resume`` continues the run in ``--workdir`` from its
last checkpoint, the policy's state (shares, predictor history; a sync policy's windows, epoch
and group numbers) included; replicas resume from the latest step every one of them saved.

Under ``launch --max-restarts N`` a restarted run resumes on its own (no ``--resume`` to add;
``--overwrite`` is ignored after the first launch): the rows of steps lost with the failed
launch leave ``metrics.jsonl`` and ``telemetry.jsonl``, ``restarts.jsonl`` gets one row per
restart (cause, step resumed from, steps lost) and ``summary.json`` counts them. On fewer
workers (``--min-workers``) the parameters and optimizer state restore onto the new layout with
the same global batch, and the shares start over from the survivors' measured speeds. Every
worker reports its progress to a stall watchdog (`hetjax.runtime.ProgressWatchdog`).

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

from absl import flags

from experiments import _cli, _elastic, _programs, _ps_train, configs
from hetjax import ConfigError, checkpoint, pipeline, runtime, train
from hetjax.pipeline import PipelineTrainer
from hetjax.report import summary_fields

_CONFIG = flags.DEFINE_string(
    'config', None, f'a config name ({", ".join(configs.names())}), a file.py defining '
    'get_config(), or module:function returning a Config')
_SET = flags.DEFINE_multi_string('set', [], 'override a config field: key=value (repeatable)')
_STEPS = flags.DEFINE_integer('steps', None, 'total steps (default: the config\'s)')
_WORKDIR = flags.DEFINE_string('workdir', None, 'run directory (default: runs/CONFIG)')
_RESUME = flags.DEFINE_bool('resume', False, 'continue from the latest checkpoint in --workdir')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'delete an existing run in --workdir first')
# Shorthands for config fields (each is the same as --set FIELD=VALUE).
_SHORTHANDS = {
    'mode': flags.DEFINE_string('mode', None, 'spmd, shares, tokens, pipeline, plan or auto'),
    'strategy': flags.DEFINE_string('strategy', None, 'parallel strategy (default: the config\'s)'),
    'mesh': flags.DEFINE_string('mesh', None, 'mesh shape data x model, e.g. 4x2'),
    'plan': flags.DEFINE_string('plan', None, 'a plan JSON (experiments/plan.py --json)'),
    'policy': flags.DEFINE_string(
        'policy', None, 'share policy: uniform (BSP), proportional, '
        'lbbsp[-last|-ewma|-ar|-narx], lbbsp-gpu, oracle'),
    'shares': flags.DEFINE_list('shares', None, 'fixed per-worker batch shares'),
    'bucket': flags.DEFINE_integer('bucket', None, 'shares are multiples of this (0: automatic)'),
    'memory_caps': flags.DEFINE_list('memory_caps', None, 'most rows each worker can hold'),
    'slowdown': flags.DEFINE_string('slowdown', None, 'emulated slowdown trace, e.g. static:1,3'),
    'token_rows': flags.DEFINE_integer('token_rows', None, 'rows per token (tokens mode)'),
    'sync': flags.DEFINE_string('sync', None, 'pipeline replicas\' sync policy: sdpipe, '
                                'all-reduce, random-pairs or periodic-average'),
    'compilation_cache': flags.DEFINE_bool(
        'compilation_cache', None, 'keep compiled programs across runs (~/.cache/hetjax/jax)'),
}


def _config() -> configs.Config:
  if not _CONFIG.value:
    raise ConfigError(f'--config is required: one of {", ".join(configs.names())}, a file.py, '
                      'or module:function')
  config = configs.override(configs.load(_CONFIG.value), _SET.value)
  cli = {k: f.value for k, f in _SHORTHANDS.items()} | {'steps': _STEPS.value}
  assignments = []
  for key, value in cli.items():
    if value is None:
      continue
    if isinstance(value, list):  # a flag list: a tuple of integers
      value = ','.join(value)
      assignments.append(f'{key}=({value},)')
    else:
      assignments.append(f'{key}={value}')
  return configs.override(config, assignments)


def _prepare_workdir(workdir: pathlib.Path, resume: bool) -> None:
  if runtime.restart_attempt() > 0:  # a restart: the run dir is this job's, kept as it is
    workdir.mkdir(parents=True, exist_ok=True)
    return
  exists = (workdir / 'checkpoints').exists() or (workdir / 'metrics.jsonl').exists()
  if exists and not resume:
    if not _OVERWRITE.value:
      raise ConfigError(f'{workdir} already holds a run; pass --resume or --overwrite')
    shutil.rmtree(workdir)
  if resume and not exists:
    raise ConfigError(f'--resume: no run in {workdir}')
  workdir.mkdir(parents=True, exist_ok=True)


def _restore(ckpt, built, meta, resume, step=None, reseed=None):
  """The state and policy state to start from: fresh, or the checkpoint's (``resume``) at
  ``step`` (default: the latest); ``reseed(saved meta)`` gives the policy's state when the
  checkpoint was saved by another number of workers."""
  program, policy = built.program, built.policy
  if not resume:
    return program.init_state(), None
  saved = ckpt.read_meta(step)
  checkpoint.check_compatible(saved, meta, str(ckpt.directory))
  # A pipeline's step is a host int, not an array: its restore target carries the saved one.
  abstract = (program.abstract_state(saved['step'])
              if isinstance(program, PipelineTrainer | pipeline.ReplicaDriver)
              else program.abstract_state())
  state, saved = ckpt.restore(abstract, step)
  checkpoint.check_compatible(saved, meta, str(ckpt.directory))  # an older step if it skipped
  if policy is None or 'policy' not in saved:
    return state, None
  if saved.get('policy_name') != policy.name:
    print(f'resume: the checkpoint\'s policy is {saved.get("policy_name")!r}, this run\'s '
          f'{policy.name!r}: its state starts fresh', flush=True)
    return state, None
  if saved.get('layout', {}).get('workers') != meta['layout']['workers']:
    return state, reseed(saved)  # shares of other workers: derived anew
  return state, ckpt.policy_state(saved, policy.init())


def _replica_checkpoints(workdir, ctx, channel, resume):
  """This replica's checkpointer, and the step the replicas resume from (``resume``): the
  latest one every replica saved."""
  ckpt = pipeline.ReplicaCheckpointer(workdir / 'checkpoints' / f'replica-{ctx.worker}')
  if not resume:
    return ckpt, None
  channel.set(f'resume/{ctx.worker}', ckpt.latest_step() or 0)
  steps = [channel.get(f'resume/{w}') for w in range(ctx.workers)]
  if min(steps) == 0:
    raise ConfigError(f'--resume: replica {steps.index(0)} has no checkpoint in '
                      f'{workdir / "checkpoints"}')
  return ckpt, min(steps)


def _probe_speeds(built, state, telemetry, ctx, policy_state):
  """Measures each worker's speed on its first share (padded to its emulated host) and writes
  ``cluster.json``; the chief prints it."""
  program, policy = built.program, built.policy
  first = policy.update(policy.init() if policy_state is None else policy_state, None)[0]
  rows = (program.tokens.token_rows if built.mode is configs.Mode.TOKENS
          else max(first[ctx.worker], getattr(program, 'sync', program).local_batch_degree))
  speed = program.measure_speed(state, rows)
  cluster = runtime.discover_cluster(speed, telemetry.channel)
  if ctx.is_chief:
    (telemetry.path.parent / 'cluster.json').write_text(
        json.dumps(cluster.to_json(), indent=2) + '\n')
    print('workers: ' + ', '.join(f'{w.worker}: {w.speed:,.0f} samples/s on {len(w.devices)} '
                                  f'{w.device_kind}' for w in cluster.workers), flush=True)


def run() -> dict | None:
  ctx = runtime.initialize()
  config = _config()
  if config.compilation_cache:
    runtime.enable_compilation_cache()
  workdir = pathlib.Path(_WORKDIR.value or f'runs/{pathlib.Path(_CONFIG.value).stem}')
  channel = runtime.Channel(f'train/{workdir}') if ctx.workers > 1 else None
  resume = _elastic.auto_resume(_RESUME.value, workdir)
  if _programs.mode_of(config, ctx) is configs.Mode.PS:
    return _ps_train.run(config, ctx, channel, workdir,
                         prepare=lambda: _prepare_workdir(workdir, resume), resume=resume)
  built = _programs.build(config, ctx, channel)
  program, policy = built.program, built.policy
  multi = built.mode in (configs.Mode.SHARES, configs.Mode.TOKENS)

  if ctx.is_chief:
    _prepare_workdir(workdir, resume)
  if channel:
    channel.barrier('workdir-ready')
  task = program.task
  meta = {
      'task': {'name': task.name, **task.config},
      'data': {'seed': config.seed, 'global_batch': config.global_batch},
      'layout': {'mode': built.mode.value, 'plan': config.plan, 'strategy': config.strategy,
                 'mesh': config.mesh, 'workers': ctx.workers,
                 'hosts': list(runtime.hosts(ctx.workers))},
      'policy_name': None if policy is None else policy.name,
  }
  replicas = isinstance(program, pipeline.ReplicaDriver)
  if replicas and runtime.original_workers(ctx.workers) > ctx.workers:
    raise ConfigError(f'pipeline replicas cannot go on with {ctx.workers} of their '
                      f'{runtime.original_workers(ctx.workers)} workers (each replica checkpoints '
                      'its own parameters): run them with --min-workers equal to --workers')
  if replicas:
    ckpt, resume_step = _replica_checkpoints(workdir, ctx, channel, resume)
  elif isinstance(program, PipelineTrainer) and ctx.workers > 1:  # stages on their processes
    ckpt, resume_step = pipeline.StageCheckpointer(workdir / 'checkpoints', program,
                                                   channel.barrier), None
  else:
    ckpt, resume_step = checkpoint.Checkpointer(workdir / 'checkpoints',
                                                asynchronous=config.checkpoint_async), None
  logger = telemetry = watchdog = None
  segment: dict[str, list] = {}
  report = None
  try:
    state, policy_state = _restore(
        ckpt, built, meta, resume, resume_step,
        reseed=lambda saved: _elastic.reseed_policy(policy, saved, workdir, ctx, channel))
    start = int(state.step)
    if ctx.is_chief and runtime.restart_attempt() > 0:
      _elastic.record_restart(workdir, start, ctx.workers)
    elif ctx.is_chief and resume:
      _elastic.trim_after(workdir, start)
    hooks = [ckpt.hook(meta, every=config.checkpoint_every),
             train.Hook(lambda i: segment.setdefault('first', list(i.stats.rows))),
             train.Hook(lambda i: segment.__setitem__('last', list(i.stats.rows)))]
    if multi:
      telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers,
                                            workdir / 'telemetry.jsonl')
      hooks.append(train.Hook(lambda i: telemetry.record(i.stats.local)))
    if ctx.is_chief:
      (workdir / 'config.json').write_text(json.dumps(config.to_json(), indent=2) + '\n')
      run_info = {'workers': ctx.workers, 'global_batch': config.global_batch,
                  'model': task.name, 'mode': built.mode.value,
                  'slowdown': config.slowdown or ctx.slowdown,
                  'policy': None if policy is None or replicas else policy.name,
                  'sync': config.sync if replicas else None,
                  'host_row_s': getattr(built.host, 'row_s', None)}
      (workdir / 'run.json').write_text(json.dumps(run_info, indent=2) + '\n')
      layout = (f'plan {config.plan}' if config.plan else
                'rounds of scheduled model parallelism' if built.mode is configs.Mode.SCHMP
                else f'{config.strategy} on mesh {config.mesh}')
      print(f'{task.name}: {built.mode.value}, {layout} ({built.devices}), global batch '
            f'{config.global_batch}, steps {start}→{config.steps}, run dir {workdir}', flush=True)
      logger = train.MetricsLogger(
          workdir / 'metrics.jsonl', config.global_batch, config.steps, every=config.log_every)
      hooks.insert(0, logger.hook())
    if multi and start < config.steps:
      _probe_speeds(built, state, telemetry, ctx, policy_state)
    if channel is not None:  # reports after the other hooks: a worker stuck in one is named
      watchdog = _elastic.watchdog(channel, ctx.worker, ctx.workers)
      hooks.append(train.Hook(lambda i: watchdog.report(i.step)))
    if replicas and start < config.steps:  # compiles and connects the groups before the clock
      program.warm_up(state)               # of the scheduler starts (else the first steps
                                           # would time out waiting for a compiling replica)
    for _ in train.training_steps(program, state, config.steps, hooks, policy, policy_state):
      pass
  finally:
    for closable in (watchdog, logger, telemetry, ckpt):
      if closable:
        closable.close()
    if hasattr(program, 'close'):
      program.close()
    if replicas:  # once every replica has left, the scheduler stops: its report
      report = policy.close()
  if not ctx.is_chief:
    return None
  # Throughput as `python -m hetjax.report` computes it (warm-up and compiling steps left out).
  summary = logger.summary() | summary_fields(workdir) | {
      'checkpoint_steps': ckpt.all_steps(), 'first_shares': segment.get('first'),
      'last_shares': segment.get('last')} | _elastic.summary_fields(workdir)
  if report is not None:
    summary['sync'] = {k: v for k, v in report.to_json().items() if k != 'policy'}
  (workdir / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
  print('summary: ' + ', '.join(f'{k}={v}' for k, v in summary.items()), flush=True)
  return summary


if __name__ == '__main__':
  _cli.run_main('train.py', run)
