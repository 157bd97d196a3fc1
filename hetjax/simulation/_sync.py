"""Data-parallel replicas of one pipeline stage under a sync policy, on a virtual clock.

`simulate_sync` runs ``replicas`` workers (the replicas of ONE stage, worker = replica) against a
`hetjax.replicas.SyncPolicy` ('all-reduce', 'random-pairs', 'periodic-average', 'sdpipe'), driving
its engine (`SyncPolicy.engine`) as a discrete-event simulation. Times are virtual seconds; the
policy never knows, since it only sees the floats.

Event model:

- Compute. Worker w's step s (s = 1, 2, …) takes what its emulated host takes on a real replica
  (`hetjax.emulation.KnownSpeedHost`, by the same `hetjax.emulation.HostModel`): ``(factor_w(s) + delay_w(s)) ×
  step_s`` from the slowdown trace (the one grammar, `parse_trace`): ``factor_w`` is 3 for worker w under 'persistent:w:3', and
  ``delay_w(s)`` is SDPipe's transient injection, h with probability p ('transient:h:p'), the
  same draw per (seed, w, s) as on real replicas. When the compute ends the worker calls
  ``arrive(w, s, now)``.
- Grouping. The worker then blocks. The simulation calls ``poll`` once after all the events of
  one instant, and also at every ``next_deadline()`` (window expiries, time-outs) that comes
  before the next event. Events at one instant are handled resumes first, then arrivals in
  decreasing worker id (an arbitrary, deterministic tie rule; it also keeps the policies'
  barrier checks cheap at 1024 workers).
- Sync. Each member of a group closed at t resumes at ``t + sync_s(k)`` for a group of k members
  (0 for a singleton): by default the ring all-reduce's 2(k − 1)/k × ``sync_s`` with ``sync_s``
  a float; pass a callable for any other cost. Resuming completes the step (it is counted then)
  and starts the next one at once.
- Overlap (``overlap=True``, as `ReplicaDriver(overlap=True)`). An arrival completes the step at
  once and the next step's compute starts; the worker reports that next step only when both
  its compute and the sync of its previous group are done: at max(compute end, close +
  sync cost). Waiting counts only the part of the group wait and sync not hidden by compute.
- Stop. ``steps`` is the mean number of steps per worker: the run ends at the first instant T
  by which the workers have completed replicas × steps steps between them, a fixed amount of
  work (fast workers may do more than ``steps``, stragglers fewer; every resume at T counts, so
  the total may exceed it slightly). Throughput = completed steps / T. Cost: O(log replicas)
  bookkeeping per event, plus the policy's closing checks (a global sync checks every active
  worker): 1024 replicas × 20 steps take under a second per policy, plus a Python call per
  transient draw.

The policies' fault time-outs default to 1e9 s here (nobody is dropped: stragglers are slow, not
dead) unless ``timeout_s`` (or ``rules``) is passed. SDPipe's windows are absolute seconds
(`GroupRules` defaults: 2 ms, within [0.5, 10] ms); scale them with ``step_s`` if it matters.

Example::

  >>> run = simulate_sync('all-reduce', 4, steps=10, step_s=0.1, slowdown='persistent:0:3')
  >>> round(run.throughput, 9), round(run.no_wait_limit, 9)   # 4 / 0.3 vs 3 / 0.1 + 1 / 0.3
  (13.333333333, 33.333333333)
"""

from __future__ import annotations

import dataclasses
import heapq
import numbers
from collections.abc import Callable

import numpy as np

from hetjax._checks import number, positive_int, positive_seconds
from hetjax._errors import ConfigError
from hetjax.core import ring_fraction
from hetjax.emulation import ComposedTrace, HostModel, SlowdownTrace, TransientTrace, replica_trace
from hetjax.replicas import SyncName, SyncPolicy, parse_sync_name

#: Fault time-out given to the policies unless the caller passes one: nobody is ever dropped.
NO_TIMEOUT_S = 1e9


