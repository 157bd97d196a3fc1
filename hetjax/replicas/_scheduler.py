"""SDPipe's central group scheduler: which replicas of one stage average parameters, and when.

Pure, deterministic bookkeeping: no JAX, no processes, no clock of its own. Times are floats the
caller passes in (virtual or real seconds), so a driver calls `arrive` when a replica finishes a
step, `poll` right after and again at `next_deadline`, and gets the same `SyncGroup`s whether the
times come from the virtual clock or from ``time.monotonic()``. In SDPipe there is one scheduler
per pipeline stage, grouping that stage's replicas, numbered 0 … workers − 1; `ReplicaDriver`
runs each replica's whole pipeline in one process, so one scheduler serves every stage there.
On real workers `SyncService` runs it on worker 0 (`hetjax.replicas._service`).

Rules as implemented (SDPipe, Miao et al., VLDB 2023; choices where the paper is silent marked *):

- Arrival order. The first arrival opens a group with its own adaptive window; later arrivals join
  the open group (one open group at a time), members listed in arrival order. The group closes
  as soon as it has ``max_group`` members or when its window expires; an arrival exactly at the
  expiry time finds the group already closed (the window is half-open)*. ``min_group`` does not
  hold a group open: it only steers the windows.
- Adaptive windows. After each (non-global) group every member's window is doubled, capped at
  ``max_window_s``, if the group had fewer than ``min_group`` members, else multiplied by 0.9,
  floored at ``min_window_s``.
- Consistency (SSP). The scheduler unions the members of every group formed since the union of
  groups last connected every active worker (the *epoch*). With B = ``ssp_bound × max_group``:
  (soft*, as in the artifact) once the epoch holds B updates (a group of k members is k updates),
  a group closes only if it merges two components; (hard*) a group with a member that already has
  B − 1 updates in the epoch closes only if it connects every active worker. A group held open by
  either rule keeps its window's expiry, accepts further arrivals (it may exceed ``max_group``)
  and closes at the first arrival or drop that satisfies the rule. Hence no worker is ever in more
  than B groups between two connectivity points: its B-th is a connecting one.
- Global synchronisation. An arrival whose step is a multiple of ``sync_every`` (step 0 included*)
  waits, apart from the normal group, until every active worker has arrived with that step (or is
  already past it*); its group is ``global_sync``. While one is pending the SSP rules are waived*:
  workers outside it may otherwise wait on ones inside it forever, and it reconnects everyone.
- Faults*. A worker is dropped (joins `dropped`; ``drops`` logs (worker, time)) once someone has
  waited ``timeout_s`` without it arriving: at max(oldest waiting arrival, its last arrival) +
  ``timeout_s``; the rest group on without it. `leave` drops a finished worker at once, unlogged.
  Its next accepted arrival (a step after its last grouped one) readmits it, logged in ``rejoins``.
- Bad messages*. An arrival for a (worker, step) that is pending or already grouped is a
  'duplicate', one older than the worker's pending or last grouped step is 'stale', one newer
  than its pending step is 'early' (the worker must wait for its group); all three are ignored and
  counted in ``ignored``. Times that go backwards are taken as the latest time seen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetjax._checks import positive_int, positive_seconds
from hetjax._errors import ConfigError
from hetjax.replicas._engine_base import Grouper, SyncGroup


@dataclasses.dataclass(frozen=True)
class GroupRules:
  """How `GroupScheduler` forms groups (see the module docstring for the rules).

  Attributes:
    max_group: a group closes at once when it has this many members.
    min_group: a group smaller than this doubles its members' windows (else they shrink × 0.9).
    window_s: every worker's first window; its later ones adapt within [min_window_s, max_window_s].
    min_window_s: floor of the adaptive window.
    max_window_s: cap of the adaptive window.
    ssp_bound: with max_group, the staleness bound B = ssp_bound × max_group updates.
    sync_every: steps that are multiples of it synchronise everyone; None: never.
    timeout_s: how long waiting workers wait for a silent one before dropping it.
  """

  max_group: int = 4
  min_group: int = 2
  window_s: float = 0.002
  min_window_s: float = 0.0005
  max_window_s: float = 0.010
  ssp_bound: int = 4
  sync_every: int | None = None
  timeout_s: float = 5.0

  def __post_init__(self):
    for what in ('max_group', 'min_group', 'ssp_bound'):
      positive_int(getattr(self, what), f'GroupRules.{what}')
    if self.min_group > self.max_group:
      raise ConfigError(f'GroupRules.min_group ({self.min_group}) must not exceed max_group '
                        f'({self.max_group})')
    for what in ('window_s', 'min_window_s', 'max_window_s', 'timeout_s'):
      positive_seconds(getattr(self, what), f'GroupRules.{what}')
    if not self.min_window_s <= self.window_s <= self.max_window_s:
      raise ConfigError(f'GroupRules.window_s ({self.window_s}) must lie in [min_window_s, '
                        f'max_window_s] = [{self.min_window_s}, {self.max_window_s}]')
    if self.timeout_s <= self.max_window_s:
      raise ConfigError(f'GroupRules.timeout_s ({self.timeout_s}) must exceed max_window_s '
                        f'({self.max_window_s})')
    if self.sync_every is not None:
      positive_int(self.sync_every, 'GroupRules.sync_every')

  @property
  def bound(self) -> int:
    """B = ssp_bound × max_group: most groups a worker joins between two connectivity points."""
    return self.ssp_bound * self.max_group


class GroupScheduler(Grouper):
  """SDPipe's group scheduler for the replicas of one stage (or of whole one-process pipelines,
  as `ReplicaDriver` runs them: then one for the job).

  Example::

    >>> s = GroupScheduler(4, GroupRules(max_group=2))
    >>> s.arrive(1, 1, 0.0); s.arrive(3, 1, 0.001)
    >>> s.poll(0.001)
    [SyncGroup(members=(1, 3), step=1, global_sync=False, seq=0, steps=(1, 1))]
  """

  name = 'sdpipe'

  def __init__(self, workers: int, rules: GroupRules | None = None):
    rules = GroupRules() if rules is None else rules
    if not isinstance(rules, GroupRules):
      raise ConfigError(f'rules must be a GroupRules, got {type(rules).__name__}')
    super().__init__(workers, rules.timeout_s)
    self.rules = rules
    self._window = [rules.window_s] * self.workers
    self._parent = list(range(self.workers))
    self._ahead = [0] * self.workers
    self._updates = 0
    self.connections: list[float] = []  # times the epoch's groups connected every active worker

  @property
  def windows(self) -> tuple[float, ...]:
    """Each worker's current adaptive window, in seconds."""
    return tuple(self._window)

  @property
  def ahead(self) -> tuple[int, ...]:
    """Groups each worker joined since the last connectivity point."""
    return tuple(self._ahead)

  @property
  def updates(self) -> int:
    """Updates (members of groups) accumulated since the last connectivity point."""
    return self._updates

  def _policy_state(self) -> dict[str, Any]:
    """The adaptive windows and the staleness epoch (its union-find and counts)."""
    return {'window': np.array(self._window, np.float64),
            'parent': np.array(self._parent, np.int64), 'ahead': np.array(self._ahead, np.int64),
            'updates': int(self._updates), 'connections': np.array(self.connections, np.float64)}

  def _load_policy_state(self, state: dict[str, Any]) -> None:
    self._window = [float(w) for w in state['window']]
    self._parent = [int(p) for p in state['parent']]
    self._ahead = [int(a) for a in state['ahead']]
    self._updates = int(state['updates'])
    self.connections = [float(t) for t in state['connections']]

  def _is_sync(self, step: int) -> bool:
    return self.rules.sync_every is not None and step % self.rules.sync_every == 0

  def _window_of(self, worker: int) -> float:
    return self._window[worker]

  def _close_some(self, t: float) -> bool:
    members = self._open
    full = len(members) >= self.rules.max_group
    if not members or not (self._expired or full) or not self._may_close(members):
      return False
    self._open = []
    self._emit(members, [self._pending[m][0] for m in members], False, t)
    return True

  def _may_close(self, members: Sequence[int]) -> bool:
    """The SSP rules (waived while a global sync is pending)."""
    if self._barriers:
      return True
    roots = {self._find(m) for m in members}
    if any(self._ahead[m] >= self.rules.bound - 1 for m in members):
      return all(self._find(w) in roots for w in self.active)
    return self._updates < self.rules.bound or len(roots) > 1

  def _on_close(self, group: SyncGroup, t: float) -> None:
    r = self.rules
    if not group.global_sync:
      small = len(group.members) < r.min_group
      for m in group.members:
        w = self._window[m]
        self._window[m] = min(2 * w, r.max_window_s) if small else max(0.9 * w, r.min_window_s)
    first = self._find(group.members[0])
    for m in group.members:
      self._parent[self._find(m)] = first
      self._ahead[m] += 1
    self._updates += len(group.members)
    self._on_drop(t)

  def _on_drop(self, t: float) -> None:
    """Starts a new epoch if the epoch's groups connect every active worker."""
    if len({self._find(w) for w in self.active}) <= 1:
      self._parent = list(range(self.workers))
      self._ahead = [0] * self.workers
      self._updates = 0
      self.connections.append(t)

  def _find(self, w: int) -> int:
    while self._parent[w] != w:
      self._parent[w] = self._parent[self._parent[w]]
      w = self._parent[w]
    return w
