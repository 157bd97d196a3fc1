"""The central group scheduler as a service: worker 0 runs a `SyncPolicy`'s engine over a channel.

Replicas talk to the scheduler through a key-value channel (`hetjax.runtime.Channel` across
processes, `hetjax.runtime.LocalChannel` among threads), under one ``prefix`` per run:

- A replica that finishes step s (`SyncClient.arrive`) takes a ticket n from the counter
  ``PREFIX/n`` and writes ``{'w': worker, 's': s}`` to ``PREFIX/a/n``; `SyncClient.leave`
  writes ``{'w': worker, 'leave': True}`` the same way. The tickets make the arrivals one
  ordered log that the service reads with blocking gets, so it never polls a key per worker.
- The service (`SyncService.run`, on worker 0, usually in a thread beside that worker's own
  replica) reads the log in ticket order and stamps every message with its own clock on receipt:
  the policy sees one clock, whatever the workers' clocks say. It feeds its engine's ``arrive`` /
  ``leave`` and calls ``poll`` after each message and at ``next_deadline()`` (it waits on the
  next ticket only until then).
- Each closed group is written to ``PREFIX/g/<worker>/<step>`` for each member, the key that
  member waits on in `SyncClient.group`.
- Faults. A worker silent for the policy's ``timeout_s`` while others wait is dropped by the
  policy; the service logs every drop and rejoin (`logging`, warning level) and lists them in its
  `ServiceReport`. A ticket taken but never written (a replica died between the two calls) is
  skipped after ``lost_after_s`` and counted as ``lost``. Messages the policy ignores (a duplicate,
  a stale or an early step) change nothing and are counted, as are malformed ones (not a known
  worker, not a step, or a leave while waiting for a group).
- The service stops once every worker has left, and writes its `ServiceReport` to
  ``PREFIX/report``.
- State. `SyncService.policy_state` takes the policy's state (as `SyncPolicy.update` returns it)
  between two messages, from any thread: what a checkpoint saves. A service started from a saved
  state (``state=``) keeps that state's clock: its times go on from the saved ones.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from hetjax._checks import integer, positive_seconds
from hetjax._errors import ConfigError
from hetjax.replicas._engine_base import SyncGroup
from hetjax.replicas._policy import SyncPolicy

log = logging.getLogger('hetjax.replicas')

#: Longest the service blocks on the next ticket before it looks at its deadlines again.
IDLE_S = 0.05


class Board(Protocol):
  """What the service and its clients use of a channel (`Channel` and `LocalChannel` have it)."""

  def set(self, key: str, value: Any) -> None: ...

  def wait(self, key: str, timeout_s: float) -> Any | None: ...

  def try_get(self, key: str) -> Any | None: ...

  def increment(self, key: str, amount: int = 1) -> int: ...


@dataclasses.dataclass(frozen=True)
class ServiceReport:
  """What a `SyncService` run did (times in seconds from the start of `run`).

  Attributes:
    policy: the policy's name.
    groups: groups handed out, global synchronisations included.
    global_groups: of which global synchronisations.
    mean_group: mean members per group (0.0 if none).
    drops: (worker, time) for each worker dropped after a time-out.
    rejoins: (worker, time) for each dropped worker that arrived again.
    ignored: messages that changed nothing, by reason ('duplicate', 'stale', 'early' from the
      policy; 'malformed' and 'lost' from the service).
    messages: log entries read.
  """

  policy: str
  groups: int
  global_groups: int
  mean_group: float
  drops: tuple[tuple[int, float], ...]
  rejoins: tuple[tuple[int, float], ...]
  ignored: dict[str, int]
  messages: int

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: dict) -> ServiceReport:
    data = dict(data)
    for key in ('drops', 'rejoins'):
      data[key] = tuple((int(w), float(t)) for w, t in data[key])
    return cls(**data)


def group_to_json(group: SyncGroup) -> dict:
  return {'members': list(group.members), 'steps': list(group.steps), 'step': group.step,
          'global': group.global_sync, 'seq': group.seq}


def group_from_json(data: dict) -> SyncGroup:
  return SyncGroup(tuple(data['members']), int(data['step']), bool(data['global']), int(data['seq']),
               tuple(data['steps']))


class SyncService:
  """Runs ``policy`` for the replicas that talk to it under ``prefix`` (module docstring).

  Example (worker 0, beside its own replica)::

    service = SyncService(channel, SyncPolicy('sdpipe', workers), 'run0/stage')
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()

  Args:
    board: the channel.
    policy: the `SyncPolicy` of the replicas 0 … policy.workers − 1.
    prefix: the run's key namespace (a new one per run: keys are never reused).
    state: the policy's state to continue from (None: a fresh one). The service drives
      ``policy.engine(state)``, kept as ``engine``.
    lost_after_s: how long a taken but unwritten ticket is waited for before it is skipped.
    clock: seconds, monotonic (tests pass a fake).
  """

  def __init__(self, board: Board, policy: SyncPolicy, prefix: str, state: Any = None,
               lost_after_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
    if not isinstance(policy, SyncPolicy):
      raise ConfigError(f'policy must be a SyncPolicy, got {type(policy).__name__}')
    self.board, self.policy, self.prefix = board, policy, prefix.rstrip('/')
    self.engine = policy.engine(state)
    self.lost_after_s = positive_seconds(lost_after_s, 'lost_after_s')
    self._clock = clock
    self._ignored = {'malformed': 0, 'lost': 0}
    self._left: set[int] = set()
    self._sizes: list[int] = []
    self._globals = 0
    self._messages = 0
    self._logged_drops = len(self.engine.drops)
    self._logged_rejoins = len(self.engine.rejoins)
    self._lock = threading.Lock()

  def policy_state(self) -> Any:
    """The policy's state now (between two messages; safe from another thread)."""
    with self._lock:
      return self.engine.state()

  def run(self, stop_after_s: float | None = None) -> ServiceReport:
    """Serves until every worker has left (or ``stop_after_s`` passed); returns the report,
    also written to ``PREFIX/report``."""
    # A policy continued from a saved state keeps its clock: times go on from its last one.
    last = self.engine.now
    start = self._clock() - (max(last, 0.0) if math.isfinite(last) else 0.0)
    begun = self._clock()
    ticket, missing_since = 1, None
    while len(self._left) < self.policy.workers:
      now = self._clock()
      if stop_after_s is not None and now - begun > stop_after_s:
        log.warning('%s: the group scheduler stops after %.1f s with workers %s still running',
                    self.prefix, stop_after_s,
                    sorted(set(range(self.policy.workers)) - self._left))
        break
      due = self.engine.next_deadline()  # in the policy's times: seconds since start
      wait = IDLE_S if due is None else min(IDLE_S, max(0.0, due - (now - start)))
      key = f'{self.prefix}/a/{ticket}'
      message = self.board.wait(key, wait) if wait > 0 else self.board.try_get(key)
      now = self._clock()
      with self._lock:
        if message is not None:
          ticket, missing_since = ticket + 1, None
          self._messages += 1
          self._handle(message, now - start)
        elif self.board.increment(f'{self.prefix}/n', 0) >= ticket:  # taken, not written (yet)
          missing_since = now if missing_since is None else missing_since
          if now - missing_since >= self.lost_after_s:
            log.warning('%s: arrival ticket %d was taken but never written; skipped',
                        self.prefix, ticket)
            self._ignored['lost'] += 1
            ticket, missing_since = ticket + 1, None
        self._publish(now - start)
    report = self.report()
    self.board.set(f'{self.prefix}/report', report.to_json())
    return report

  def report(self) -> ServiceReport:
    ignored = dict(self.engine.ignored)
    ignored.update(self._ignored)
    return ServiceReport(
        policy=self.policy.name, groups=len(self._sizes), global_groups=self._globals,
        mean_group=sum(self._sizes) / len(self._sizes) if self._sizes else 0.0,
        drops=tuple(self.engine.drops), rejoins=tuple(self.engine.rejoins), ignored=ignored,
        messages=self._messages)

  def _handle(self, message: Any, now: float) -> None:
    worker = message.get('w') if isinstance(message, dict) else None
    try:
      if message.get('leave') is True:
        self.engine.leave(worker, now)
        self._left.add(worker)
      else:
        self.engine.arrive(worker, message.get('s'), now)
    except (ConfigError, AttributeError) as e:
      log.warning('%s: ignored malformed scheduler message %r (%s)', self.prefix, message, e)
      self._ignored['malformed'] += 1

  def _publish(self, now: float) -> None:
    for group in self.engine.poll(now):
      self._sizes.append(len(group.members))
      self._globals += group.global_sync
      data = group_to_json(group)
      for member, step in zip(group.members, group.steps, strict=True):
        self.board.set(f'{self.prefix}/g/{member}/{step}', data)
    drops, rejoins = self.engine.drops, self.engine.rejoins
    for worker, t in drops[self._logged_drops:]:
      log.warning('%s: worker %d dropped from grouping at %.3f s (silent for the time-out); '
                  'the others go on without it', self.prefix, worker, t)
    for worker, t in rejoins[self._logged_rejoins:]:
      log.warning('%s: worker %d is back at %.3f s and groups again', self.prefix, worker, t)
    self._logged_drops, self._logged_rejoins = len(drops), len(rejoins)


