"""Who is who in a parameter-server job, and building its server or its worker.

``python -m hetjax.launch --workers N --servers K`` starts N + K processes of one JAX job: the
first N are workers, the last K servers (``HETJAX_NUM_SERVERS=K``). Every process runs the
same command; `ps_role` tells it which it is, and `make_server` / `make_worker` build its part
from the same task, optimizer and seed, so the servers start from exactly the parameters a
single-device run would.

Example (every process; see ``experiments/bench_comm.py``)::

  role = ps.ps_role()
  channel = runtime.Channel('ps')
  if role.is_server:
    ps.serve(task, optax.sgd(0.1), config, role, channel)
  else:
    worker = ps.make_worker(task, 256, config, role, channel)
    for info in train.training_steps(worker, worker.init_state(), 100):
      state = info.state
    worker.finish(state)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import optax

from hetjax import sharding
from hetjax._errors import ConfigError
from hetjax.core import Pace
from hetjax.emulation import Links
from hetjax.ps import _keys as keys
from hetjax.ps._checkpoint import ServerCheckpointer
from hetjax.ps._client import PsClient
from hetjax.ps._config import PsConfig
from hetjax.ps._layout import ServerLayout
from hetjax.ps._server import ParameterServer, ServerReport, write_report
from hetjax.ps._transport import Transport
from hetjax.ps._update import ShardUpdate
from hetjax.ps._worker import PsWorker
from hetjax.sharding import abstract_model
from hetjax.train import Task, split_trainable

ENV_NUM_SERVERS = 'HETJAX_NUM_SERVERS'


@dataclasses.dataclass(frozen=True)
class PsRole:
  """This process in a job of ``workers`` workers and ``servers`` servers: worker ``index`` or
  server ``index``."""

  is_server: bool
  index: int
  workers: int
  servers: int

  def __post_init__(self):
    if self.workers < 1 or self.servers < 1:
      raise ConfigError(f'a parameter-server job needs at least one worker and one server, '
                        f'got {self.workers} and {self.servers}')
    if not 0 <= self.index < (self.servers if self.is_server else self.workers):
      raise ConfigError(f'{"server" if self.is_server else "worker"} {self.index} is out of '
                        f'range')

  @property
  def name(self) -> str:
    return f'{"server" if self.is_server else "worker"} {self.index}'


def ps_role(process: int | None = None, processes: int | None = None,
            servers: int | None = None) -> PsRole:
  """This process's role: processes ``processes − servers …`` are the servers.

  Defaults: `jax.process_index`, `jax.process_count` and ``HETJAX_NUM_SERVERS``.
  """
  process = jax.process_index() if process is None else process
  processes = jax.process_count() if processes is None else processes
  if servers is None:
    raw = os.environ.get(ENV_NUM_SERVERS)
    if not raw:
      raise ConfigError('a parameter-server job needs servers: launch it with '
                        'python -m hetjax.launch --workers N --servers K')
    try:
      servers = int(raw)
    except ValueError:
      raise ConfigError(f'{ENV_NUM_SERVERS}={raw!r} is not an integer') from None
  workers = processes - servers
  if process >= workers:
    return PsRole(True, process - workers, workers, servers)
  return PsRole(False, process, workers, servers)


def make_server(task: Task, optimizer: optax.GradientTransformation, config: PsConfig,
                role: PsRole, channel: Any, *, seed: int = 0, transport: Transport | None = None,
                checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0,
                idle_timeout_s: float = 300.0,
                on_update: Callable[[ParameterServer], None] | None = None) -> ParameterServer:
  """Server ``role.index``: its leaves of the initial parameters (or of its latest checkpoint
  in ``checkpoint_dir``), ``optimizer`` on them; ``on_update(server)`` after every update."""
  if not role.is_server:
    raise ConfigError(f'{role.name} is not a server')
  # The servers hold the float parameters; other state (a dropout stream) stays on the workers.
  layout = ServerLayout.of(split_trainable(abstract_model(task.make_model, seed)[1])[0],
                           role.servers)
  params = layout.split(split_trainable(
      sharding.initial_params(task.make_model, seed, weights=task.weights))[0])[role.index]
  checkpointer = (None if checkpoint_dir is None else
                  ServerCheckpointer(checkpoint_dir, role.index))
  return ParameterServer(role.index, role.workers, layout, params,
                         ShardUpdate(optimizer, config.dc_lambda), config, channel,
                         transport or Transport(), checkpointer=checkpointer,
                         checkpoint_every=checkpoint_every, idle_timeout_s=idle_timeout_s,
                         on_update=on_update)


def serve(task: Task, optimizer: optax.GradientTransformation, config: PsConfig, role: PsRole,
          channel: Any, *, report_path: str | os.PathLike | None = None,
          on_done: Callable[[ParameterServer], None] | None = None, **kwargs: Any
          ) -> ServerReport:
  """Builds server ``role.index`` (`make_server`, ``kwargs`` passed on) and serves until every
  worker has stopped; then calls ``on_done(server)`` (e.g. to evaluate its final parameters)
  and writes its report to ``report_path``, if given.

  A server that fails (while starting or serving) records its reason on the channel, so the
  workers waiting on it end with that reason, prints one line and exits the process with
  status 1 at once: skipping JAX's shutdown barrier, so the launcher sees the server fail
  first and names it.
  """
  try:
    server = make_server(task, optimizer, config, role, channel, **kwargs)
    report = server.serve()
    if on_done is not None:
      on_done(server)
    if report_path is not None:
      write_report(report, report_path)
    return report
  except Exception as e:  # every failure ends the job the same way
    message = f'server {role.index}: error: {e}'.splitlines()[0][:300]
    with contextlib.suppress(Exception):
      channel.set(keys.FAILED.format(role.index), message)
    print(message, file=sys.stderr, flush=True)
    os._exit(1)


def make_worker(task: Task, global_batch: int, config: PsConfig, role: PsRole, channel: Any, *,
                seed: int = 0, transport: Transport | None = None, links: Links | None = None,
                host: Pace | None = None, timeout_s: float = 300.0,
                accumulate: int = 1) -> PsWorker:
  """Worker ``role.index``'s step program (`PsWorker`, ``accumulate`` micro-batches a step)
  and its connection to the servers."""
  if role.is_server:
    raise ConfigError(f'{role.name} is not a worker')
  if links is not None and links.workers != role.workers:
    raise ConfigError(f'links for {links.workers} workers in a job of {role.workers}')
  layout = ServerLayout.of(split_trainable(abstract_model(task.make_model, seed)[1])[0],
                           role.servers)
  client = PsClient(role.index, layout, channel, transport or Transport(), links, timeout_s)
  return PsWorker(task, global_batch, config, client, workers=role.workers, seed=seed,
                  host=host, accumulate=accumulate)
