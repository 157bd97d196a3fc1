"""A parameter server: one shard of the parameters, updated by the workers' pushes.

`ParameterServer.serve` answers requests (`hetjax.ps._keys`) in ticket order, one at a time,
so every decision is a function of the order requests arrived in:

* a push must declare the server's leaves' shapes and dtypes (else it is refused before any
  bytes move: its offer is never taken); then it is taken from the worker's transport and
  checked: its version at most the server's and its staleness τ = version − its version within
  ``PsConfig.refuse_above``. A failed check refuses and counts it (never applied). bsp holds accepted pushes until every worker's push of that version is in,
  then applies their rows-weighted mean once; asp and ssp apply each at once, the update scaled
  by 1 / max(1, τ) under the staleness-aware rule, DC-ASGD compensating it if asked.
* a pull waits (held, not blocking other requests) until the server reaches its ``min_version``
  and, under ssp, every running worker has pushed ``min_clock`` times; then the current leaves
  are offered for that one pull.
* a stop ends the worker; the server returns once every worker has stopped, after its last
  checkpoint.

Every applied update is logged (`UpdateRecord`): its version, time, worker(s), staleness, scale
and the pushed minibatch loss, the curve a run's report reads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax

from hetjax._errors import ConfigError
from hetjax.ps import _keys as keys
from hetjax.ps._checkpoint import ServerCheckpointer, ServerState
from hetjax.ps._config import Consistency, LrRule, PsConfig
from hetjax.ps._layout import ServerLayout
from hetjax.ps._transport import Transport
from hetjax.ps._update import ShardUpdate


@dataclasses.dataclass(frozen=True)
class UpdateRecord:
  """One applied update: the version it made, when (s since the server started), from which
  workers, their staleness, the update's scale and the mean minibatch loss they reported."""

  version: int
  time_s: float
  workers: tuple[int, ...]
  staleness: tuple[int, ...]
  scale: float
  loss: float


@dataclasses.dataclass(frozen=True)
class ServerReport:
  server: int
  version: int
  updates: tuple[UpdateRecord, ...]
  refused: dict[str, int]
  pushes: int
  pulls: int

  def to_json(self) -> dict:
    return {'server': self.server, 'version': self.version, 'refused': self.refused,
            'pushes': self.pushes, 'pulls': self.pulls,
            'updates': [dataclasses.asdict(u) for u in self.updates]}


