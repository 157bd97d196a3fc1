"""Mode ps of the runner (`hetjax.run.train`): a parameter-server job launched with ``--servers K``.

Every process runs train.py; the last K serve (`hetjax.ps.serve`: checkpoints every
``checkpoint_every`` versions under ``WORKDIR/checkpoints/server-S``, their update logs in
``WORKDIR/server-S.json``), the workers train in the one loop (`hetjax.ps.PsWorker`), worker 0
writing ``metrics.jsonl`` (its own steps: under asp the loss of its minibatches; samples/s
counts a global batch per step of worker 0, exact under bsp) and ``summary.json``. A slowdown
makes every worker a host of known speed (its step padded to rows × a per-row cost × its
factor: ``host_row_s``, or the largest any worker measured × `_hosts.MARGIN`); the network (``network``
or ``launch --network``) pads every push and pull. ``--resume``: the servers restore their
latest checkpoints and each worker continues from its own pushes' count; under ``launch
--max-restarts`` a restarted job does so on its own (its lost steps leave ``metrics.jsonl``, and
``restarts.jsonl`` counts them, as in train.py). The workers report their progress to the stall
watchdog (the servers do not).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

import jax
import numpy as np

from hetjax import ConfigError, emulation, ps, runtime, train
from hetjax.run import _build, _comm_options, _hosts, _restarts
from hetjax.run._config import Config


def _check(config: Config, ctx: runtime.WorkerContext, role: ps.PsRole) -> None:
  unused = [name for name, used in (('policy', config.policy != 'uniform'),
                                    ('shares', config.shares), ('plan', config.plan)) if used]
  if unused:
    raise ConfigError(f'mode ps takes no {", ".join(unused)}: every worker computes an equal '
                      'share, and the servers hold the parameters')
  if jax.local_device_count() > 1:
    raise ConfigError(f'mode ps computes on one device per worker; this one has '
                      f'{jax.local_device_count()} (launch without --devices-per-worker)')
  if config.global_batch < role.workers:
    raise ConfigError(f'global batch {config.global_batch} is smaller than the '
                      f'{role.workers} workers')


def _host(config, ctx, role, worker, state, channel) -> emulation.KnownSpeedHost | None:
  spec = config.slowdown or ctx.slowdown
  if spec is None:
    return None
  trace = emulation.parse_trace(spec, role.workers)
  row_s = config.host_row_s
  if not row_s:
    rows = worker.shares[role.index]
    channel.set(f'ps-host/{role.index}',
                _hosts.MARGIN * float(np.median(worker.time_gradient(state))) / rows)
    row_s = max(channel.get(f'ps-host/{w}') for w in range(role.workers))
  return emulation.KnownSpeedHost(trace, role.index, row_s)


def run(config: Config, ctx: runtime.WorkerContext, channel, workdir: pathlib.Path,
        prepare: Callable[[], None], resume: bool) -> dict | None:
  """Runs this process's part of the job (module docstring); the chief's summary, else None."""
  if channel is None:
    raise ConfigError('mode ps needs parameter servers: launch it with python -m hetjax.launch '
                      '--workers N --servers K')
  role = ps.ps_role()
  _check(config, ctx, role)
  task = _build.make_task(config)
  optimizer = train.Optimizer.parse(config.optimizer).make(config.learning_rate)
  protocol = ps.parse_ps(config.ps)
  links = _comm_options.links_of(config, ctx, role.workers)
  if ctx.is_chief:
    prepare()
  channel.barrier('workdir-ready')
  if role.is_server:
    ps.serve(task, optimizer, protocol, role, channel, seed=config.seed,
             checkpoint_dir=workdir / 'checkpoints', checkpoint_every=config.checkpoint_every,
             report_path=workdir / f'server-{role.index}.json')
    return None
  worker = ps.make_worker(task, config.global_batch, protocol, role, channel, seed=config.seed,
                          links=links)
  state = worker.init_state()
  if resume and state.step == 0:
    raise ConfigError(f'--resume: the servers hold no checkpoint in {workdir / "checkpoints"}')
  worker.host = _host(config, ctx, role, worker, state, channel)
  if ctx.is_chief and runtime.restart_attempt() > 0:  # worker 0's steps are the metrics'
    _restarts.record_restart(workdir, int(state.step), role.workers)
  elif ctx.is_chief and resume:
    _restarts.trim_after(workdir, int(state.step))
  watchdog = _restarts.watchdog(channel, role.index, role.workers)
  hooks, logger = [], None
  if ctx.is_chief:
    (workdir / 'config.json').write_text(json.dumps(config.to_json(), indent=2) + '\n')
    (workdir / 'run.json').write_text(json.dumps({
        'workers': role.workers, 'servers': role.servers, 'global_batch': config.global_batch,
        'model': task.name, 'mode': 'ps', 'ps': protocol.describe(),
        'network': None if links is None else links.describe(),
        'slowdown': config.slowdown or ctx.slowdown}, indent=2) + '\n')
    print(f'{task.name}: ps {protocol.describe()}, {role.workers} workers and {role.servers} '
          f'servers, global batch {config.global_batch}, steps {state.step}→{config.steps}, '
          f'run dir {workdir}', flush=True)
    logger = train.MetricsLogger(workdir / 'metrics.jsonl', config.global_batch, config.steps,
                                 every=config.log_every)
    hooks.append(logger.hook())
  hooks.append(train.Hook(lambda i: watchdog.report(i.step)))  # after the others
  try:
    for info in train.training_steps(worker, state, config.steps, hooks):
      state = info.state
  finally:
    watchdog.close()
    if logger is not None:
      logger.close()
  worker.finish(state)
  if not ctx.is_chief:
    return None
  summary = logger.summary() | {'mode': 'ps', 'ps': protocol.describe(),
                                'refused_pushes_worker0': worker.refused} | \
      _restarts.summary_fields(workdir)
  (workdir / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
  print('summary: ' + ', '.join(f'{k}={v}' for k, v in summary.items()), flush=True)
  return summary
