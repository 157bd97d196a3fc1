"""The replica sync policy, the Optax way: ``init() -> state``, ``on_event(state, event) ->
(groups, state)``.

A sync policy reacts to events, not to steps of one loop: a replica finished a step (`Arrive`),
stopped (`Leave`), or time passed (`Tick`, at the policy's `SyncPolicy.deadline`). `SyncPolicy`
holds only the settings (name, workers, options); everything the policy learns — SDPipe's
adaptive windows and staleness epoch, the random pairing's RNG, the group sequence numbers, who
waits and since when — lives in the state it returns, a pytree of numpy arrays and Python
scalars of fixed structure that `hetjax.core.encode_state` saves exactly. So a checkpoint holds
it, and a resumed run continues with what the policy had learned.

One policy, three ways to drive it:

- As a value: `init` / `on_event` / `deadline`, for checkpoints, tests and replays. `on_event`
  rebuilds the engine from the state around each event (O(workers)).
- Its engine (`SyncPolicy.engine`, continued from a state if given): the mutable
  ``arrive`` / ``leave`` / ``poll`` object (`hetjax.replicas._engines`) that `SyncService` and
  `hetjax.simulation.simulate_sync` drive event after event, O(log workers) an event. Both give
  the same groups: `on_event` is ``load_state``, the event, ``poll``, ``state``.
- In the training loop (`ReplicaPolicy`): the loop's policy for a pipeline replica (a
  `hetjax.core.Policy`, whose ``update`` follows steps), which runs this policy's `SyncService` on
  worker 0 and carries its state into checkpoints. A sync policy is told events, not steps, so
  its call has its own name.

Example::

  >>> policy = SyncPolicy('periodic-average', 2, {'every': 2})
  >>> state = policy.init()
  >>> groups, state = policy.on_event(state, Arrive(0, 1, 0.0))
  >>> groups
  [SyncGroup(members=(0,), step=1, global_sync=False, seq=0, steps=(1,))]
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import numpy as np

from hetjax._errors import ConfigError, parse_choice
from hetjax.replicas._engine_base import SyncGroup
from hetjax.replicas._engines import (
  AllReduceScheduler,
  GroupEngine,
  PeriodicAverageScheduler,
  RandomPairsScheduler,
)
from hetjax.replicas._scheduler import GroupRules, GroupScheduler


class SyncName(enum.Enum):
  """The sync policies there are (`SyncPolicy.name`)."""

  ALL_REDUCE = 'all-reduce'
  RANDOM_PAIRS = 'random-pairs'
  PERIODIC_AVERAGE = 'periodic-average'
  SDPIPE = 'sdpipe'


#: Names the baselines had, after algorithms they only resemble.
RENAMED_SYNC_NAMES = {'ad-psgd': SyncName.RANDOM_PAIRS, 'ps': SyncName.PERIODIC_AVERAGE}


def parse_sync_name(name: str | SyncName) -> SyncName:
  """``name`` as a `SyncName`, or a one-line `ConfigError` listing the names (an old name says
  its new one).

  Example::

    >>> parse_sync_name('sdpipe')
    <SyncName.SDPIPE: 'sdpipe'>
  """
  if isinstance(name, str) and name in RENAMED_SYNC_NAMES:
    new = RENAMED_SYNC_NAMES[name].value
    raise ConfigError(f'sync policy {name!r} is now {new!r} (named for what it does); choose '
                      f'one of: {", ".join(c.value for c in SyncName)}')
  return parse_choice(SyncName, name, 'sync policy')


_RULE_FIELDS = tuple(f.name for f in dataclasses.fields(GroupRules))
_OPTIONS = {
    SyncName.ALL_REDUCE: ('timeout_s',),
    SyncName.RANDOM_PAIRS: ('seed', 'window_s', 'timeout_s'),
    SyncName.PERIODIC_AVERAGE: ('every', 'timeout_s'),
    SyncName.SDPIPE: ('rules', *_RULE_FIELDS),
}


@dataclasses.dataclass(frozen=True)
class Arrive:
  """Replica ``worker`` finished step ``step`` at time ``t`` and waits for its group."""

  worker: int
  step: int
  t: float


@dataclasses.dataclass(frozen=True)
class Leave:
  """Replica ``worker`` stopped at time ``t``."""

  worker: int
  t: float


@dataclasses.dataclass(frozen=True)
class Tick:
  """Time ``t`` has come (e.g. the policy's `SyncPolicy.deadline`)."""

  t: float


SyncEvent = Arrive | Leave | Tick


@dataclasses.dataclass(frozen=True)
class SyncPolicy:
  """Which replicas of a pipeline stage average their parameters, and when (module docstring).

  Attributes:
    name: one of `SyncName`'s values: 'all-reduce', 'random-pairs', 'periodic-average' or
      'sdpipe' (a `SyncName` is taken too).
    workers: the replicas it groups.
    options: its keyword options: 'all-reduce' takes ``timeout_s``; 'random-pairs' ``seed``,
      ``window_s``, ``timeout_s``; 'periodic-average' ``every``, ``timeout_s``; 'sdpipe' either
      ``rules`` (a `GroupRules`) or `GroupRules` fields (e.g. ``{'max_group': 3}``), which then
      override ``rules``' values.

  Raises:
    ConfigError: an unknown name or option (the message lists the known ones), or a bad value,
      in one line.
  """

  name: str
  workers: int
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    object.__setattr__(self, 'name', parse_sync_name(self.name).value)
    object.__setattr__(self, 'options', dict(self.options))
    known = _OPTIONS[SyncName(self.name)]
    unknown = sorted(set(self.options) - set(known))
    if unknown:
      raise ConfigError(f'sync policy {self.name!r} has no option {unknown[0]!r}; it takes: '
                        f'{", ".join(known)}')
    self.engine()  # bad values fail here, in one line

  def engine(self, state: Any = None) -> GroupEngine:
    """The event-driven engine of these settings (module docstring), continued from ``state``
    (from `init`, `update` or `GroupEngine.state`) if given."""
    options = dict(self.options)
    choice = SyncName(self.name)
    if choice is SyncName.ALL_REDUCE:
      engine = AllReduceScheduler(self.workers, **options)
    elif choice is SyncName.RANDOM_PAIRS:
      engine = RandomPairsScheduler(self.workers, **options)
    elif choice is SyncName.PERIODIC_AVERAGE:
      engine = PeriodicAverageScheduler(self.workers, **options)
    else:
      rules = options.pop('rules', None)
      base = GroupRules() if rules is None else rules
      if options and isinstance(base, GroupRules):
        rules = dataclasses.replace(base, **options)
      engine = GroupScheduler(self.workers, rules)
    if state is not None:
      engine.load_state(state)
    return engine

  def init(self) -> Any:
    """A fresh policy's state."""
    return self.engine().state()

  def on_event(self, state: Any, event: SyncEvent) -> tuple[list[SyncGroup], Any]:
    """The groups that close by ``event``'s time, and the state after it."""
    engine = self.engine(state)
    if isinstance(event, Arrive):
      engine.arrive(event.worker, event.step, event.t)
    elif isinstance(event, Leave):
      engine.leave(event.worker, event.t)
    groups = engine.poll(event.t)
    return groups, engine.state()

  def deadline(self, state: Any) -> float | None:
    """When the policy next needs a `Tick` if nothing arrives (its engine's ``next_deadline``)."""
    return self.engine(state).next_deadline()


def resume_state(state: Any, step: int) -> Any:
  """``state`` cut at a checkpoint: every replica restarts after ``step``.

  What the policy learned (windows, epoch, RNG, sequence numbers, its clock, logs) is kept;
  what was in flight when the state was taken (arrivals waiting for a group, the open group,
  pending global synchronisations, dropped workers) is dropped, since every replica reports
  again from step ``step + 1``, and each replica's last grouped step becomes ``step``.
  """
  n = len(state['done'])
  return {**state,
          'done': np.full(n, int(step), np.int64),
          'pending_step': np.full(n, -1, np.int64), 'pending_t': np.full(n, np.nan),
          'dropped': np.zeros(n, bool),
          'barrier_step': np.zeros(0, np.int64), 'barrier_worker': np.zeros(0, np.int64),
          'open': np.zeros(0, np.int64), 'expired': False}
