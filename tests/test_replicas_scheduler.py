"""SDPipe's group scheduler and the baseline sync policies, as pure logic (no JAX, no processes).

Most tests drive a policy with `simulate`: blocking workers that compute for a random time,
arrive, wait for their group and start the next step, on a virtual clock. An independent
union-find checks the staleness bound, and a ledger of arrivals checks that each lands in
exactly one group, also when duplicate, stale and early messages are thrown in.
"""

from __future__ import annotations

import collections
import random

import pytest

from hetjax import ConfigError
from hetjax.replicas import SyncPolicy
from hetjax.replicas._engines import (
  AllReduceScheduler,
  GroupEngine,
  PeriodicAverageScheduler,
  RandomPairsScheduler,
)
from hetjax.replicas._scheduler import GroupRules, GroupScheduler, SyncGroup

POLICIES = ['all-reduce', 'random-pairs', 'periodic-average', 'sdpipe']


def simulate(policy, steps, duration, noise=None):
  """Runs blocking workers through steps 1 … ``steps`` against ``policy``.

  Worker w computes step k for ``duration(w, k)`` seconds, arrives, starts step k + 1 when its
  group closes and leaves after its last step. With ``noise`` (a `random.Random`), duplicate,
  stale and early messages are thrown in now and then.

  Returns:
    (groups with their close times, genuine (worker, step) arrivals, expected `ignored` counts).
  """
  n = policy.workers
  step = dict.fromkeys(range(n), 1)
  due = {w: duration(w, 1) for w in range(n)}
  pending, done, expected = {}, {}, collections.Counter()
  clock, out, arrivals = 0.0, [], []
  for _ in range(100_000):
    arrival = min(((t, w) for w, t in due.items()), default=None)
    deadline = policy.next_deadline()
    if arrival is None and deadline is None:
      break
    if deadline is not None and (arrival is None or deadline <= arrival[0]):
      clock = max(clock, deadline)
    else:
      clock, w = arrival
      del due[w]
      policy.arrive(w, step[w], clock)
      pending[w] = step[w]
      arrivals.append((w, step[w]))
    for g in policy.poll(clock):
      out.append((g, clock))
      for m, s in zip(g.members, g.steps, strict=True):
        assert pending.pop(m) == s == step[m]
        done[m] = s
        step[m] += 1
        if step[m] <= steps:
          due[m] = clock + duration(m, step[m])
        else:
          policy.leave(m, clock)  # done: nobody waits for it any more
    if noise is not None and noise.random() < 0.4:
      w = noise.randrange(n)
      kind = noise.choice(['duplicate', 'stale', 'early'])
      if kind == 'duplicate' and (w in pending or w in done):  # pending or already grouped
        policy.arrive(w, pending.get(w, done.get(w)), clock)
      elif kind == 'stale' and done.get(w, 0) >= 2:
        policy.arrive(w, noise.randrange(1, done[w]), clock)
      elif kind == 'early' and w in pending:
        policy.arrive(w, pending[w] + noise.randrange(1, 3), clock)
      else:
        continue
      expected[kind] += 1
  else:
    raise AssertionError('simulation did not finish')
  assert not due and not pending, f'stuck: computing {due}, waiting {pending}'
  return out, arrivals, expected


def jittery(seed, base=0.01, straggler=None, factor=3.0, sleeps=0.05):
  """Step times around ``base`` (±50 %); one worker ``factor`` × slower; random long sleeps."""
  def duration(w, k):
    rng = random.Random(hash((seed, w, k)))
    d = base * rng.uniform(0.5, 1.5) * (factor if w == straggler else 1.0)
    return d + (rng.uniform(0.02, 0.1) if rng.random() < sleeps else 0.0)
  return duration


