"""Mode ps of the runner (`hetjax.run.train`): a parameter-server job launched with
``--servers K``.

Every process runs train.py; the last K serve (`hetjax.ps.serve`: checkpoints every
``checkpoint_every`` versions under ``WORKDIR/checkpoints/server-S``, their update logs in
``WORKDIR/server-S.json``), the workers train in the one loop (`hetjax.ps.PsWorker`), worker 0
writing ``metrics.jsonl`` (its own steps: under asp the loss of its minibatches; samples/s
counts a global batch per step of worker 0, exact under bsp) and ``summary.json``. A slowdown
makes every worker a host of known speed (its step padded to rows × a per-row cost × its
factor: ``host_row_s``, or the largest any worker measured × `hetjax.emulation.MARGIN`, by
`hetjax.emulation.build_host`); the network (``network`` or ``launch --network``) pads every
push and pull. ``--resume``: the servers restore their latest checkpoints and each worker
continues from its own pushes' count; under ``launch --max-restarts`` a restarted job does so
on its own (its lost steps leave ``metrics.jsonl``, and
``restarts.jsonl`` counts them, as in train.py). The workers report their progress to the stall
watchdog (the servers do not).
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np

from hetjax import ConfigError, emulation, ps, runtime, train
from hetjax.run import _comm_options, _hosts
from hetjax.run._built import Built
from hetjax.run._config import Config, Mode
from hetjax.run._task import make_task, optimizer_of


def _check(config: Config, ctx: runtime.WorkerContext, role: ps.PsRole) -> None:
  if jax.local_device_count() > 1:
    raise ConfigError(f'mode ps computes on one device per worker; this one has '
                      f'{jax.local_device_count()} (launch without --devices-per-worker)')
  if config.data.global_batch < role.workers:
    raise ConfigError(f'global batch {config.data.global_batch} is smaller than the '
                      f'{role.workers} workers')


def _host(config, ctx, role, worker, state, channel) -> emulation.KnownSpeedHost | None:
  """This worker's host: its share's gradient timed, a step of one size."""
  spec = config.emulation.slowdown or ctx.slowdown
  if spec is None:
    return None
  calibration = emulation.Calibration(lambda rows: float(np.median(worker.time_gradient(state))),
                                      (worker.shares[role.index],), repeats=1)
  return emulation.build_host(emulation.parse_trace(spec, role.workers), role.index, role.workers,
                              calibration=calibration, row_s=config.emulation.host_row_s,
                              board=channel, key='ps-host')


class ServerHeld:
  """A parameter-server worker's checkpointer: the servers hold and save the state
  (``checkpoints/server-S``), so a worker saves nothing and resumes from what it pulls."""

  directory = None

  def hook(self, meta, every: int) -> train.Hook:
    return train.Hook(lambda info: None, every=every)

  def all_steps(self) -> list[int]:
    return []

  def close(self) -> None:
    pass


def build(config: Config, ctx: runtime.WorkerContext, channel):
  """This process's part of a parameter-server job (module docstring), for the runner: a
  server's `Built` serves (``serve``), a worker's trains in the one loop.

  Raises:
    ConfigError: no servers in the job, or options mode ps has no use for.
  """
  if channel is None:
    raise ConfigError('mode ps needs parameter servers: launch it with python -m hetjax.launch '
                      '--workers N --servers K')
  role = ps.ps_role()
  _check(config, ctx, role)
  task = make_task(config)
  optimizer = optimizer_of(config)[0]
  protocol = ps.parse_ps(config.ps.protocol)
  links = _comm_options.links_of(config, ctx, role.workers)
  describe = (f'ps {protocol.describe()}, {role.workers} workers and {role.servers} servers')
  info = {'servers': role.servers, 'ps': protocol.describe(), 'policy': None, 'sync': None,
          'network': None if links is None else links.describe(),
          **_hosts.recorded(None, config)}
  if role.is_server:
    def serve(workdir: pathlib.Path) -> None:
      ps.serve(task, optimizer, protocol, role, channel, seed=config.data.seed,
               checkpoint_dir=workdir / 'checkpoints', checkpoint_every=config.checkpoint.every,
               report_path=workdir / f'server-{role.index}.json')

    return Built(None, None, describe, Mode.PS, describe=describe, worker=role.index,
                 workers=role.workers, serve=serve, run_info=info)
  worker = ps.make_worker(task, config.data.global_batch, protocol, role, channel,
                          seed=config.data.seed, links=links,
                          accumulate=config.optimizer.accumulate)

  def start(resume: bool):
    state = worker.init_state()  # the servers' parameters, and this worker's pushes so far
    if resume and state.step == 0:
      raise ConfigError('--resume: the servers hold no checkpoint')
    host = _host(config, ctx, role, worker, state, channel)
    worker.use_host(host)
    # The hosts are known only now: run.json, written after start, takes them from ``info``.
    info.update(_hosts.recorded(host, config))
    return state, None

  def finish(state) -> dict:
    if state is None:
      return {}
    worker.finish(state)
    return {'mode': 'ps', 'ps': protocol.describe(), 'refused_pushes_worker0': worker.refused}

  return Built(worker, None, describe, Mode.PS, describe=describe, worker=role.index,
               workers=role.workers, checkpoints=lambda workdir, resume: ServerHeld(),
               start=start, finish=finish, run_info=info)
