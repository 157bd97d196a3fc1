"""The runner: one run of any mode from a `Config`, with checkpoints, resume, metrics,
telemetry and the stall watchdog (`train`, which ``hetjax-train`` calls after parsing flags)."""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
import time

from hetjax import ConfigError, balance, checkpoint, report, runtime, sharding
from hetjax import train as train_lib
from hetjax.report import summary_fields
from hetjax.run import _observe, _restarts, _rules
from hetjax.run._built import Built
from hetjax.run._config import Config
from hetjax.run._generate import sample_hook
from hetjax.run._modes import MODES, build
from hetjax.run._task import resolved, trains_app


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


def _restore(ckpt, built, meta, resume, reseed):
  """The state and policy state to start from: fresh, or (``resume``) the checkpointer's newest
  good checkpoint; ``reseed(saved meta)`` gives the policy's state when the checkpoint was
  saved by another number of workers."""
  program, policy = built.program, built.policy
  if not resume:
    return program.init_state(), None
  saved = ckpt.read_meta()
  checkpoint.check_compatible(saved, meta, str(ckpt.directory))
  state, saved = ckpt.restore(built.restore_target(saved['step']))
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


def _probe_speeds(built, state, telemetry, ctx, policy_state):
  """Measures each worker's speed on its first share (padded to its emulated host) and writes
  ``cluster.json``; the chief prints it."""
  policy = built.policy
  first = policy.update(policy.init() if policy_state is None else policy_state, None)[0]
  speed = built.measure_speed(state, first)
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
  called = time.time()  # goodput's wall time starts here: building the program is startup
  config = resolved(config)  # model.init's architecture: config.json is read back without it
  ctx = runtime.initialize()
  if config.parallelism.compilation_cache:
    runtime.enable_compilation_cache()
  model = config.model.name.partition(':')[0].rpartition('.')[2]  # 'pkg.mine:make' → 'mine'
  workdir = pathlib.Path(workdir or f'runs/{model}')
  channel = runtime.Channel(f'train/{workdir}') if ctx.workers > 1 else None
  resume = _restarts.auto_resume(resume, workdir)
  built = build(config, ctx, channel)  # every refusal before the run directory is touched
  sampler = None if built.serve is not None or not config.eval.sample else sample_hook(
      built.program, built.program.task, config.eval.sample, config.data.seed,
      config.eval.every, config.optimizer.steps, ctx.is_chief)
  if ctx.is_chief:
    _prepare_workdir(workdir, resume, overwrite)
  if channel:
    channel.barrier('workdir-ready')
  if built.serve is not None:  # a parameter server's process
    built.serve(workdir)
    return None
  return _drive(built, config, ctx, channel, workdir, resume, called, sampler)


