"""Data-parallel replicas of one pipeline stage under a sync policy, on a virtual clock.

`simulate_sync` runs ``replicas`` workers (the replicas of ONE stage, worker = replica) against a
policy from `make_sync_policy` ('all-reduce', 'ad-psgd', 'ps', 'sdpipe') as a discrete-event
simulation. Times are virtual seconds; the policy never knows, since it only sees the floats.

Event model:

- Compute. Worker w's step s (s = 1, 2, …) takes ``step_s × factor_w + sleep_w(s)``: ``factor_w``
  is 3 for a 'persistent:w:3' straggler (else 1), and ``sleep_w(s)`` is SDPipe's transient
  injection, ``h × step_s`` with probability p ('transient:h:p'), drawn from a numpy RNG seeded
  with ``seed`` (else 0). When the compute ends the worker calls ``arrive(w, s, now)``.
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
  worker): 1024 replicas × 20 steps take 0.2–0.6 s per policy.

The policies' fault time-outs default to 1e9 s here (nobody is dropped: stragglers are slow, not
dead) unless ``timeout_s`` (or ``rules``) is passed. SDPipe's windows are absolute seconds
(`GroupRules` defaults: 2 ms, within [0.5, 10] ms); scale them with ``step_s`` if it matters.

Example::

  >>> run = simulate_sync('all-reduce', 4, steps=10, step_s=0.1, straggler='persistent:0:3')
  >>> round(run.throughput, 9), round(run.no_wait_limit, 9)   # 4 / 0.3 vs 3 / 0.1 + 1 / 0.3
  (13.333333333, 33.333333333)
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import numbers
from collections.abc import Callable

import numpy as np

from hetjax._errors import ConfigError
from hetjax.pipeline._policies import SyncName, make_sync_policy
from hetjax.pipeline._schedule import positive_int

#: Fault time-out given to the policies unless the caller passes one: nobody is ever dropped.
NO_TIMEOUT_S = 1e9


@dataclasses.dataclass(frozen=True)
class Straggler:
  """Which workers are slow, and how (`parse_straggler` reads the string forms).

  Attributes:
    kind: 'none'; 'transient' (SDPipe's injection: before each step, with probability ``p``, a
      worker sleeps ``h × step_s`` extra; the paper uses h ∈ {1, 3}, p = 0.1); or 'persistent'
      (worker ``worker`` always computes ``factor``× slower).
    h: the transient sleep, in steps.
    p: the probability of a transient sleep before each step.
    worker: the persistent straggler's id.
    factor: the persistent straggler's slowdown (> 0; 1 is no straggler).
  """

  kind: str = 'none'
  h: float = 0.0
  p: float = 0.1
  worker: int = 0
  factor: float = 1.0

  def __post_init__(self):
    if self.kind not in ('none', 'transient', 'persistent'):
      raise ConfigError(f"straggler kind must be 'none', 'transient' or 'persistent', "
                        f'got {self.kind!r}')
    _real(self.h, 'straggler h', 0.0)
    if _real(self.p, 'straggler p', 0.0) > 1:
      raise ConfigError(f'straggler p must lie in [0, 1], got {self.p!r}')
    if isinstance(self.worker, bool) or not isinstance(self.worker, numbers.Integral) \
        or self.worker < 0:
      raise ConfigError(f'straggler worker must be an int >= 0, got {self.worker!r}')
    if _real(self.factor, 'straggler factor', 0.0) == 0:
      raise ConfigError(f'straggler factor must be > 0, got {self.factor!r}')

  def factors(self, replicas: int) -> list[float]:
    """Each worker's compute slowdown (transient sleeps apart)."""
    out = [1.0] * replicas
    if self.kind == 'persistent':
      if self.worker >= replicas:
        raise ConfigError(f'straggler worker {self.worker} is not one of the {replicas} replicas')
      out[self.worker] = float(self.factor)
    return out

  def mean_sleep(self) -> float:
    """Expected sleep before a step, in steps (p × h; 0 unless transient)."""
    return self.p * self.h if self.kind == 'transient' else 0.0


def _real(value: object, what: str, low: float) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) \
      or not low <= value < math.inf:
    raise ConfigError(f'{what} must be a finite number >= {low}, got {value!r}')
  return float(value)


