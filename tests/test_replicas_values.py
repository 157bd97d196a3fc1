"""Sync policies' state as a value: taken out mid-run, through JSON, into a fresh engine.

A run of events (arrivals of blocking workers with jittery step times and a slow worker, the
policy's deadlines as ticks, time-outs that drop the slow one and its rejoins, leaves at the
end) is recorded once; then replayed uninterrupted, and cut at its middle: the state goes
through `encode_state` / JSON / `decode_state` into a fresh engine that replays the rest. Both
must hand out exactly the same groups and end in exactly the same state, and so must
`SyncPolicy`'s value interface (``init`` / ``update``).
"""

from __future__ import annotations

import doctest
import heapq
import json

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import decode_state, encode_state
from hetjax.replicas import (
  Arrive,
  Leave,
  SyncPolicy,
  SyncService,
  Tick,
  _policy,
  resume_state,
)
from hetjax.runtime import LocalChannel

WORKERS = 6
OPTIONS = {
    'all-reduce': {'timeout_s': 0.05},
    'random-pairs': {'seed': 3, 'window_s': 0.004, 'timeout_s': 0.05},
    'periodic-average': {'every': 3, 'timeout_s': 0.05},
    'sdpipe': {'max_group': 3, 'sync_every': 5, 'ssp_bound': 1, 'timeout_s': 0.05},
}


def test_doctests():
  assert doctest.testmod(_policy).failed == 0


def apply(policy, event):
  if isinstance(event, Arrive):
    policy.arrive(event.worker, event.step, event.t)
  elif isinstance(event, Leave):
    policy.leave(event.worker, event.t)
  return policy.poll(event.t)


def record(policy, steps: int, seed: int) -> list:
  """The events of blocking workers driven against ``policy`` (worker 0 is 6× slower, and
  sometimes far slower: long enough to be dropped and come back)."""
  rng = np.random.default_rng(seed)

  def duration(w):
    d = rng.uniform(0.005, 0.015) * (6 if w == 0 else 1)
    return d + (0.1 if w == 0 and rng.random() < 0.2 else 0.0)

  heap = [(duration(w), w, 1) for w in range(WORKERS)]
  events = []
  while len(events) < 10_000:
    due = policy.next_deadline()
    if heap and (due is None or heap[0][0] <= due):
      t, w, s = heapq.heappop(heap)
      event = Leave(w, t) if s > steps else Arrive(w, s, t)
    elif due is not None:
      event = Tick(max(due, policy.now))
    else:
      break
    events.append(event)
    for group in apply(policy, event):
      for m, s in zip(group.members, group.steps, strict=True):
        heapq.heappush(heap, (event.t + duration(m), m, s + 1))
  return events


def replay(policy, events) -> list:
  return [g for event in events for g in apply(policy, event)]


def through_json(state, template):
  return decode_state(template, json.loads(json.dumps(encode_state(state))))


@pytest.mark.parametrize('name', list(OPTIONS))
def test_state_saved_mid_run_resumes_to_the_same_groups(name):
  make = SyncPolicy(name, WORKERS, OPTIONS[name]).engine
  events = record(make(), steps=25, seed=1)
  whole = make()
  expected = replay(whole, events)
  assert len(expected) > 40
  if name in ('all-reduce', 'sdpipe'):  # the others never wait for worker 0 long
    assert whole.drops and whole.rejoins  # the run covers time-outs and rejoins
  assert {type(e) for e in events} == {Arrive, Leave, Tick}

  middle = len(events) // 2
  first = make()
  before = replay(first, events[:middle])
  fresh = make()
  fresh.load_state(through_json(first.state(), fresh.state()))
  after = replay(fresh, events[middle:])
  assert before + after == expected
  assert encode_state(fresh.state()) == encode_state(whole.state())


