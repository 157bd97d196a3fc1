"""The event-driven engines behind `hetjax.replicas.SyncPolicy`: one per policy, one Protocol.

A `SyncPolicy` is a value (its settings); its engine (`SyncPolicy.engine`) is the mutable object
that `SyncService` and `hetjax.simulation.simulate_sync` drive event after event, at
O(log workers) an event. Every engine is driven the same way (`GroupEngine`): `arrive` when a
replica finishes a step, `poll` right after and at `next_deadline`, `leave` after its last
step, and each returned `SyncGroup` averages its members' parameters. All share `Grouper`'s
rules (see `hetjax.replicas._scheduler`) for duplicate, stale and early messages, time-outs (a
silent worker is dropped once others have waited ``timeout_s`` for it, and readmitted when it
arrives again) and global synchronisations (a group of every active worker at one step). Each
engine's state (what it learned and who waits) is a value: `Grouper.state` /
`Grouper.load_state`, what `SyncPolicy.init` / `SyncPolicy.update` hand around. What differs is
who groups with whom:

- ``all-reduce`` (`AllReduceScheduler`): every step is a global synchronisation.
- ``random-pairs`` (`RandomPairsScheduler`): random pairs of ready workers. The first waiting
  arrival opens a pool for ``window_s``; later arrivals join it. When the window ends, or at
  once when every active worker is in the pool, the pool is shuffled with the engine's own
  seeded RNG and cut into consecutive pairs (each pair listed in arrival order, pairs in order
  of their first member's arrival). With an odd count the last shuffled worker stays, alone, as
  the first member of a new pool whose window starts then, to pair among the next arrivals; a
  pool of one at its end is a singleton group (the worker was alone: no one arrived within a
  window). Unlike AD-PSGD's one-sided atomic averaging, both members of a pair wait at their
  sync points; the pool window keeps that wait short. (Earlier named ``ad-psgd``, after the
  algorithm it only resembles.)
- ``periodic-average`` (`PeriodicAverageScheduler`): steps that are multiples of ``every``
  synchronise everyone; any other step returns a singleton group at once (no averaging: a
  local step). Local SGD with periodic model averaging; there is no parameter server (earlier
  named ``ps``).
- ``sdpipe`` (`hetjax.replicas._scheduler.GroupScheduler`): SDPipe's adaptive groups with bounded
  staleness.

Example::

  >>> engine = SyncPolicy('periodic-average', 2, {'every': 2}).engine()
  >>> engine.arrive(0, 1, 0.0); engine.poll(0.0)
  [SyncGroup(members=(0,), step=1, global_sync=False, seq=0, steps=(1,))]
"""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hetjax._checks import positive_int, positive_seconds
from hetjax._errors import ConfigError
from hetjax.replicas._engine_base import Grouper, SyncGroup


@runtime_checkable
class GroupEngine(Protocol):
  """Turns one stage's replica arrivals into `SyncGroup`s; times are caller-supplied seconds.

  Everything `SyncService`, `SyncPolicy` and `simulate_sync` use of an engine.
  """

  @property
  def name(self) -> str: ...

  @property
  def workers(self) -> int: ...

  @property
  def now(self) -> float: ...

  @property
  def dropped(self) -> frozenset[int]: ...

  drops: list[tuple[int, float]]
  rejoins: list[tuple[int, float]]
  ignored: dict[str, int]

  def arrive(self, worker: int, step: int, now: float) -> None: ...

  def leave(self, worker: int, now: float) -> None: ...

  def poll(self, now: float) -> list[SyncGroup]: ...

  def next_deadline(self) -> float | None: ...

  def state(self) -> Any: ...

  def load_state(self, state: Any) -> None: ...


class AllReduceScheduler(Grouper):
  """Everyone, every step: each step's group closes when every active worker has arrived."""

  name = 'all-reduce'

  def __init__(self, workers: int, timeout_s: float = 5.0):
    super().__init__(workers, timeout_s)

  def _is_sync(self, step: int) -> bool:
    return True


class PeriodicAverageScheduler(Grouper):
  """Everyone at steps that are multiples of ``every`` (step 0 too), a singleton otherwise."""

  name = 'periodic-average'

  def __init__(self, workers: int, every: int = 10, timeout_s: float = 5.0):
    super().__init__(workers, timeout_s)
    self.every = positive_int(every, 'every')

  def _is_sync(self, step: int) -> bool:
    return step % self.every == 0

  def _accept(self, worker: int, step: int, t: float) -> None:
    self._emit([worker], [step], False, t)


class RandomPairsScheduler(Grouper):
  """Random pairs of the workers that arrive within a window (see the module docstring)."""

  name = 'random-pairs'

  def __init__(self, workers: int, seed: int = 0, window_s: float = 0.002,
               timeout_s: float = 5.0):
    super().__init__(workers, timeout_s)
    self.window_s = positive_seconds(window_s, 'window_s')
    if self._timeout <= self.window_s:
      raise ConfigError(f'timeout_s ({timeout_s}) must exceed window_s ({window_s})')
    self._rng = random.Random(seed)

  def _window_of(self, worker: int) -> float:
    return self.window_s

  def _policy_state(self) -> dict[str, Any]:
    """The pairing RNG's Mersenne Twister words and position."""
    words = self._rng.getstate()[1]
    return {'rng': np.array(words, np.int64)}

  def _load_policy_state(self, state: dict[str, Any]) -> None:
    self._rng.setstate((3, tuple(int(w) for w in state['rng']), None))

  def _close_some(self, t: float) -> bool:
    pool = self._open
    if not pool or not (self._expired or len(pool) >= len(self.active)):
      return False
    self._open = []
    if len(pool) == 1:
      self._emit(pool, [self._pending[pool[0]][0]], False, t)
      return True
    order = list(pool)
    self._rng.shuffle(order)
    if len(order) % 2:  # the odd one out waits on, first in a fresh pool
      odd = order.pop()
      self._accept(odd, self._pending[odd][0], t)
    pairs = sorted((sorted(order[i:i + 2], key=pool.index) for i in range(0, len(order), 2)),
                   key=lambda pair: pool.index(pair[0]))
    for pair in pairs:
      self._emit(pair, [self._pending[m][0] for m in pair], False, t)
    return True