class ParameterServer:
  """Server ``server`` of ``layout.servers``, for ``workers`` workers.

  Args:
    server: this server's index.
    workers: how many workers push to it.
    layout: which leaves it holds (`ServerLayout`).
    params: its leaves' initial values (a list in `ServerLayout.leaves_of` order).
    update: the optimizer step on its leaves (`ShardUpdate`).
    config: the protocol (`PsConfig`).
    channel: the key-value channel (`hetjax.runtime.Channel`, or `LocalChannel` in one process).
    transport: this process's `Transport`.
    checkpointer: saves every ``checkpoint_every`` versions and at the end (None: never);
      restored from when it holds a version.
    idle_timeout_s: a server that hears nothing for this long fails with a one-line error.
    on_update: called with the server after every applied update (e.g. to evaluate it).
  """

  def __init__(self, server: int, workers: int, layout: ServerLayout, params: list, update:
               ShardUpdate, config: PsConfig, channel: Any, transport: Transport, *,
               checkpointer: ServerCheckpointer | None = None, checkpoint_every: int = 0,
               idle_timeout_s: float = 300.0,
               on_update: Callable[[ParameterServer], None] | None = None):
    self.server, self.workers, self.layout, self.config = server, workers, layout, config
    self.channel, self.transport, self.update = channel, transport, update
    self.checkpointer, self.checkpoint_every = checkpointer, checkpoint_every
    self.idle_timeout_s, self.on_update = idle_timeout_s, on_update
    self.specs = [(tuple(s), d) for s, d in layout.specs(server)]
    self.params = list(params)
    self.opt_state = update.init(self.params)
    self.version, self.clocks = 0, [0] * workers
    self.restored_from = self._saved = None
    if checkpointer is not None and checkpointer.latest_step() is not None:
      restored, meta = checkpointer.restore(ServerState(0, self.params, self.opt_state))
      self.params, self.opt_state = jax.device_put((restored.params, restored.opt_state),
                                                   transport.device)
      self.params = list(self.params)
      self.version, self.clocks = restored.step, list(meta['clocks'])
      self.restored_from = self._saved = self.version
    self._refuse_above = config.refuse_above(workers)
    self._held: list[dict] = []           # pulls waiting for a version or the slowest worker
    self._round: dict[int, tuple] = {}    # bsp: worker -> (grads, rows, loss) of this version
    self._then: dict[int, list] = ({self.version: self.params} if config.dc_lambda is not None
                                   else {})
    self._stopped: set[int] = set()
    self._addresses: dict[int, str] = {}
    self._pulled: dict[int, list[int]] = {}  # worker -> the versions of its last two pulls
    self._log: list[UpdateRecord] = []
    self.refused: dict[str, int] = {'shape': 0, 'version': 0, 'staleness': 0}
    self.pushes = self.pulls = 0
    self._start = time.perf_counter()

  # -- the loop ----------------------------------------------------------------------------------

  def serve(self) -> ServerReport:
    """Answers requests until every worker has stopped; returns what happened."""
    self.channel.set(keys.SERVER_ADDRESS.format(self.server), self.transport.address)
    ticket, heard = 1, time.monotonic()
    try:
      while len(self._stopped) < self.workers:
        request = self.channel.wait(keys.REQUEST.format(self.server, ticket), timeout_s=1.0)
        if request is None:
          if time.monotonic() - heard > self.idle_timeout_s:
            raise ConfigError(f'server {self.server} heard nothing from any worker for '
                              f'{self.idle_timeout_s:g} s')
          continue
        heard = time.monotonic()
        self.channel.delete(keys.REQUEST.format(self.server, ticket))
        self._handle(ticket, request)
        ticket += 1
    except Exception as e:
      self.channel.set(keys.FAILED.format(self.server), f'server {self.server}: {e}'[:300])
      raise
    if self.checkpointer is not None and self._saved != self.version:
      self._save()
    return self.report()

  def report(self) -> ServerReport:
    return ServerReport(self.server, self.version, tuple(self._log), dict(self.refused),
                        self.pushes, self.pulls)

  def _handle(self, ticket: int, request: dict) -> None:
    op = request.get('op')
    if op == 'push':
      self._ack(ticket, self._push(request))
    elif op == 'pull':
      self._held.append({**request, 'ticket': ticket})
    elif op == 'stop':
      self._stopped.add(int(request['worker']))
      self._ack(ticket, {'version': self.version})
      self._close_round()
    else:
      raise ConfigError(f'server {self.server}: unknown request {op!r}')
    self._answer_pulls()

  def _ack(self, ticket: int, value: dict) -> None:
    self.channel.set(keys.ACK.format(self.server, ticket), value)

  # -- pushes ------------------------------------------------------------------------------------

  def _push(self, request: dict) -> dict:
    self.pushes += 1
    worker, version = int(request['worker']), int(request['version'])
    declared = _specs(request.get('specs'))
    staleness = self.version - version
    if declared != self.specs:  # refused before any bytes move: such an offer may not exist
      self.refused['shape'] += 1
      return {'accepted': False, 'reason': f'shapes/dtypes {declared} are not the server\'s '
              f'{self.specs}', 'version': self.version, 'staleness': staleness}
    if worker not in self._addresses:
      self._addresses[worker] = self.channel.get(keys.WORKER_ADDRESS.format(worker))
    grads = self.transport.take(self._addresses[worker], int(request['number']), declared)
    reason = None
    if version > self.version or (self.config.consistency is Consistency.BSP and version != self.version):
      reason, why = 'version', f'version {version} but the server is at {self.version}'
    elif self._refuse_above is not None and staleness > self._refuse_above:
      reason, why = 'staleness', f'staleness {staleness} > {self._refuse_above}'
    if reason is not None:
      self.refused[reason] += 1
      return {'accepted': False, 'reason': why, 'version': self.version, 'staleness': staleness}
    rows, loss = int(request['rows']), float(request['loss'])
    self.clocks[worker] += 1
    if self.config.consistency is Consistency.BSP:
      self._round[worker] = (grads, rows, loss)
      self._close_round()
    else:
      scale = 1.0 / max(1, staleness) if self.config.lr_rule is LrRule.STALENESS else 1.0
      then = self._then.get(version) if self.config.dc_lambda is not None else None
      self._apply(grads, scale, then, (worker,), (staleness,), loss)
    return {'accepted': True, 'version': self.version, 'staleness': staleness}

  def _close_round(self) -> None:
    """bsp: applies the round once every running worker's push of this version is in."""
    running = set(range(self.workers)) - self._stopped
    if self.config.consistency is Consistency.BSP and self._round and set(self._round) >= running:
      self._apply_round()

  def _apply_round(self) -> None:
    members = sorted(self._round)
    grads = self.update.mean([self._round[w][0] for w in members],
                             [self._round[w][1] for w in members])
    rows = sum(self._round[w][1] for w in members)
    loss = sum(self._round[w][1] * self._round[w][2] for w in members) / max(rows, 1)
    self._round = {}
    self._apply(grads, 1.0, None, tuple(members), (0,) * len(members), loss)

  def _apply(self, grads, scale, then, workers, staleness, loss) -> None:
    self.params, self.opt_state = self.update(self.params, self.opt_state, grads, scale, then)
    self.version += 1
    if self.config.dc_lambda is not None:
      self._then[self.version] = self.params
      self._forget_old_versions()
    self._log.append(UpdateRecord(self.version, time.perf_counter() - self._start, workers,
                                  staleness, scale, loss))
    if self.on_update is not None:
      self.on_update(self)
    if self.checkpointer is not None and self.checkpoint_every and \
        self.version % self.checkpoint_every == 0:
      self._save()

  def _forget_old_versions(self) -> None:
    """DC-ASGD keeps the versions a push may still come from: each worker's last two pulls
    (an eager worker computes on the older while the newer arrives) and the current one."""
    live = {self.version, 0} | {v for pulls in self._pulled.values() for v in pulls}
    for v in [v for v in self._then if v not in live]:
      del self._then[v]

  # -- pulls -------------------------------------------------------------------------------------

  def _answer_pulls(self) -> None:
    running = [c for w, c in enumerate(self.clocks) if w not in self._stopped]
    slowest = min(running) if running else math.inf
    still = []
    for pull in self._held:
      if self.version >= int(pull['min_version']) and slowest >= int(pull['min_clock']):
        number = self.transport.offer(self.params)
        self.pulls += 1
        worker = int(pull['worker'])
        self._pulled[worker] = [*self._pulled.get(worker, []), self.version][-2:]
        self._ack(pull['ticket'], {'version': self.version, 'number': number,
                                   'clock': self.clocks[worker]})
      else:
        still.append(pull)
    self._held = still

  def _save(self) -> None:
    self._saved = self.version
    self.checkpointer.save(ServerState(self.version, self.params, self.opt_state),
                           {'version': self.version, 'clocks': self.clocks,
                            'sync': self.config.describe()})


def _specs(raw: Any) -> list | None:
  """A push's declared ``[(shape, dtype), …]``, or None when it is not one."""
  try:
    return [(tuple(int(n) for n in shape), str(dtype)) for shape, dtype in raw]
  except (TypeError, ValueError):
    return None


def write_report(report: ServerReport, path: str | os.PathLike) -> None:
  """Writes ``report`` as JSON (atomically: a temporary file renamed into place)."""
  tmp = f'{os.fspath(path)}.tmp'
  with open(tmp, 'w') as f:
    json.dump(report.to_json(), f)
  os.replace(tmp, path)