def worst_ahead(groups, workers, last_step):
  """Most groups any worker joined between two points where the groups since the previous one
  connected every worker still running (a worker stops running after ``last_step``)."""
  parent, running = list(range(workers)), set(range(workers))

  def find(w):
    while parent[w] != w:
      w = parent[w]
    return w

  count, worst, connections = [0] * workers, 0, 0
  for g, _ in groups:
    for m in g.members:
      count[m] += 1
      parent[find(m)] = find(g.members[0])
    worst = max(worst, *count)
    for finished in (set(), {m for m, s in zip(g.members, g.steps, strict=True)
                             if s == last_step}):
      running -= finished
      if len({find(w) for w in running}) <= 1:
        parent, count, connections = list(range(workers)), [0] * workers, connections + 1
  return worst, connections


def members(groups):
  return [g.members for g in groups]


# --- windows and closing -------------------------------------------------------------------


def test_groups_close_at_max_size_or_window_expiry_in_arrival_order():
  s = GroupScheduler(4, GroupRules(max_group=3, ssp_bound=1000))
  s.arrive(0, 1, 0.0)
  assert s.poll(0.0019) == [] and s.next_deadline() == pytest.approx(0.002)
  assert s.poll(0.002) == [SyncGroup((0,), 1, False, 0, (1,))]
  s.arrive(2, 1, 0.010)
  s.arrive(0, 2, 0.0105)
  s.arrive(1, 1, 0.011)  # third member: closes long before its 0.012 expiry
  assert members(s.poll(0.011)) == [(2, 0, 1)]
  assert s.next_deadline() is None
  s.arrive(3, 1, 0.020)
  s.arrive(1, 2, 0.0201)
  at = s.next_deadline()
  s.arrive(2, 2, at)  # exactly at the expiry: the window is half-open, so 2 opens a new group
  assert members(s.poll(at)) == [(3, 1)]
  assert [(g.members, g.seq) for g in s.poll(at + 0.1)] == [((2,), 3)]


def test_windows_double_after_small_groups_and_shrink_otherwise():
  r = GroupRules(max_group=2, window_s=0.002, min_window_s=0.0005, max_window_s=0.010,
                 ssp_bound=1000)
  s = GroupScheduler(3, r)
  t, expected = 0.0, 0.002
  for k in range(1, 6):  # alone each time: 0.004, 0.008, 0.010 (cap), 0.010, 0.010
    s.arrive(0, k, t)
    assert s.next_deadline() == pytest.approx(t + expected)  # the opener's own window
    assert members(s.poll(t + expected)) == [(0,)]
    expected = min(2 * expected, 0.010)
    assert s.windows[0] == pytest.approx(expected)
    t += 1.0
  assert s.windows[1:] == (0.002, 0.002)
  for k in range(1, 30):  # pairs: × 0.9 each time, down to the 0.0005 floor
    s.arrive(1, k, t)
    s.arrive(2, k, t + 0.0001)
    assert members(s.poll(t + 0.0001)) == [(1, 2)]
    assert s.windows[1] == s.windows[2] == pytest.approx(max(0.002 * 0.9**k, 0.0005))
    t += 1.0
  assert s.windows[1] == 0.0005


def test_window_and_group_size_follow_the_rules_under_random_arrivals():
  r = GroupRules(max_group=3, ssp_bound=1000)
  policy = GroupScheduler(5, r)
  groups, _, _ = simulate(policy, 40, jittery(7, base=0.003))
  assert all(1 <= len(g.members) <= 3 for g, _ in groups)
  assert collections.Counter(len(g.members) for g, _ in groups)[3] > 0
  assert all(r.min_window_s <= w <= r.max_window_s for w in policy.windows)
  assert [g.seq for g, _ in groups] == list(range(len(groups)))


# --- staleness bound -----------------------------------------------------------------------


def test_soft_rule_holds_a_group_until_it_merges_components():
  s = GroupScheduler(3, GroupRules(max_group=2, ssp_bound=2))  # B = 4 updates
  for k, t in ((1, 0.0), (2, 1.0)):
    s.arrive(0, k, t)
    s.arrive(1, k, t)
    assert members(s.poll(t)) == [(0, 1)]
  assert s.updates == 4 and s.ahead == (2, 2, 0)
  s.arrive(0, 3, 2.0)
  s.arrive(1, 3, 2.0)
  assert s.poll(3.0) == []  # full and expired, but {0, 1} merges nothing: held
  s.arrive(2, 1, 3.5)
  assert members(s.poll(3.5)) == [(0, 1, 2)]  # larger than max_group
  assert s.connections == [3.5] and s.updates == 0 and s.ahead == (0, 0, 0)