@pytest.mark.parametrize('name', list(OPTIONS))
def test_the_value_interface_gives_the_same_groups(name):
  policy = SyncPolicy(name, WORKERS, OPTIONS[name])
  events = record(policy.engine(), steps=8, seed=2)
  expected = replay(policy.engine(), events)
  state, groups = policy.init(), []
  for i, event in enumerate(events):
    if i == len(events) // 2:
      state = through_json(state, policy.init())
    closed, state = policy.on_event(state, event)
    groups += closed
  assert groups == expected
  assert policy.name == name


def test_sdpipe_keeps_what_it_learned_and_random_pairs_its_rng():
  sdpipe = SyncPolicy('sdpipe', WORKERS, OPTIONS['sdpipe'])
  sd = sdpipe.engine()
  replay(sd, record(sdpipe.engine(), 10, 3))
  state = sd.state()
  assert state['policy']['window'].tolist() == list(sd.windows) != [0.002] * WORKERS
  assert state['seq'] > 0 and state['now'] > 0
  pairs = SyncPolicy('random-pairs', 4, {'seed': 9}).engine()
  pairs._rng.random()
  restored = SyncPolicy('random-pairs', 4, {'seed': 0}).engine()
  restored.load_state(through_json(pairs.state(), restored.state()))
  assert restored._rng.random() == pairs._rng.random()


def test_resume_state_cuts_what_was_in_flight():
  policy = SyncPolicy('sdpipe', 3, {'max_group': 3, 'timeout_s': 1.0})
  engine = policy.engine()
  engine.arrive(0, 1, 0.0)
  engine.arrive(1, 1, 0.001)
  [group] = engine.poll(0.003)
  engine.arrive(0, 2, 0.004)  # in flight when the checkpoint of step 1 is taken
  windows, seq = engine.windows, group.seq
  resumed = policy.engine(resume_state(engine.state(), step=1))
  assert resumed.windows == windows and resumed.next_deadline() is None
  for w in range(3):  # every replica reports step 2 again, after the last saved time
    resumed.arrive(w, 2, 0.005 + w * 1e-4)
  [again] = resumed.poll(0.006)
  assert sorted(again.members) == [0, 1, 2] and again.seq == seq + 1


def test_bad_states_and_options_are_config_errors():
  with pytest.raises(ConfigError, match='state is for 3 workers, this policy has 4'):
    SyncPolicy('all-reduce', 4).engine(SyncPolicy('all-reduce', 3).init())
  with pytest.raises(ConfigError, match='state is for 3 workers, this policy has 4'):
    SyncPolicy('all-reduce', 4).on_event(SyncPolicy('all-reduce', 3).init(), Tick(0.0))
  for old, new in (('ps', 'periodic-average'), ('ad-psgd', 'random-pairs')):  # renamed
    with pytest.raises(ConfigError, match=f"sync policy '{old}' is now '{new}'"):
      SyncPolicy(old, 3)
  with pytest.raises(ConfigError, match="has no option 'every'"):
    SyncPolicy('sdpipe', 2, {'every': 2})
  engine = SyncPolicy('all-reduce', 1).engine()
  engine.arrive(0, 1, 0.0)  # closed at once, not polled yet
  with pytest.raises(ConfigError, match='poll first'):
    engine.state()


def test_a_service_hands_out_its_state_and_keeps_a_restored_clock():
  policy = SyncPolicy('sdpipe', 2, {'timeout_s': 1.0})
  engine = policy.engine()
  engine.arrive(0, 1, 7.0)
  engine.arrive(1, 1, 7.001)
  engine.poll(7.01)
  saved = resume_state(engine.state(), 1)
  now = [100.0]

  def clock():  # 1 ms a call
    now[0] += 0.001
    return now[0]

  service = SyncService(LocalChannel(), policy, 'p', state=saved, clock=clock)
  assert encode_state(service.policy_state()) == encode_state(policy.engine(saved).state())
  board = service.board
  for w in (0, 1):
    board.set(f'p/a/{board.increment("p/n")}', {'w': w, 's': 2})
  service.run(stop_after_s=0.05)  # no one leaves: it stops after 50 fake calls
  assert board.try_get('p/g/0/2')['seq'] == 1
  assert service.engine.now >= 7.01  # its times went on from the saved ones, not from 0