def parse_straggler(spec: str | Straggler | None) -> Straggler:
  """A `Straggler` from 'none', 'transient:h[:p]' (p = 0.1 if left out) or 'persistent:i:f'.

  Example::

    >>> parse_straggler('transient:3')
    Straggler(kind='transient', h=3.0, p=0.1, worker=0, factor=1.0)

  Raises:
    ConfigError: an unknown kind, a wrong number of fields or a bad value, in one line.
  """
  if spec is None:
    return Straggler()
  if isinstance(spec, Straggler):
    return spec
  if not isinstance(spec, str):
    raise ConfigError(f'straggler must be a string or a Straggler, got {type(spec).__name__}')
  kind, *fields = spec.strip().split(':')
  forms = {'none': (0, 0), 'transient': (1, 2), 'persistent': (2, 2)}
  if kind not in forms or not forms[kind][0] <= len(fields) <= forms[kind][1]:
    raise ConfigError(f"bad straggler spec {spec!r}: use 'none', 'transient:h[:p]' or "
                      f"'persistent:worker:factor'")
  try:
    if kind == 'transient':
      return Straggler('transient', h=float(fields[0]),
                       p=float(fields[1]) if len(fields) > 1 else 0.1)
    if kind == 'persistent':
      return Straggler('persistent', worker=int(fields[0]), factor=float(fields[1]))
  except ValueError:
    raise ConfigError(f'bad straggler spec {spec!r}: its fields must be numbers') from None
  return Straggler()


def ring_sync_s(base_s: float) -> Callable[[int], float]:
  """The ring all-reduce's cost for a group of k: 2(k − 1)/k × ``base_s`` (0 for k = 1)."""
  base = _real(base_s, 'sync_s', 0.0)
  return lambda k: 2.0 * (k - 1) / k * base


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
      sleeps included): the throughput if nobody ever waited for a group and syncs were free.
      An upper bound for every policy (up to the sampling noise of the transient sleeps).
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
                  straggler: str | Straggler | None = 'none',
                  sync_s: float | Callable[[int], float] = 0.0, seed: int = 0,
                  overlap: bool = False, **policy_options) -> SyncRun:
  """Simulates ``replicas`` replicas of one stage under a sync policy (see the module docstring).

  Args:
    policy_name: 'all-reduce', 'ad-psgd', 'ps' or 'sdpipe' (`make_sync_policy`).
    replicas: workers.
    steps: mean steps per worker: the run stops once replicas × steps steps are done.
    step_s: a healthy worker's compute seconds per step.
    straggler: a `Straggler` or its string form (`parse_straggler`).
    sync_s: a float base for the ring cost 2(k − 1)/k × base of a k-member group, or a callable
      k -> seconds (a singleton always costs 0).
    seed: seeds the transient sleeps, and 'ad-psgd''s pairing unless ``seed`` is in the options.
    overlap: the group wait and sync overlap the next step's compute (module docstring).
    **policy_options: passed to `make_sync_policy` (e.g. ``every=4``, ``max_group=3``).

  Raises:
    ConfigError: a bad argument, straggler spec or policy option, in one line.
  """
  replicas = positive_int(replicas, 'replicas')
  budget = replicas * positive_int(steps, 'steps')
  step_s = _real(step_s, 'step_s', 0.0)
  if step_s == 0:
    raise ConfigError('step_s must be > 0')
  model = parse_straggler(straggler)
  cost = sync_s if callable(sync_s) else ring_sync_s(sync_s)
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise ConfigError(f'seed must be an int, got {seed!r}')
  name = SyncName(policy_name).value if isinstance(policy_name, SyncName) else policy_name
  if 'timeout_s' not in policy_options and 'rules' not in policy_options:
    policy_options['timeout_s'] = NO_TIMEOUT_S
  if name == SyncName.AD_PSGD.value:
    policy_options.setdefault('seed', int(seed))
  policy = make_sync_policy(policy_name, replicas, **policy_options)

  factors = model.factors(replicas)
  base = [step_s * f for f in factors]
  rng = np.random.default_rng(int(seed))
  sleeps: list[list[float]] = [[] for _ in range(replicas)]

  def duration(w: int, s: int) -> float:  # step s = 1, 2, …
    if model.kind != 'transient':
      return base[w]
    if s > len(sleeps[0]):  # draw the next block of steps for everyone, in a fixed order
      hit = rng.random((replicas, max(s - len(sleeps[0]), steps))) < model.p
      extra = np.where(hit, model.h * step_s, 0.0).tolist()
      for row, more in zip(sleeps, extra, strict=True):
        row.extend(more)
    return base[w] + sleeps[w][s - 1]

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
    due = policy.next_deadline()
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
        policy.arrive(w, done[w], t)
      else:
        arrived_at[w] = t
        policy.arrive(w, done[w] + 1, t)
    if completed >= budget:
      break
    for group in policy.poll(t):
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
  limit = sum(1.0 / (b + model.mean_sleep() * step_s) for b in base)
  span = replicas * total
  return SyncRun(
      policy=policy.name, replicas=replicas, total_s=total, steps=tuple(done),
      throughput=completed / total, no_wait_limit=limit, groups=n_groups,
      global_groups=n_global, mean_group=members / n_groups if n_groups else 0.0,
      mean_local_group=(local_members / (n_groups - n_global) if n_groups > n_global else 0.0),
      wait_fraction=waited / span, sync_fraction=synced / span)