def test_hard_rule_needs_every_component_not_just_a_merge():
  s = GroupScheduler(3, GroupRules(max_group=2, ssp_bound=1))  # B = 2: 2nd group must connect
  s.arrive(0, 1, 0.0)
  assert members(s.poll(1.0)) == [(0,)]
  s.arrive(0, 2, 1.0)
  s.arrive(1, 1, 1.001)
  assert s.poll(2.0) == []  # {0, 1} merges two components, but worker 2 stays apart
  s.arrive(2, 1, 2.5)
  assert members(s.poll(2.5)) == [(0, 1, 2)]
  assert s.connections == [2.5]


@pytest.mark.parametrize(('max_group', 'ssp_bound', 'workers'),
                         [(4, 4, 6), (2, 1, 4), (3, 2, 5), (2, 3, 6)])
@pytest.mark.parametrize('seed', range(8))
def test_no_worker_gets_more_than_the_bound_ahead_of_connectivity(max_group, ssp_bound,
                                                                   workers, seed):
  rules = GroupRules(max_group=max_group, ssp_bound=ssp_bound)
  duration = jittery(seed, straggler=seed % workers)
  scheduler = GroupScheduler(workers, rules)
  groups, arrivals, _ = simulate(scheduler, 40, duration)
  worst, connections = worst_ahead(groups, workers, 40)
  assert not scheduler.drops
  assert worst <= ssp_bound * max_group
  assert connections >= 40 // (ssp_bound * max_group)
  assert len(arrivals) == 40 * workers


def test_the_bound_checker_catches_unbounded_runs():
  loose = GroupRules(max_group=2, ssp_bound=10_000)
  groups, _, _ = simulate(GroupScheduler(4, loose), 40, jittery(1, straggler=0, factor=5))
  assert worst_ahead(groups, 4, 40)[0] > 2 * 2  # what (max_group 2, ssp_bound 2) must prevent


# --- global synchronisation ----------------------------------------------------------------


@pytest.mark.parametrize('seed', range(3))
def test_global_sync_at_multiples_includes_everyone(seed):
  rules = GroupRules(max_group=2, ssp_bound=1, sync_every=5)  # tight SSP: must not deadlock
  groups, _, _ = simulate(GroupScheduler(4, rules), 30, jittery(seed, straggler=1))
  syncs = [g for g, _ in groups if g.global_sync]
  assert [g.step for g in syncs] == [5, 10, 15, 20, 25, 30]
  assert all(sorted(g.members) == [0, 1, 2, 3] and set(g.steps) == {g.step} for g in syncs)
  assert all(s % 5 for g, _ in groups if not g.global_sync for s in g.steps)


# --- no loss, no duplication ---------------------------------------------------------------


@pytest.mark.parametrize('name', POLICIES)
@pytest.mark.parametrize('seed', range(3))
def test_every_arrival_lands_in_exactly_one_group_despite_bad_messages(name, seed):
  kw = {'sdpipe': {'sync_every': 7, 'ssp_bound': 2}, 'periodic-average': {'every': 4},
        'random-pairs': {'seed': seed}}.get(name, {})
  policy = SyncPolicy(name, 5, kw).engine()
  groups, arrivals, expected = simulate(policy, 30, jittery(seed, straggler=2),
                                        noise=random.Random(seed))
  grouped = [(m, s) for g, _ in groups for m, s in zip(g.members, g.steps, strict=True)]
  assert collections.Counter(grouped) == collections.Counter(arrivals)
  assert len(grouped) == len(set(grouped)) == 30 * 5
  assert {k: v for k, v in policy.ignored.items() if v} == dict(expected)
  assert min(expected.values()) > 0 and len(expected) == 3


def test_same_calls_give_the_same_groups():
  runs = [simulate(SyncPolicy(name, 4, {'seed': 3} if name == 'random-pairs' else {}).engine(),
                   20, jittery(5, straggler=0))[0]
          for name in POLICIES for _ in range(2)]
  assert all(runs[i] == runs[i + 1] for i in range(0, len(runs), 2))