def ring_sync_s(base_s: float) -> Callable[[int], float]:
  """The ring all-reduce's cost for a group of k: 2(k − 1)/k × ``base_s`` (0 for k = 1), the
  bandwidth term of `hetjax.core.LinkCost.ring_all_reduce_s` with ``base_s`` = bytes / β."""
  base = number(base_s, 'sync_s')
  return lambda k: ring_fraction(k) * base


@dataclasses.dataclass(frozen=True)
class SyncRun:
  """What `simulate_sync` measured (see the module docstring for the event model).

  Attributes:
    policy: the policy's name.
    replicas: workers (replicas of the stage).
    total_s: virtual seconds until the workers had completed replicas × steps steps.
    steps: steps each worker completed by then.
    throughput: completed steps per second, summed over workers: sum(steps) / total_s.
    no_wait_limit: Σᵢ vᵢ, vᵢ = 1 / (worker i's expected compute time per step, its injected
      sleeps included; factors averaged over steps 1 … ``steps``): the throughput if nobody
      ever waited for a group and syncs were free. An upper bound for every policy (up to the sampling noise of the transient sleeps).
    groups: groups closed by total_s, global synchronisations included.
    global_groups: of which global synchronisations (every all-reduce group is one).
    mean_group: mean members per group, over all groups.
    mean_local_group: mean members per non-global group (0.0 if there were none).
    wait_fraction: worker-seconds spent blocked between arrival and group close, over
      replicas × total_s (sync costs not included).
    sync_fraction: worker-seconds spent in group syncs (by total_s), over replicas × total_s.
  """

  policy: str
  replicas: int
  total_s: float
  steps: tuple[int, ...]
  throughput: float
  no_wait_limit: float
  groups: int
  global_groups: int
  mean_group: float
  mean_local_group: float
  wait_fraction: float
  sync_fraction: float

  @property
  def efficiency(self) -> float:
    """throughput / no_wait_limit."""
    return self.throughput / self.no_wait_limit


