"""The runner: one run of any mode from a `Config`, with checkpoints, resume, metrics,
telemetry and the stall watchdog (`train`, which ``hetjax-train`` calls after parsing flags)."""

from __future__ import annotations

import json
import pathlib
import shutil

from hetjax import ConfigError, checkpoint, pipeline, runtime
from hetjax import train as train_lib
from hetjax.pipeline import PipelineTrainer
from hetjax.report import summary_fields
from hetjax.run import _ps_run, _restarts
from hetjax.run._build import build, mode_of
from hetjax.run._config import Config, Mode


def _prepare_workdir(workdir: pathlib.Path, resume: bool, overwrite: bool) -> None:
  if runtime.restart_attempt() > 0:  # a restart: the run dir is this job's, kept as it is
    workdir.mkdir(parents=True, exist_ok=True)
    return
  exists = (workdir / 'checkpoints').exists() or (workdir / 'metrics.jsonl').exists()
  if exists and not resume:
    if not overwrite:
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
  rows = (program.tokens.token_rows if built.mode is Mode.TOKENS
          else max(first[ctx.worker], getattr(program, 'sync', program).local_batch_degree))
  speed = program.measure_speed(state, rows)
  cluster = runtime.discover_cluster(speed, telemetry.channel)
  if ctx.is_chief:
    (telemetry.path.parent / 'cluster.json').write_text(
        json.dumps(cluster.to_json(), indent=2) + '\n')
    print('workers: ' + ', '.join(f'{w.worker}: {w.speed:,.0f} samples/s on {len(w.devices)} '
                                  f'{w.device_kind}' for w in cluster.workers), flush=True)


def train(config: Config, workdir: str | pathlib.Path | None = None, *, resume: bool = False,
          overwrite: bool = False) -> dict | None:
  """Trains ``config`` in its mode, on this process's part of the job: what ``hetjax-train``
  (``experiments/train.py``) does after parsing its flags, callable from Python (a notebook).

  Under ``python -m hetjax.launch`` (or any `hetjax.runtime.initialize` cluster) each process
  calls it; one process alone runs a one-worker job. The run directory gets ``config.json``,
  ``run.json``, ``metrics.jsonl``, checkpoints under ``checkpoints/``, ``telemetry.jsonl``
  (several workers) and ``summary.json``.

  Example::

    from hetjax import run
    summary = run.train(run.load_config('mlp'), 'runs/mlp', overwrite=True)

  Args:
    config: the run's `Config` (`load_config`, `override`).
    workdir: the run directory (default ``runs/MODEL``).
    resume: continue from the latest checkpoint in ``workdir`` (a restarted launch resumes on
      its own).
    overwrite: delete an existing run in ``workdir`` first (else an existing run is an error).

  Returns:
    Worker 0's summary (``summary.json``'s fields); None on the other processes.

  Raises:
    ConfigError: bad input, one line (an unknown model, a mesh that does not match the devices,
      a batch that does not divide, a checkpoint of another model, an existing run).
  """
  ctx = runtime.initialize()
  if config.compilation_cache:
    runtime.enable_compilation_cache()
  workdir = pathlib.Path(workdir or f'runs/{config.model.rpartition(":")[2] or config.model}')
  channel = runtime.Channel(f'train/{workdir}') if ctx.workers > 1 else None
  resume = _restarts.auto_resume(resume, workdir)
  if mode_of(config, ctx) is Mode.PS:
    return _ps_run.run(config, ctx, channel, workdir,
                       prepare=lambda: _prepare_workdir(workdir, resume, overwrite),
                       resume=resume)
  built = build(config, ctx, channel)
  program, policy = built.program, built.policy
  multi = built.mode in (Mode.SHARES, Mode.TOKENS)

  if ctx.is_chief:
    _prepare_workdir(workdir, resume, overwrite)
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
        reseed=lambda saved: _restarts.reseed_policy(policy, saved, workdir, ctx, channel))
    start = int(state.step)
    if ctx.is_chief and runtime.restart_attempt() > 0:
      _restarts.record_restart(workdir, start, ctx.workers)
    elif ctx.is_chief and resume:
      _restarts.trim_after(workdir, start)
    hooks = [ckpt.hook(meta, every=config.checkpoint_every),
             train_lib.Hook(lambda i: segment.setdefault('first', list(i.stats.rows))),
             train_lib.Hook(lambda i: segment.__setitem__('last', list(i.stats.rows)))]
    if multi:
      telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers,
                                            workdir / 'telemetry.jsonl')
      hooks.append(train_lib.Hook(lambda i: telemetry.record(i.stats.local)))
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
                'rounds of scheduled model parallelism' if built.mode is Mode.SCHMP
                else f'{config.strategy} on mesh {config.mesh}')
      print(f'{task.name}: {built.mode.value}, {layout} ({built.devices}), global batch '
            f'{config.global_batch}, steps {start}→{config.steps}, run dir {workdir}', flush=True)
      logger = train_lib.MetricsLogger(
          workdir / 'metrics.jsonl', config.global_batch, config.steps, every=config.log_every)
      hooks.insert(0, logger.hook())
    if multi and start < config.steps:
      _probe_speeds(built, state, telemetry, ctx, policy_state)
    if channel is not None:  # reports after the other hooks: a worker stuck in one is named
      watchdog = _restarts.watchdog(channel, ctx.worker, ctx.workers)
      hooks.append(train_lib.Hook(lambda i: watchdog.report(i.step)))
    if replicas and start < config.steps:  # compiles and connects the groups before the clock
      program.warm_up(state)               # of the scheduler starts (else the first steps
                                           # would time out waiting for a compiling replica)
    for _ in train_lib.training_steps(program, state, config.steps, hooks, policy, policy_state):
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
      'last_shares': segment.get('last')} | _restarts.summary_fields(workdir)
  if report is not None:
    summary['sync'] = {k: v for k, v in report.to_json().items() if k != 'policy'}
  (workdir / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
  print('summary: ' + ', '.join(f'{k}={v}' for k, v in summary.items()), flush=True)
  return summary