# --- faults --------------------------------------------------------------------------------


def test_all_reduce_drops_a_silent_worker_and_takes_it_back():
  p = AllReduceScheduler(3, timeout_s=0.5)
  for w, t in ((0, 0.1), (1, 0.2), (2, 0.3)):
    p.arrive(w, 1, t)
  assert members(p.poll(0.3)) == [(0, 1, 2)]
  p.arrive(0, 2, 1.0)
  p.arrive(1, 2, 1.1)  # worker 2 falls silent
  assert p.next_deadline() == pytest.approx(1.5)
  assert p.poll(1.49) == [] and not p.dropped
  assert members(p.poll(1.5)) == [(0, 1)]
  assert p.drops == [(2, 1.5)] and p.dropped == {2}
  p.arrive(0, 3, 2.0)
  p.arrive(1, 3, 2.1)
  assert members(p.poll(2.1)) == [(0, 1)]
  p.arrive(2, 2, 2.5)  # back, behind: its step 2 closes at once, everyone else is past it
  assert members(p.poll(2.5)) == [(2,)] and p.rejoins == [(2, 2.5)] and not p.dropped
  p.arrive(0, 4, 3.0)
  p.arrive(1, 4, 3.05)
  assert p.poll(3.05) == []  # step 4 waits for worker 2 again
  p.arrive(2, 3, 3.1)
  assert members(p.poll(3.1)) == [(2,)]
  p.arrive(2, 4, 3.2)
  assert [(g.members, g.step) for g in p.poll(3.2)] == [((0, 1, 2), 4)]


def test_sdpipe_keeps_grouping_without_a_silent_worker_and_regroups_it():
  base = jittery(11)
  policy = GroupScheduler(4, GroupRules(timeout_s=0.2))
  groups, arrivals, _ = simulate(policy, 60,
                                 lambda w, k: 1.0 if (w, k) == (3, 5) else base(w, k))
  left = max(t for g, t in groups if (3, 4) in zip(g.members, g.steps, strict=True))
  back = left + 1.0  # worker 3 computes step 5 for a whole second
  [(worker, dropped_at)] = policy.drops
  assert worker == 3 and left + 0.2 <= dropped_at < back
  assert policy.rejoins == [(3, back)]
  without = [g for g, t in groups if dropped_at <= t < back]
  assert len(without) >= 10 and all(3 not in g.members for g in without)
  assert any(3 in g.members and len(g.members) > 1 for g, t in groups if t >= back)
  assert len(arrivals) == 4 * 60


# --- the baselines, and each policy's engine -----------------------------------------------


def test_all_reduce_groups_are_everyone_every_step():
  groups, _, _ = simulate(AllReduceScheduler(4), 15, jittery(2, straggler=3))
  assert [g.step for g, _ in groups] == list(range(1, 16))
  assert all(sorted(g.members) == [0, 1, 2, 3] and g.global_sync for g, _ in groups)


def test_periodic_average_syncs_everyone_every_k_steps_and_nothing_otherwise():
  groups, _, _ = simulate(PeriodicAverageScheduler(3, every=4), 12, jittery(4, straggler=0))
  syncs = [g for g, _ in groups if g.global_sync]
  assert [g.step for g in syncs] == [4, 8, 12]
  assert all(sorted(g.members) == [0, 1, 2] for g in syncs)
  assert all(len(g.members) == 1 and g.step % 4 for g, _ in groups if not g.global_sync)
  assert len(groups) == 3 + 3 * 9


def test_random_pairs_pairs_random_partners_and_leaves_lone_workers_alone():
  groups, _, _ = simulate(RandomPairsScheduler(5, seed=1, window_s=0.004), 60, jittery(3))
  sizes = collections.Counter(len(g.members) for g, _ in groups)
  assert set(sizes) <= {1, 2} and sizes[2] > sizes[1]
  pairs = {frozenset(g.members) for g, _ in groups if len(g.members) == 2}
  assert len(pairs) == 5 * 4 // 2  # random partners: every possible pair occurs
  other, _, _ = simulate(RandomPairsScheduler(5, seed=2, window_s=0.004), 60, jittery(3))
  assert members(g for g, _ in groups) != members(g for g, _ in other)