class SyncClient:
  """A replica's side of the service: report a finished step, wait for its group, leave.

  Example::

    client = SyncClient(channel, 'run0/stage', worker=jax.process_index())
    client.arrive(step)
    group = client.group(step, timeout_s=60)       # who to average with
    ...
    client.leave()                                  # after the last step
  """

  def __init__(self, board: Board, prefix: str, worker: int):
    self.board, self.prefix = board, prefix.rstrip('/')
    self.worker = integer(worker, 'worker')

  def _post(self, message: dict) -> None:
    ticket = self.board.increment(f'{self.prefix}/n')
    self.board.set(f'{self.prefix}/a/{ticket}', message)

  def arrive(self, step: int) -> None:
    """Step ``step`` is done: ask the scheduler for a group."""
    self._post({'w': self.worker, 's': int(step)})

  def leave(self) -> None:
    """No more steps: nobody waits for this worker any more."""
    self._post({'w': self.worker, 'leave': True})

  def group(self, step: int, timeout_s: float = 60.0) -> SyncGroup:
    """Blocks until the scheduler names this worker's group for ``step``.

    Raises:
      TimeoutError: no group within ``timeout_s`` (the scheduler is gone or this worker was
        dropped and the others stopped).
    """
    data = self.board.wait(f'{self.prefix}/g/{self.worker}/{int(step)}', timeout_s)
    if data is None:
      raise TimeoutError(f'worker {self.worker}: no group for step {step} within '
                         f'{timeout_s:g} s from the scheduler at {self.prefix!r}')
    return group_from_json(data)

  def report(self, timeout_s: float = 60.0) -> ServiceReport:
    """The service's report, once it has stopped."""
    data = self.board.wait(f'{self.prefix}/report', timeout_s)
    if data is None:
      raise TimeoutError(f'no scheduler report at {self.prefix!r} within {timeout_s:g} s')
    return ServiceReport.from_json(data)