def simulate_sync(policy_name: str | SyncName, replicas: int, steps: int, step_s: float = 0.1,
                  slowdown: str | SlowdownTrace | None = 'none',
                  sync_s: float | Callable[[int], float] = 0.0, seed: int = 0,
                  overlap: bool = False, **policy_options) -> SyncRun:
  """Simulates ``replicas`` replicas of one stage under a sync policy (see the module docstring).

  Args:
    policy_name: 'all-reduce', 'random-pairs', 'periodic-average' or 'sdpipe'
      (`hetjax.replicas.SyncPolicy`'s name).
    replicas: workers.
    steps: mean steps per worker: the run stops once replicas × steps steps are done.
    step_s: a healthy worker's compute seconds per step.
    slowdown: the replicas' slowdown: a `parse_trace` spec or a `SlowdownTrace`.
    sync_s: a float base for the ring cost 2(k − 1)/k × base of a k-member group, or a callable
      k -> seconds (a singleton always costs 0).
    seed: seeds the transient sleeps (unless the spec names a seed) and 'random-pairs''s pairing
      (unless ``seed`` is in the options).
    overlap: the group wait and sync overlap the next step's compute (module docstring).
    **policy_options: the policy's options (`hetjax.replicas.SyncPolicy`; e.g. ``every=4``,
      ``max_group=3``).

  Raises:
    ConfigError: a bad argument, slowdown spec or policy option, in one line.
  """
  replicas = positive_int(replicas, 'replicas')
  budget = replicas * positive_int(steps, 'steps')
  step_s = positive_seconds(step_s, 'step_s')
  cost = sync_s if callable(sync_s) else ring_sync_s(sync_s)
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise ConfigError(f'seed must be an int, got {seed!r}')
  trace = replica_trace(slowdown, replicas, int(seed))
  name = parse_sync_name(policy_name).value
  if 'timeout_s' not in policy_options and 'rules' not in policy_options:
    policy_options['timeout_s'] = NO_TIMEOUT_S
  if name == SyncName.RANDOM_PAIRS.value:
    policy_options.setdefault('seed', int(seed))
  engine = SyncPolicy(policy_name, replicas, policy_options).engine()

  durations: dict[int, np.ndarray] = {}
  host = HostModel(row_s=step_s)  # a replica's host: one row of step_s, as on real replicas

  def duration(w: int, s: int) -> float:  # step s = 1, 2, …, everyone's drawn at once
    if s not in durations:
      durations[s] = host.step_s(1, trace.factors(s) + trace.delays(s))
    return float(durations[s][w])

  # Events: (time, kind, -worker); kind 0 = resume (sync done), 1 = arrival (compute done).
  done = [0] * replicas
  arrived_at: list[float | None] = [None] * replicas
  resume_at = [0.0] * replicas
  compute_end = [0.0] * replicas  # overlap: when the step after the reported one is computed
  events = [(duration(w, 1), 1, -w) for w in range(replicas)]
  heapq.heapify(events)
  total = waited = synced = 0.0
  completed = n_groups = n_global = members = local_members = 0
  t = 0.0
  while completed < budget:
    due = engine.next_deadline()
    if events and (due is None or events[0][0] <= due):
      t = events[0][0]
    elif due is not None:
      t = max(due, t)
    else:
      raise RuntimeError(f'{name}: every worker waits and no deadline is due at t = {t}')
    while events and events[0][0] == t:
      _, kind, neg = heapq.heappop(events)
      w = -neg
      if kind == 0:
        done[w] += 1
        completed += 1
        heapq.heappush(events, (t + duration(w, done[w] + 1), 1, neg))
      elif overlap:  # the step is done; the next one computes while the group forms
        arrived_at[w] = t
        done[w] += 1
        completed += 1
        compute_end[w] = t + duration(w, done[w] + 1)
        engine.arrive(w, done[w], t)
      else:
        arrived_at[w] = t
        engine.arrive(w, done[w] + 1, t)
    if completed >= budget:
      break
    for group in engine.poll(t):
      k = len(group.members)
      n_groups += 1
      members += k
      if group.global_sync:
        n_global += 1
      else:
        local_members += k
      end = t + (cost(k) if k > 1 else 0.0)
      for m in group.members:
        if overlap:  # only what the next step's compute does not hide
          waited += max(0.0, t - compute_end[m])
          synced += max(0.0, end - max(t, compute_end[m]))
          heapq.heappush(events, (max(end, compute_end[m]), 1, -m))
        else:
          waited += t - arrived_at[m]
          resume_at[m] = end
          heapq.heappush(events, (end, 0, -m))
          synced += end - t
        arrived_at[m] = None
  total = t
  for w in range(replicas):
    if arrived_at[w] is not None:
      waited += max(0.0, total - compute_end[w]) if overlap else total - arrived_at[w]
    elif resume_at[w] > total:  # still syncing: count only the part before the end
      synced -= resume_at[w] - total
  factors = np.mean([trace.factors(s) for s in range(1, steps + 1)], axis=0)
  limit = float(np.sum(1.0 / host.step_s(1, factors + _mean_delay(trace))))
  span = replicas * total
  return SyncRun(
      policy=engine.name, replicas=replicas, total_s=total, steps=tuple(done),
      throughput=completed / total, no_wait_limit=limit, groups=n_groups,
      global_groups=n_global, mean_group=members / n_groups if n_groups else 0.0,
      mean_local_group=(local_members / (n_groups - n_global) if n_groups > n_global else 0.0),
      wait_fraction=waited / span, sync_fraction=synced / span)


def _mean_delay(trace: SlowdownTrace) -> float:
  """The expected delay per step, in steps: p × h for SDPipe's transients (summed over a
  product's parts), 0 for the traces that only change factors."""
  if isinstance(trace, TransientTrace):
    return trace.p * trace.h
  if isinstance(trace, ComposedTrace):
    return sum(_mean_delay(part) for part in trace.parts)
  return 0.0