def test_random_pairs_odd_one_out_waits_for_the_next_arrival():
  p = RandomPairsScheduler(4, seed=0, window_s=0.002)
  p.arrive(0, 1, 0.0)
  p.arrive(1, 1, 0.0005)
  p.arrive(2, 1, 0.001)
  [pair] = p.poll(0.002)
  [odd] = {0, 1, 2} - set(pair.members)
  assert len(pair.members) == 2 and pair.members == tuple(sorted(pair.members))
  assert p.next_deadline() == pytest.approx(0.004)
  p.arrive(3, 1, 0.003)
  assert members(p.poll(0.004)) == [(odd, 3)]
  p.arrive(0, 2, 0.01)
  assert members(p.poll(0.012)) == [(0,)]  # nobody came within the window: alone
  alone = RandomPairsScheduler(1)
  alone.arrive(0, 1, 0.0)
  assert members(alone.poll(0.0)) == [(0,)]  # everyone is in the pool: no need to wait


def test_each_policy_builds_its_engine_and_unknown_names_and_options_are_rejected():
  kinds = {'all-reduce': AllReduceScheduler, 'random-pairs': RandomPairsScheduler,
           'periodic-average': PeriodicAverageScheduler, 'sdpipe': GroupScheduler}
  for name, kind in kinds.items():
    engine = SyncPolicy(name, 3).engine()
    assert type(engine) is kind and engine.name == name and isinstance(engine, GroupEngine)
  assert isinstance(GroupScheduler(2), GroupEngine)
  sd = SyncPolicy('sdpipe', 3, {'rules': GroupRules(ssp_bound=2), 'max_group': 3}).engine()
  assert (sd.rules.max_group, sd.rules.ssp_bound) == (3, 2)
  assert SyncPolicy('periodic-average', 3, {'every': 5}).engine().every == 5
  with pytest.raises(ConfigError, match=r"unknown sync policy 'gossip'.*all-reduce"):
    SyncPolicy('gossip', 3)
  with pytest.raises(ConfigError, match="'max_group'; it takes: every, timeout_s"):
    SyncPolicy('periodic-average', 3, {'max_group': 2})
  for bad in (lambda: SyncPolicy('sdpipe', 0),
              lambda: SyncPolicy('periodic-average', 2, {'every': 0}),
              lambda: SyncPolicy('random-pairs', 2, {'window_s': 10.0})):
    with pytest.raises(ConfigError):
      bad()


@pytest.mark.parametrize(('field', 'value'), [
    ('max_group', 0), ('min_group', 5), ('ssp_bound', 1.5), ('window_s', 0.02),
    ('min_window_s', -1.0), ('max_window_s', float('inf')), ('timeout_s', 0.005),
    ('sync_every', 0)])
def test_group_rules_reject_bad_values_naming_the_field(field, value):
  with pytest.raises(ConfigError, match=f'GroupRules.{field}') as info:
    GroupRules(**{field: value})
  assert '\n' not in str(info.value)


def test_bad_arrivals_raise_config_errors():
  s = GroupScheduler(2)
  for worker, step, now in ((2, 1, 0.0), (-1, 1, 0.0), (0, -1, 0.0), (0, 1, float('nan'))):
    with pytest.raises(ConfigError):
      s.arrive(worker, step, now)
  with pytest.raises(ConfigError, match='rules must be a GroupRules'):
    GroupScheduler(2, rules={'max_group': 2})
  s.arrive(0, 1, 1.0)
  with pytest.raises(ConfigError, match='worker 0 is waiting for its group and cannot leave'):
    s.leave(0, 1.0)
  s.arrive(1, 1, 0.5)  # a time from the past counts as the latest seen: joins 0's window
  assert s.poll(0.9) == [] and s.next_deadline() == pytest.approx(1.002)
  assert members(s.poll(1.002)) == [(0, 1)]
