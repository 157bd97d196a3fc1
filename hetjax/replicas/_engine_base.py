"""What every sync policy's engine shares: arrival checks, time-outs, global syncs, group closing.

`Grouper` is the base of `GroupScheduler` (SDPipe, `hetjax.replicas._scheduler`) and of the
baselines' engines (`hetjax.replicas._engines`). Times are floats the caller passes in; see
`hetjax.replicas._scheduler` for the rules, faults and bad messages as implemented.

Cost per event: O(log workers) for the time-out bookkeeping (heaps of waiting arrivals and of
silent workers' last arrivals, stale entries skipped when they surface), plus what a policy's
closing rules cost (a global sync checks every active worker).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetjax._checks import between, integer, positive_int, positive_seconds
from hetjax._errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SyncGroup:
  """Workers that average their parameters together, as a scheduler hands them out.

  Attributes:
    members: worker ids in arrival order.
    step: the step of the first member's arrival (every member's, for a global sync).
    global_sync: True for a global synchronisation (every active worker, same step).
    seq: 0, 1, 2, … in the order the scheduler closed its groups.
    steps: each member's own step, aligned with ``members``.
  """

  members: tuple[int, ...]
  step: int
  global_sync: bool
  seq: int
  steps: tuple[int, ...] = ()


class Grouper:
  """What every sync policy's engine shares: arrival checks, drops, global syncs, closing and logs.

  Subclasses say which steps synchronise everyone (`_is_sync`), how long an open group waits
  (`_window_of` its first member) or how arrivals group (`_accept`), when the open group may close
  (`_close_some`), and follow closes and drops (`_on_close`, `_on_drop`).
  """

  def __init__(self, workers: int, timeout_s: float):
    self._workers = positive_int(workers, 'workers')
    self._timeout = positive_seconds(timeout_s, 'timeout_s')
    self._now = -math.inf
    self._done: dict[int, int] = {}  # worker -> last grouped step
    self._pending: dict[int, tuple[int, float]] = {}  # worker -> (step, arrival time)
    self._last_seen: dict[int, float] = {}
    self._dropped: set[int] = set()
    self._active: tuple[int, ...] | None = None  # cached; None after `_dropped` changes
    # Lazy heaps (an entry is current while it matches `_pending` / `_last_seen`): waiting
    # arrivals by time, and silent (active, not waiting) workers by their last arrival.
    self._waiting_heap: list[tuple[float, int]] = []
    self._silent_heap: list[tuple[float, int]] = [(-math.inf, w) for w in range(self._workers)]
    self._barriers: dict[int, list[int]] = {}  # global-sync step -> waiting workers
    self._ready: list[SyncGroup] = []
    self._seq = 0
    self.drops: list[tuple[int, float]] = []
    self.rejoins: list[tuple[int, float]] = []
    self.ignored = {'duplicate': 0, 'stale': 0, 'early': 0}
    self._open: list[int] = []  # the open (not global) group, in arrival order
    self._open_deadline = math.inf
    self._expired = False

  @property
  def workers(self) -> int:
    return self._workers

  @property
  def dropped(self) -> frozenset[int]:
    """Workers left out of grouping: timed out or gone by `leave`, and not back yet."""
    return frozenset(self._dropped)

  @property
  def active(self) -> tuple[int, ...]:
    if self._active is None:
      self._active = tuple(w for w in range(self._workers) if w not in self._dropped)
    return self._active

  @property
  def now(self) -> float:
    """The latest time this policy has seen (-inf before the first event)."""
    return self._now

  # --- the state as a value (`hetjax.replicas.SyncPolicy`) ----------------------------

  def state(self) -> dict[str, Any]:
    """Everything this policy has learned and is waiting on, as a pytree of numpy arrays and
    Python scalars whose structure is fixed by the policy (`hetjax.core.encode_state` saves it
    exactly). Take it between `poll` calls: groups closed but not handed out are not part of it.

    Raises:
      ConfigError: groups are closed but not yet polled.
    """
    if self._ready:
      raise ConfigError(f'{len(self._ready)} closed groups are not handed out yet: poll first')
    n = self._workers
    pending_step, pending_t = np.full(n, -1, np.int64), np.full(n, np.nan)
    for w, (step, t) in self._pending.items():
      pending_step[w], pending_t[w] = step, t
    done = np.full(n, -1, np.int64)
    for w, step in self._done.items():
      done[w] = step
    last_seen = np.full(n, -np.inf)
    for w, t in self._last_seen.items():
      last_seen[w] = t
    barriers = [(s, w) for s, inside in self._barriers.items() for w in inside]
    return {
        'now': float(self._now), 'seq': int(self._seq), 'done': done,
        'pending_step': pending_step, 'pending_t': pending_t, 'last_seen': last_seen,
        'dropped': np.array([w in self._dropped for w in range(n)], bool),
        'barrier_step': np.array([s for s, _ in barriers], np.int64),
        'barrier_worker': np.array([w for _, w in barriers], np.int64),
        'open': np.array(self._open, np.int64), 'open_deadline': float(self._open_deadline),
        'expired': bool(self._expired),
        'drops': _log_array(self.drops), 'rejoins': _log_array(self.rejoins),
        'ignored': {k: int(v) for k, v in self.ignored.items()},
        'policy': self._policy_state(),
    }

  def load_state(self, state: dict[str, Any]) -> None:
    """Continues from ``state`` (from `state`, of a policy with the same settings), as if this
    policy had seen the events that led to it.

    Raises:
      ConfigError: a state for another number of workers.
    """
    n = self._workers
    if np.shape(state['done']) != (n,):
      raise ConfigError(f'sync policy state is for {np.shape(state["done"])[0]} workers, this '
                        f'policy has {n}')
    self._now, self._seq = float(state['now']), int(state['seq'])
    self._done = {w: int(s) for w, s in enumerate(state['done']) if s >= 0}
    self._pending = {w: (int(s), float(t)) for w, (s, t)
                     in enumerate(zip(state['pending_step'], state['pending_t'], strict=True))
                     if s >= 0}
    self._last_seen = {w: float(t) for w, t in enumerate(state['last_seen']) if t > -math.inf}
    self._dropped = {w for w, d in enumerate(state['dropped']) if d}
    self._active = None
    self._barriers = {}
    for s, w in zip(state['barrier_step'], state['barrier_worker'], strict=True):
      self._barriers.setdefault(int(s), []).append(int(w))
    self._open = [int(w) for w in state['open']]
    self._open_deadline, self._expired = float(state['open_deadline']), bool(state['expired'])
    self.drops = [(int(w), float(t)) for w, t in state['drops']]
    self.rejoins = [(int(w), float(t)) for w, t in state['rejoins']]
    self.ignored = {k: int(v) for k, v in state['ignored'].items()}
    self._ready = []
    # The lazy heaps hold at least every current entry; stale ones are skipped when they
    # surface, so rebuilding them from the current entries alone behaves the same.
    self._waiting_heap = sorted((t, w) for w, (_, t) in self._pending.items())
    self._silent_heap = sorted((self._last_seen.get(w, -math.inf), w) for w in range(n)
                               if w not in self._pending and w not in self._dropped)
    self._load_policy_state(state['policy'])

  def _policy_state(self) -> dict[str, Any]:
    """What a subclass learns beyond the shared bookkeeping (fixed structure)."""
    return {}

  def _load_policy_state(self, state: dict[str, Any]) -> None:
    pass

  def _set_dropped(self, worker: int, dropped: bool) -> None:
    if dropped:
      self._dropped.add(worker)
    else:
      self._dropped.discard(worker)
    self._active = None

  def arrive(self, worker: int, step: int, now: float) -> None:
    """Worker ``worker`` finished step ``step`` at time ``now`` and waits for its group."""
    worker = self._check_worker(worker)
    step, now = integer(step, 'step'), self._advance(now)
    verdict = self._verdict(worker, step)
    if verdict is not None:
      self.ignored[verdict] += 1
      return
    if worker in self._dropped:
      self._set_dropped(worker, False)
      self.rejoins.append((worker, now))
    self._pending[worker] = (step, now)
    self._last_seen[worker] = now
    heapq.heappush(self._waiting_heap, (now, worker))
    if self._is_sync(step):
      self._barriers.setdefault(step, []).append(worker)
    else:
      self._accept(worker, step, now)
    self._settle(now)

  def leave(self, worker: int, now: float) -> None:
    """Worker ``worker`` stops (e.g. it ran its last step): it joins `dropped`, not ``drops``,
    and nobody waits for it any more; an arrival later readmits it like a rejoin."""
    worker, now = self._check_worker(worker), self._advance(now)
    if worker in self._pending:
      raise ConfigError(f'worker {worker} is waiting for its group and cannot leave')
    self._set_dropped(worker, True)
    self._on_drop(now)
    self._settle(now)

  def poll(self, now: float) -> list[SyncGroup]:
    """The groups closed up to ``now`` and not handed out yet, in the order they closed."""
    self._advance(now)
    ready, self._ready = self._ready, []
    return ready

  def next_deadline(self) -> float | None:
    """When `poll` next has something to do (≤ the last time seen: now), or None: on arrival."""
    times = [t for t in (self._deadline(), self._now if self._ready else None) if t is not None]
    drop = self._next_drop()
    return min([*times, *([] if drop is None else [drop])], default=None)

  # --- shared machinery --------------------------------------------------------------------

  def _check_worker(self, worker: object) -> int:
    return between(worker, 0, self._workers - 1, 'worker')

  def _verdict(self, worker: int, step: int) -> str | None:
    pending = self._pending.get(worker)
    last = pending[0] if pending is not None else self._done.get(worker)
    if last is None or (pending is None and step > last):
      return None
    return 'duplicate' if step == last else 'stale' if step < last else 'early'

  def _advance(self, now: float) -> float:
    """Runs the window expiries and drops due up to ``now``, in time order; returns ``now``."""
    if isinstance(now, bool) or not isinstance(now, numbers.Real) or not math.isfinite(now):
      raise ConfigError(f'now must be a finite time in seconds, got {now!r}')
    now = max(float(now), self._now)
    while True:
      due, drop = self._deadline(), self._next_drop()
      t = min((x for x in (due, drop) if x is not None), default=None)
      if t is None or t > now:
        break
      self._now = max(self._now, t)
      if due == t:
        self._expire(t)
      else:
        self._drop_due(t)
      self._settle(t)
    self._now = now
    return now

  def _oldest_waiting(self) -> float | None:
    """The earliest arrival time among waiting workers (None if nobody waits)."""
    heap = self._waiting_heap
    while heap and self._pending.get(heap[0][1], (None, None))[1] != heap[0][0]:
      heapq.heappop(heap)
    return heap[0][0] if heap else None

  def _silent(self) -> tuple[float, int] | None:
    """(last arrival, worker) of the silent worker that arrived longest ago, or None."""
    heap = self._silent_heap
    while heap and not self._is_silent(*heap[0]):
      heapq.heappop(heap)
    return heap[0] if heap else None

  def _is_silent(self, last: float, w: int) -> bool:
    return w not in self._pending and w not in self._dropped \
        and self._last_seen.get(w, -math.inf) == last

  def _next_drop(self) -> float | None:
    """When the next silent worker is dropped: each one at max(oldest waiting arrival, its own
    last arrival) + timeout, so the first is the one that arrived longest ago."""
    oldest = self._oldest_waiting()
    silent = self._silent() if oldest is not None else None
    return None if silent is None else max(oldest, silent[0]) + self._timeout

  def _drop_due(self, t: float) -> None:
    """Drops, at ``t``, every silent worker whose drop time has come (in worker order)."""
    due = []
    while (drop := self._next_drop()) is not None and drop <= t:
      due.append(heapq.heappop(self._silent_heap)[1])
      self._set_dropped(due[-1], True)
    self.drops.extend((w, t) for w in sorted(due))
    self._on_drop(t)

  def _settle(self, t: float) -> None:
    """Closes every group that may close at ``t`` (one may let another close)."""
    while self._close_barrier(t) or self._close_some(t):
      pass

  def _close_barrier(self, t: float) -> bool:
    for s in sorted(self._barriers):
      inside = self._barriers[s]
      if all(w in inside or self._done.get(w, -1) >= s or self._pending.get(w, (-1,))[0] > s
             for w in self.active):
        del self._barriers[s]
        self._emit(inside, [s] * len(inside), True, t)
        return True
    return False

  def _emit(self, members: Sequence[int], steps: Sequence[int], global_sync: bool,
            t: float) -> None:
    for m, s in zip(members, steps, strict=True):
      self._done[m] = s
      del self._pending[m]
      heapq.heappush(self._silent_heap, (self._last_seen[m], m))
    group = SyncGroup(tuple(members), steps[0], global_sync, self._seq, tuple(steps))
    self._seq += 1
    self._ready.append(group)
    self._on_close(group, t)

  # --- what subclasses decide --------------------------------------------------------------

  def _is_sync(self, step: int) -> bool:
    return False

  def _window_of(self, worker: int) -> float:
    raise NotImplementedError

  def _accept(self, worker: int, step: int, t: float) -> None:
    if not self._open:
      self._open_deadline, self._expired = t + self._window_of(worker), False
    self._open.append(worker)

  def _deadline(self) -> float | None:
    return self._open_deadline if self._open and not self._expired else None

  def _expire(self, t: float) -> None:
    self._expired = True

  def _close_some(self, t: float) -> bool:
    return False

  def _on_close(self, group: SyncGroup, t: float) -> None:
    pass

  def _on_drop(self, t: float) -> None:
    pass


def _log_array(log: Sequence[tuple[int, float]]) -> np.ndarray:
  """(worker, time) pairs as a float array of shape (len, 2)."""
  return np.array(log, np.float64).reshape(len(log), 2)
