"""Sync policies as values, the Optax way: ``init() -> state``, ``update(state, event) ->
(groups, state)``.

A sync policy reacts to events, not to steps of one loop: a replica finished a step (`Arrive`),
stopped (`Leave`), or time passed (`Tick`, at the policy's deadline). `SyncValuePolicy` holds
only the settings (name, workers, options); everything the policy learns — SDPipe's adaptive
windows and staleness epoch, the random pairing's RNG, the group sequence numbers, who waits
and since when — lives in the state it returns, a pytree of numpy arrays and Python scalars of
fixed structure that `hetjax.core.encode_state` saves exactly. So a checkpoint holds it, and a
resumed run continues with what the policy had learned.

The event-driven policies (`make_sync_policy`: ``arrive`` / ``leave`` / ``poll``) stay the
engine: `SyncService` and `simulate_sync` drive one object event after event, which costs
O(log workers) per event; `update` rebuilds a policy from its state around each event
(O(workers)), so it is the interface for checkpoints, tests and replays, not the hot path. Both
give the same groups: `update` is ``load_state``, the event, ``poll``, ``state``.

Example::

  >>> policy = SyncValuePolicy('periodic-average', 2, {'every': 2})
  >>> state = policy.init()
  >>> groups, state = policy.update(state, Arrive(0, 1, 0.0))
  >>> groups
  [SyncGroup(members=(0,), step=1, global_sync=False, seq=0, steps=(1,))]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from hetjax.sync._policies import SyncPolicy, make_sync_policy, parse_sync_name
from hetjax.sync._policy_base import SyncGroup


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
  """Time ``t`` has come (e.g. the policy's `SyncValuePolicy.deadline`)."""

  t: float


SyncEvent = Arrive | Leave | Tick


@dataclasses.dataclass(frozen=True)
class SyncValuePolicy:
  """A sync policy as a value (module docstring).

  Attributes:
    sync: the policy's name (`make_sync_policy`).
    workers: the replicas it groups.
    options: its keyword options (e.g. ``{'max_group': 3}``).
  """

  sync: str
  workers: int
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    object.__setattr__(self, 'sync', parse_sync_name(self.sync).value)
    object.__setattr__(self, 'options', dict(self.options))
    self.make()  # bad options fail here, in one line

  @property
  def name(self) -> str:
    return self.sync

  def make(self, state: Any = None) -> SyncPolicy:
    """The event-driven policy of these settings, continued from ``state`` if given."""
    policy = make_sync_policy(self.sync, self.workers, **self.options)
    if state is not None:
      policy.load_state(state)
    return policy

  def init(self) -> Any:
    """A fresh policy's state."""
    return self.make().state()

  def update(self, state: Any, event: SyncEvent) -> tuple[list[SyncGroup], Any]:
    """The groups that close by ``event``'s time, and the state after it."""
    policy = self.make(state)
    if isinstance(event, Arrive):
      policy.arrive(event.worker, event.step, event.t)
    elif isinstance(event, Leave):
      policy.leave(event.worker, event.t)
    groups = policy.poll(event.t)
    return groups, policy.state()

  def deadline(self, state: Any) -> float | None:
    """When the policy next needs a `Tick` if nothing arrives (`SyncPolicy.next_deadline`)."""
    return self.make(state).next_deadline()


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
