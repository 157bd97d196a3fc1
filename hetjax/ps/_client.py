"""A worker's side of the parameter-server protocol: push, pull and stop, over K servers.

Every request takes a ticket from the server's counter and writes itself under it; the client
waits for the server's ack (`hetjax.ps._keys`). Waits are sliced: a server that recorded a
failure (``failed/S``) ends the wait at once with its reason, and nothing waits longer than
``timeout_s``. With emulated links (`hetjax.emulation.Links`), a push first spends this
worker's link time for its bytes (α + bytes / β) and then moves them; a pull moves them and then
spends the rest of the link time, so the parameters arrive when the link says.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax

from hetjax._errors import ConfigError
from hetjax.emulation import Links
from hetjax.ps import _keys as keys
from hetjax.ps._layout import ServerLayout
from hetjax.ps._transport import Transport

PyTree = Any


class ServerError(RuntimeError):
  """A server stopped (its reason), or did not answer within the timeout."""


@dataclasses.dataclass(frozen=True)
class PushResult:
  """The servers' answers to one push: accepted by all, each server's version after it, the
  staleness
  they saw (max over servers), the refusals' reasons and the seconds the push took."""

  accepted: bool
  versions: tuple[int, ...]
  staleness: int
  reasons: tuple[str, ...]
  seconds: float


class PsClient:
  """Worker ``worker``'s connection to the servers of ``layout``.

  Args:
    worker: this worker's index.
    layout: which server holds which leaves.
    channel: the key-value channel (shared with the servers).
    transport: this process's `Transport`.
    links: emulated links (None: the machine's own speed).
    timeout_s: the longest any one answer may take.
  """

  def __init__(self, worker: int, layout: ServerLayout, channel: Any, transport: Transport,
               links: Links | None = None, timeout_s: float = 300.0):
    self.worker, self.layout, self.channel, self.transport = worker, layout, channel, transport
    self.links = links if links is not None and not links.free else None
    self.timeout_s = timeout_s
    self._addresses: dict[int, str] = {}
    self.last_clock = 0  # this worker's pushes the servers hold, as of the latest pull
    channel.set(keys.WORKER_ADDRESS.format(worker), transport.address)

  # -- requests ----------------------------------------------------------------------------------

  def push(self, grads: PyTree, versions: tuple[int, ...], rows: int, loss: float
           ) -> PushResult:
    """Offers ``grads`` (a tree like the parameters) computed at ``versions`` (each server's
    version of the parameters it pulled) to the servers and waits for their acks."""
    start = time.perf_counter()
    self._spend_link(self.layout.nbytes(), 0.0)
    shards = self.layout.split(grads)
    tickets = []
    for s, shard in enumerate(shards):
      number = self.transport.offer(shard)
      specs = [[list(x.shape), x.dtype.name] for x in shard]
      tickets.append(self._request(s, {'op': 'push', 'worker': self.worker,
                                       'version': int(versions[s]),
                                       'number': number, 'specs': specs, 'rows': int(rows),
                                       'loss': float(loss)}))
    acks = [self._answer(s, t) for s, t in enumerate(tickets)]
    reasons = tuple(a['reason'] for a in acks if not a['accepted'])
    return PushResult(not reasons, tuple(int(a['version']) for a in acks),
                      max(a['staleness'] for a in acks), reasons, time.perf_counter() - start)

  def pull(self, min_version: int = 0, min_clock: int = 0
           ) -> tuple[PyTree, tuple[int, ...], float]:
    """The servers' parameters once each is at ``min_version`` and every running worker has
    pushed ``min_clock`` times: ``(tree, versions, seconds)``, each server's version (they move
    together under bsp; under asp each counts the pushes it applied)."""
    start = time.perf_counter()
    tickets = [self._request(s, {'op': 'pull', 'worker': self.worker,
                                 'min_version': int(min_version), 'min_clock': int(min_clock)})
               for s in range(self.layout.servers)]
    shards, versions = [], []
    for s, ticket in enumerate(tickets):
      ack = self._answer(s, ticket)
      shards.append(self.transport.take(self._address(s), ack['number'], self.layout.specs(s)))
      versions.append(int(ack['version']))
      self.last_clock = int(ack.get('clock', 0))
    jax.block_until_ready(shards)
    self._spend_link(self.layout.nbytes(), time.perf_counter() - start)
    return self.layout.merge(shards), tuple(versions), time.perf_counter() - start

  def stop(self) -> None:
    """Tells every server this worker is done (waits for their acks)."""
    tickets = [self._request(s, {'op': 'stop', 'worker': self.worker})
               for s in range(self.layout.servers)]
    for s, ticket in enumerate(tickets):
      self._answer(s, ticket)

  # -- internals ---------------------------------------------------------------------------------

  def _spend_link(self, nbytes: int, measured_s: float) -> None:
    if self.links is not None:
      self.links.pad(self.links.transfer_s(self.worker, nbytes), measured_s)

  def _request(self, server: int, request: dict) -> int:
    ticket = self.channel.increment(keys.TICKET.format(server))
    self.channel.set(keys.REQUEST.format(server, ticket), request)
    return ticket

  def _answer(self, server: int, ticket: int) -> dict:
    key, deadline = keys.ACK.format(server, ticket), time.monotonic() + self.timeout_s
    while True:
      ack = self.channel.wait(key, timeout_s=min(1.0, max(0.001, deadline - time.monotonic())))
      if ack is not None:
        self.channel.delete(key)
        return ack
      failed = self.channel.try_get(keys.FAILED.format(server))
      if failed is not None:
        raise ServerError(failed)
      if time.monotonic() >= deadline:
        raise ServerError(f'server {server} did not answer worker {self.worker} within '
                          f'{self.timeout_s:g} s')

  def _address(self, server: int) -> str:
    if server not in self._addresses:
      address = self.channel.wait(keys.SERVER_ADDRESS.format(server), self.timeout_s)
      if address is None:
        raise ConfigError(f'server {server} did not start within {self.timeout_s:g} s')
      self._addresses[server] = address
    return self._addresses[server]