def _drive(built: Built, config: Config, ctx: runtime.WorkerContext, channel, workdir, resume,
           called: float, sampler: train_lib.Hook | None = None):
  """The one loop of every mode over ``built``, with its checkpoints, resume, metrics,
  telemetry and watchdog; worker 0's summary."""
  program, policy = built.program, built.policy
  task = program.task
  meta = {
      'task': {'name': task.name, **task.config},
      'data': {'seed': config.data.seed, 'global_batch': config.data.global_batch},
      'layout': {'mode': built.mode.value, 'plan': config.parallelism.plan,
                 'strategy': config.parallelism.strategy, 'mesh': config.parallelism.mesh,
                 'workers': built.workers,
                 'hosts': list(runtime.hosts(built.workers))},
      'policy_name': None if policy is None else policy.name,
  }
  ckpt = built.checkpoints(workdir, resume)
  logger = telemetry = watchdog = state = writer = None
  evaluation = _observe.evaluation_of(config, task)
  segment: dict[str, list] = {}
  finished, ok = {}, False
  try:
    if built.start is not None:
      state, policy_state = built.start(resume)
    else:
      state, policy_state = _restore(
          ckpt, built, meta, resume,
          reseed=lambda saved: _restarts.reseed_policy(policy, saved, workdir, ctx, channel))
    start = int(state.step)
    if ctx.is_chief and runtime.restart_attempt() > 0:
      _restarts.record_restart(workdir, start, built.workers)
    elif ctx.is_chief and resume:
      _restarts.trim_after(workdir, start)
    if ctx.is_chief:  # before the hooks: it times the checkpoint and evaluation hooks
      launch = (report.Launch.RESTART if runtime.restart_attempt() > 0
                else report.Launch.RESUME if resume else report.Launch.START)
      logger, writer, observed = _observe.metrics_logger(config, built, workdir, evaluation,
                                                         launch, called)

    def timed(hook: train_lib.Hook, name: str) -> train_lib.Hook:
      """``hook`` as a long phase of the watchdog's (made below, before the first step: a slow
      save is not a stall), timed by the chief's logger."""
      phase = {'checkpoint': 'checkpoint save', 'eval': 'evaluation'}.get(name, name)

      def run(info: train_lib.StepInfo) -> None:
        with watchdog.busy(phase) if watchdog is not None else contextlib.nullcontext():
          hook.fn(info)

      watched = train_lib.Hook(run, every=hook.every, at_end=hook.at_end)
      return watched if logger is None else logger.timed(watched, name)
    # Evaluation first: the logger's line of the step carries its result.
    hooks = ([] if evaluation is None else [_observe.eval_hook(evaluation, program, config,
                                                               timed)])
    if sampler is not None:
      hooks.append(timed(sampler, 'sample'))
    hooks += [timed(_settled(ckpt.hook(meta, every=config.checkpoint.every), program,
                             config.checkpoint.every), 'checkpoint'),
              train_lib.Hook(lambda i: segment.setdefault('first', list(i.stats.rows))),
              train_lib.Hook(lambda i: segment.__setitem__('last', list(i.stats.rows)))]
    if built.measure_speed is not None:
      telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers,
                                            workdir / 'telemetry.jsonl')
      hooks.append(train_lib.Hook(lambda i: telemetry.record(i.stats.local)))
    strategy = MODES[built.mode].takes('rules')  # laid out by the strategy's tables
    if ctx.is_chief:
      if resume and (notice := _schedule_notice(workdir, config)):
        print(notice, flush=True)
      (workdir / 'config.json').write_text(json.dumps(config.to_json(), indent=2) + '\n')
      run_info = {'workers': built.workers, 'global_batch': config.data.global_batch,
                  'model': task.name, 'mode': built.mode.value,
                  'slowdown': config.emulation.slowdown or ctx.slowdown,
                  'started_unix_s': _started(workdir, called), **observed,
                  **(_rules.recorded(config) if strategy else {}), **built.run_info}
      (workdir / 'run.json').write_text(json.dumps(run_info, indent=2) + '\n')
      print(f'{task.name}: {built.describe}, global batch {config.data.global_batch}, steps '
            f'{start}→{config.optimizer.steps}, run dir {workdir}', flush=True)
      if name := built.run_info.get('policy'):  # the share policy's name, said in words
        print(f'policy: {balance.describe_policy(name)}', flush=True)
      if strategy and (notice := _rules.notice(config, task)):
        print(notice, flush=True)
      if notice := _fixed_state_notice(config, task):
        print(notice, flush=True)
      # After the evaluation (its line carries the result) and the checkpoint: a step is
      # logged done only once the checkpoint before it is committed, so a failure loses at
      # most checkpoint.every of the steps logged, background saves included.
      hooks.insert(1 if evaluation is None else 2, logger.hook())
    if built.measure_speed is not None and start < config.optimizer.steps:
      _probe_speeds(built, state, telemetry, ctx, policy_state)
    if channel is not None:  # reports after the other hooks: a worker stuck in one is named
      watchdog = _restarts.watchdog(channel, built.worker, built.workers)
      hooks.append(train_lib.Hook(lambda i: watchdog.report(i.step)))
    if built.warm_up is not None and start < config.optimizer.steps:
      built.warm_up(state)
    for info in train_lib.training_steps(program, state, config.optimizer.steps, hooks, policy,
                                         policy_state):
      state = info.state
    if telemetry is not None:  # the last step's rows, before the logger's last line (below)
      telemetry.close()
    ok = True
  finally:
    for closable in (watchdog, logger, writer, telemetry, ckpt, program):
      if closable is not None:
        closable.close()
    finished = built.finish(state if ok else None)
  if not ctx.is_chief:
    return None
  # Throughput as `python -m hetjax.report` computes it (warm-up and compiling steps left out).
  summary = logger.summary() | summary_fields(workdir) | {
      'checkpoint_steps': ckpt.all_steps(), 'first_shares': segment.get('first'),
      'last_shares': segment.get('last')} | _restarts.summary_fields(workdir) | finished
  if evaluation is not None and evaluation.latest is not None:
    summary |= {k: v for k, v in evaluation.latest.items() if k != 'step'}
  (workdir / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
  # Goodput reads summary.json's wall time: added once that is written.
  good = report.goodput(workdir)
  summary |= {'goodput': good['goodput'], 'badput_s': good['badput_s']}
  (workdir / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
  print('summary: ' + ', '.join(f'{k}={v}' for k, v in summary.items()), flush=True)
  return summary


def _fixed_state_notice(config: Config, task) -> str | None:
  """The start-up line naming a model's state that no step trains (a dropout stream's key and
  count: `hetjax.train.fixed_state_notice`); None for a model of float parameters only."""
  if trains_app(config):
    return None
  return train_lib.fixed_state_notice(
      sharding.abstract_model(task.make_model, config.data.seed)[1])


def _schedule_notice(workdir: pathlib.Path, config: Config) -> str | None:
  """One line when a resumed run's decaying schedule ends elsewhere than the run it resumes
  (its ``optimizer.steps`` changed and no ``optimizer.decay_steps`` fixes the decay's end)."""
  opt = config.optimizer
  if opt.schedule == 'constant' or opt.decay_steps:
    return None
  try:
    before = json.loads((workdir / 'config.json').read_text())['optimizer']['steps']
  except (OSError, ValueError, KeyError, TypeError):
    return None
  if before == opt.steps:
    return None
  return (f'resume: the {opt.schedule} schedule now decays over {opt.steps} steps, the run it '
          f'resumes over {before}: the learning rate from here differs from that run\'s (set '
          f'optimizer.decay_steps to keep one schedule across launches)')


def _started(workdir: pathlib.Path, called: float) -> float:
  """When the job's first launch started (Unix seconds): kept from an earlier ``run.json``
  of this run (a resume or restart), else ``called``, when `train` was called, so that
  building the programs counts as startup (`hetjax.report.goodput`)."""
  try:
    return float(json.loads((workdir / 'run.json').read_text())['started_unix_s'])
  except (OSError, ValueError, KeyError, TypeError):
    return called


def _settled(hook: train_lib.Hook, program, every: int) -> train_lib.Hook:
  """``hook`` (the checkpoint's, run after every step) after the program's collectives in
  flight have finished (``program.settle()``, where it has one: local SGD's overlapped
  exchange) at the steps it saves at and the step after (when a background save commits), so
  that the checkpoint's own collectives (its checksums) never run beside them: gloo pairs
  collectives in the order each process issues them. Other steps keep their overlap."""
  settle = getattr(program, 'settle', None)
  if settle is None:
    return hook

  def due(step: int, until: int | None) -> bool:
    return step > 0 and (step % every == 0 or step == until)

  def run(info: train_lib.StepInfo) -> None:
    if due(info.step, info.until) or due(info.step - 1, info.until):
      settle()
    hook.fn(info)

  return train_lib.Hook(run, every=hook.every, at_end=hook.at_end)
