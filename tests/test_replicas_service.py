"""The group scheduler as a service (`SyncService`, `SyncClient`, `start_service`) and `LocalChannel`.

No JAX devices and no processes: replicas are Python threads (or the test itself) talking over a
`LocalChannel`. Every thread join and every wait has a timeout, so a bug cannot hang the suite.

Two kinds of runs:

- Real time: `start_service` in a daemon thread on a `LocalChannel`, clients posting from threads
  or in one burst from the test. Only outcomes that do not depend on timing are asserted exactly
  (e.g. all-reduce groups depend on the log order only), time-outs with generous margins.
- Fake time: `ScriptedBoard` replays a script of log records at fake times and moves a fake clock
  on whenever the service waits, and the service runs in the test's own thread with
  ``clock=board.clock``. Stamps, windows, drops and the times groups are published are exact.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from hetjax import ConfigError
from hetjax.replicas._driver import ServiceThread, start_service
from hetjax.replicas._policy import SyncPolicy
from hetjax.replicas._service import (
  IDLE_S,
  ServiceReport,
  SyncClient,
  SyncService,
  group_from_json,
)
from hetjax.runtime._local_channel import LocalChannel

pytestmark = pytest.mark.timeout(60)

#: Bound on every join and wait that should succeed quickly (a bug fails, never hangs, the test).
WAIT_S = 10.0


def start_from():
  """A clock reading 0 now (`time.monotonic` shifted), for services compared with real waits."""
  t0 = time.monotonic()
  return lambda: time.monotonic() - t0


def run_clients(channel, prefix, workers, steps):
  """Threads, one per worker: arrive at steps 1 … ``steps``, wait for each group, then leave.

  Returns:
    {worker: {step: SyncGroup}}.
  """
  got = {w: {} for w in range(workers)}
  errors = []

  def replica(w):
    client = SyncClient(channel, prefix, w)
    try:
      for s in range(1, steps + 1):
        client.arrive(s)
        got[w][s] = client.group(s, timeout_s=WAIT_S)
      client.leave()
    except BaseException as e:  # reported below, in the test's thread
      errors.append(e)

  threads = [threading.Thread(target=replica, args=(w,), daemon=True) for w in range(workers)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(WAIT_S)
  assert not any(t.is_alive() for t in threads), 'a replica thread is stuck'
  assert not errors, errors
  return got


def read_log(channel, prefix):
  """The messages of the arrival log, in ticket order."""
  n = channel.try_get(f'{prefix}/n') or 0
  return [channel.try_get(f'{prefix}/a/{i}') for i in range(1, n + 1)]


def replay(engine, messages, now=0.0):
  """A policy's ``engine``'s groups for ``messages`` fed directly, all at time ``now``."""
  out = []
  for m in messages:
    if m.get('leave') is True:
      engine.leave(m['w'], now)
    else:
      engine.arrive(m['w'], m['s'], now)
    out += engine.poll(now)
  return out


def by_seq(got):
  """{seq: [the SyncGroup each member received]} from `run_clients`' result."""
  seqs = {}
  for per_step in got.values():
    for g in per_step.values():
      seqs.setdefault(g.seq, []).append(g)
  return seqs


def warnings_of(caplog):
  return [r.getMessage() for r in caplog.records
          if r.name == 'hetjax.replicas' and r.levelno == logging.WARNING]


class ScriptedBoard:
  """A board on a fake clock for running `SyncService.run` in the test's own thread.

  `post` schedules log records (ticket order = time order); a record becomes readable, and its
  ticket taken, at its time. ``wait(key, timeout)`` returns a record due within the timeout at
  its time, else moves the clock on by the timeout and returns None; `try_get` does not move it.
  ``published`` keeps the fake time each key (groups, report) was set.
  """

  def __init__(self, prefix='fake'):
    self.prefix = prefix
    self.now = 0.0
    self.channel = LocalChannel()
    self.published: dict[str, float] = {}
    self._due: dict[str, float] = {}
    self._taken: list[float] = []
    self._calls = 0

  def clock(self) -> float:
    return self.now

  def post(self, t, worker, step=None, *, leave=False, lost=False):
    """Worker ``worker``'s arrival at ``step`` (or its leave) at fake time ``t``; ``lost``: the
    ticket is taken then, but the record is never written."""
    assert not self._taken or t >= self._taken[-1], 'post in time order'
    self._taken.append(t)
    key = f'{self.prefix}/a/{len(self._taken)}'
    if not lost:
      self.channel.set(key, {'w': worker, 'leave': True} if leave else {'w': worker, 's': step})
      self._due[key] = t

  def _tick(self):
    self._calls += 1
    if self._calls > 200_000:
      raise RuntimeError(f'the service made {self._calls} board calls at t={self.now}: stuck')

  def wait(self, key, timeout_s):
    self._tick()
    due = self._due.get(key)
    if due is not None and due <= self.now + timeout_s:
      self.now = max(self.now, due)
      return self.channel.try_get(key)
    self.now += timeout_s
    return None

  def try_get(self, key):
    self._tick()
    due = self._due.get(key)
    return self.channel.try_get(key) if due is not None and due <= self.now else None

  def increment(self, key, amount=1):
    assert (key, amount) == (f'{self.prefix}/n', 0), 'the service only reads the ticket counter'
    return sum(t <= self.now for t in self._taken)

  def set(self, key, value):
    self.published[key] = self.now
    self.channel.set(key, value)

  def group(self, worker, step):
    data = self.channel.try_get(f'{self.prefix}/g/{worker}/{step}')
    return None if data is None else group_from_json(data)

  def run(self, policy, **options) -> tuple[SyncService, ServiceReport]:
    service = SyncService(self, policy, self.prefix, clock=self.clock, **options)
    return service, service.run(stop_after_s=1000.0)


# --- protocol round trip -------------------------------------------------------------------


@pytest.mark.parametrize('name', ['all-reduce', 'random-pairs', 'periodic-average', 'sdpipe'])
def test_every_replica_gets_one_consistent_group_per_step(name):
  workers, steps, prefix = 3, 6, f'trip/{name}'
  channel = LocalChannel()
  service = start_service(channel, SyncPolicy(name, workers), prefix)
  got = run_clients(channel, prefix, workers, steps)
  report = service.join(WAIT_S)

  assert all(sorted(got[w]) == list(range(1, steps + 1)) for w in range(workers))
  for w in range(workers):
    for s, g in got[w].items():
      assert dict(zip(g.members, g.steps, strict=True))[w] == s  # its own arrival, its step
  seqs = by_seq(got)
  assert sorted(seqs) == list(range(len(seqs)))
  for seq, copies in seqs.items():
    assert all(c == copies[0] for c in copies), f'members of group {seq} disagree: {copies}'
    assert len(copies) == len(copies[0].members)  # every member, and only members, got it
  groups = [copies[0] for _, copies in sorted(seqs.items())]
  pairs = [(m, s) for g in groups for m, s in zip(g.members, g.steps, strict=True)]
  assert sorted(pairs) == sorted((w, s) for w in range(workers) for s in range(1, steps + 1))

  assert report.policy == name
  assert report.groups == len(groups)
  assert report.global_groups == sum(g.global_sync for g in groups)
  assert report.mean_group == pytest.approx(workers * steps / len(groups))
  assert report.messages == workers * steps + workers  # arrivals and leaves
  assert report.drops == report.rejoins == ()
  assert set(report.ignored.values()) == {0}
  assert SyncClient(channel, prefix, 0).report(timeout_s=WAIT_S) == report


@pytest.mark.parametrize(('name', 'options'), [('all-reduce', {}), ('periodic-average', {'every': 2})])
def test_service_groups_equal_the_policy_fed_the_same_log(name, options):
  workers, steps, prefix = 3, 4, f'same/{name}'
  channel = LocalChannel()
  service = start_service(channel, SyncPolicy(name, workers, options), prefix)
  got = run_clients(channel, prefix, workers, steps)
  report = service.join(WAIT_S)

  served = [copies[0] for _, copies in sorted(by_seq(got).items())]
  assert served == replay(SyncPolicy(name, workers, options).engine(),
                          read_log(channel, prefix))
  everyone = tuple(range(workers))
  if name == 'all-reduce':
    assert all(sorted(g.members) == list(everyone) and g.global_sync for g in served)
    assert [g.step for g in served] == [1, 2, 3, 4]
    assert (report.groups, report.global_groups, report.mean_group) == (4, 4, 3.0)
  else:  # odd steps: a singleton at once; even steps: everyone
    for g in served:
      if g.step % 2:
        assert len(g.members) == 1 and not g.global_sync
      else:
        assert sorted(g.members) == list(everyone) and g.global_sync
    assert (report.groups, report.global_groups, report.mean_group) == (8, 2, 1.5)
  assert report.messages == 15


# --- fake clock ----------------------------------------------------------------------------


def test_sdpipe_window_on_a_fake_clock():
  policy = SyncPolicy('sdpipe', 4, {'max_group': 4, 'min_group': 2, 'window_s': 1.0,
                                    'min_window_s': 0.5, 'max_window_s': 2.0, 'timeout_s': 100.0})
  board = ScriptedBoard()
  for t, w in ((0.0, 0), (0.25, 1), (0.75, 2), (1.5, 3)):  # 3 comes after 0's window (1.0)
    board.post(t, w, 1)
  for t, w in ((3.0, 0), (3.25, 1), (3.5, 2), (3.75, 3)):  # 4 within the window: full at once
    board.post(t, w, 2)
  for w in range(4):
    board.post(5.0, w, leave=True)
  service, report = board.run(policy)

  first, alone, full = board.group(0, 1), board.group(3, 1), board.group(0, 2)
  assert (first.members, first.steps, first.seq) == ((0, 1, 2), (1, 1, 1), 0)
  assert all(board.group(w, 1) == first for w in (1, 2))
  assert (alone.members, alone.seq) == ((3,), 1)  # its own window: nobody came
  assert (full.members, full.seq) == ((0, 1, 2, 3), 2)
  assert board.published[f'{board.prefix}/g/0/1'] == pytest.approx(1.0, abs=1e-9)  # expiry
  assert board.published[f'{board.prefix}/g/3/1'] == pytest.approx(2.5, abs=1e-9)  # 1.5 + 1.0
  assert board.published[f'{board.prefix}/g/0/2'] == 3.75  # full: closed on the 4th arrival
  # A group of 3 >= min_group: x 0.9; alone: doubled (cap 2.0); then all x 0.9 again.
  assert service.engine.windows == pytest.approx((0.81, 0.81, 0.81, 1.8))
  assert (report.groups, report.global_groups, report.messages) == (3, 0, 12)
  assert report.mean_group == pytest.approx(8 / 3)


def test_drop_and_rejoin_on_a_fake_clock(caplog):
  caplog.set_level(logging.WARNING, logger='hetjax.replicas')
  board = ScriptedBoard()
  for w in range(3):
    board.post(0.0, w, 1)
  board.post(1.0, 0, 2)
  board.post(1.5, 1, 2)  # 2 is silent: dropped at 1.0 (oldest waiting) + 1.0
  board.post(3.0, 0, 3)
  board.post(3.25, 2, 2)  # back with its next step: alone (the others are past step 2)
  board.post(3.5, 2, 3)
  board.post(3.75, 1, 3)  # step 3 waits for 2 again: it is active
  for w in range(3):
    board.post(5.0, w, leave=True)
  _, report = board.run(SyncPolicy('all-reduce', 3, {'timeout_s': 1.0}))

  assert board.group(0, 1).members == (0, 1, 2)
  assert board.group(0, 2) == board.group(1, 2)
  assert board.group(0, 2).members == (0, 1)
  assert board.published[f'{board.prefix}/g/0/2'] == pytest.approx(2.0, abs=1e-9)
  assert (board.group(2, 2).members, board.group(2, 2).global_sync) == ((2,), True)
  assert board.published[f'{board.prefix}/g/2/2'] == 3.25
  assert board.group(2, 3).members == (0, 2, 1) == board.group(1, 3).members
  assert board.published[f'{board.prefix}/g/2/3'] == 3.75
  assert report.drops == ((2, 2.0),)
  assert report.rejoins == ((2, 3.25),)
  assert (report.groups, report.global_groups, report.messages) == (4, 4, 12)
  assert report.mean_group == pytest.approx((3 + 2 + 1 + 3) / 4)
  logged = warnings_of(caplog)
  assert [m for m in logged if 'worker 2 dropped' in m and '2.000 s' in m] != []
  assert [m for m in logged if 'worker 2 is back' in m and '3.250 s' in m] != []


def test_a_lost_ticket_is_skipped_after_lost_after_s_on_a_fake_clock(caplog):
  caplog.set_level(logging.WARNING, logger='hetjax.replicas')
  board = ScriptedBoard()
  board.post(0.5, 0, lost=True)
  board.post(0.5, 0, 1)
  board.post(0.5, 1, 1)
  board.post(0.5, 0, leave=True)
  board.post(0.5, 1, leave=True)
  _, report = board.run(SyncPolicy('all-reduce', 2), lost_after_s=2.0)

  assert board.group(0, 1).members == (0, 1)
  # Missed first at 0.5 (to one IDLE_S), skipped lost_after_s later; the rest is then read.
  assert 2.5 - 1e-9 <= board.published[f'{board.prefix}/g/0/1'] <= 2.5 + 2 * IDLE_S + 1e-9
  assert report.ignored['lost'] == 1 and report.messages == 4
  assert any('ticket 1 was taken but never written' in m for m in warnings_of(caplog))


@pytest.mark.parametrize('clock', ['zero-based', 'monotonic'])
def test_the_service_blocks_between_messages_instead_of_spinning(clock):
  channel = LocalChannel()
  calls = {'try_get': 0}
  real_try_get = channel.try_get

  def counting_try_get(key):
    calls['try_get'] += 1
    return real_try_get(key)

  channel.try_get = counting_try_get
  options = {'clock': start_from()} if clock == 'zero-based' else {}
  service = start_service(channel, SyncPolicy('all-reduce', 2), 'spin', **options)
  c0, c1 = SyncClient(channel, 'spin', 0), SyncClient(channel, 'spin', 1)
  c0.arrive(1)  # 0 waits for 1 (drop deadline 5 s away) for 0.3 s: nothing to do meanwhile
  time.sleep(0.3)
  c1.arrive(1)
  assert c0.group(1, timeout_s=WAIT_S).members == (0, 1)
  c0.leave()
  c1.leave()
  service.join(WAIT_S)
  assert calls['try_get'] <= 0.3 / IDLE_S * 4  # blocking waits, not a busy loop


# --- bad messages --------------------------------------------------------------------------


def test_duplicate_stale_and_early_arrivals_change_nothing_and_are_counted():
  channel, prefix = LocalChannel(), 'dup'
  c0, c1 = SyncClient(channel, prefix, 0), SyncClient(channel, prefix, 1)
  script = [(c0, 1), (c0, 1),  # duplicate while pending
            (c1, 1),
            (c0, 2), (c1, 2),
            (c1, 2),  # duplicate of a grouped step
            (c0, 1),  # stale
            (c0, 3), (c0, 5),  # early: 0 waits for its group at 3
            (c1, 3)]
  for client, step in script:  # one burst: the log's order alone decides
    client.arrive(step)
  c0.leave()
  c1.leave()
  report = start_service(channel, SyncPolicy('all-reduce', 2), prefix).join(WAIT_S)

  for s in (1, 2, 3):
    g0, g1 = c0.group(s, timeout_s=WAIT_S), c1.group(s, timeout_s=WAIT_S)
    assert g0 == g1 and (g0.members, g0.step, g0.seq) == ((0, 1), s, s - 1)
  assert channel.try_get(f'{prefix}/g/0/5') is None
  assert report.ignored == {'duplicate': 2, 'stale': 1, 'early': 1, 'malformed': 0, 'lost': 0}
  assert (report.groups, report.messages) == (3, len(script) + 2)
  assert replay(SyncPolicy('all-reduce', 2).engine(), read_log(channel, prefix)) == [
      c0.group(s, timeout_s=WAIT_S) for s in (1, 2, 3)]


def test_malformed_messages_are_logged_counted_and_skipped(caplog):
  caplog.set_level(logging.WARNING, logger='hetjax.replicas')
  channel, prefix = LocalChannel(), 'bad'
  c0, c1 = SyncClient(channel, prefix, 0), SyncClient(channel, prefix, 1)

  def write(record):
    channel.set(f'{prefix}/a/{channel.increment(f"{prefix}/n")}', record)

  bad = [[0, 1], 'arrive', 7,  # not a dict
         {'w': 5, 's': 1}, {'w': -1, 's': 1}, {'s': 1},  # not a known worker
         {'w': 0}, {'w': 0, 's': 'one'}, {'w': 0, 's': -2}]  # not a step
  for record in bad:
    write(record)
  c0.arrive(1)
  write({'w': 0, 'leave': True})  # 0 waits for its group: it cannot leave
  c1.arrive(1)
  c0.leave()
  c1.leave()
  report = start_service(channel, SyncPolicy('all-reduce', 2), prefix).join(WAIT_S)

  assert c0.group(1, timeout_s=WAIT_S).members == (0, 1) == c1.group(1, timeout_s=1).members
  assert report.ignored['malformed'] == len(bad) + 1
  assert report.messages == len(bad) + 5 and report.groups == 1
  logged = [m for m in warnings_of(caplog) if 'malformed' in m]
  assert len(logged) == len(bad) + 1
  for record, message in zip([*bad, {'w': 0, 'leave': True}], logged, strict=True):
    assert repr(record) in message
  assert 'cannot leave' in logged[-1]


def test_a_lost_ticket_is_skipped_and_the_later_messages_are_served(caplog):
  caplog.set_level(logging.WARNING, logger='hetjax.replicas')
  channel, prefix = LocalChannel(), 'lost'
  c0, c1 = SyncClient(channel, prefix, 0), SyncClient(channel, prefix, 1)
  start = time.monotonic()
  service = start_service(channel, SyncPolicy('all-reduce', 2), prefix, lost_after_s=0.2)
  assert channel.increment(f'{prefix}/n') == 1  # a replica died between its two calls
  c0.arrive(1)
  c1.arrive(1)
  assert c0.group(1, timeout_s=WAIT_S).members == (0, 1)
  assert time.monotonic() - start >= 0.2
  channel.set(f'{prefix}/a/1', {'w': 0, 's': 2})  # too late: the service has moved on
  c0.leave()
  c1.leave()
  report = service.join(WAIT_S)

  assert report.ignored['lost'] == 1
  assert report.messages == 4 and report.groups == 1
  assert channel.try_get(f'{prefix}/g/0/2') is None
  lost = [m for m in warnings_of(caplog) if 'never written' in m]
  assert len(lost) == 1 and 'ticket 1' in lost[0]


# --- faults in real time -------------------------------------------------------------------


def test_a_silent_worker_is_dropped_after_the_time_out_then_rejoins(caplog):
  caplog.set_level(logging.WARNING, logger='hetjax.replicas')
  channel, prefix = LocalChannel(), 'silent'
  service = start_service(channel, SyncPolicy('all-reduce', 3, {'timeout_s': 0.3}), prefix)
  c = [SyncClient(channel, prefix, w) for w in range(3)]
  for client in c:
    client.arrive(1)
  assert all(client.group(1, timeout_s=WAIT_S).members == (0, 1, 2) for client in c)

  start = time.monotonic()
  for step in (2, 3):  # 2 is silent: 0 and 1 wait for it once, then go on without it
    c[0].arrive(step)
    c[1].arrive(step)
    assert c[0].group(step, timeout_s=WAIT_S) == c[1].group(step, timeout_s=WAIT_S)
    assert c[0].group(step, timeout_s=WAIT_S).members == (0, 1)
  waited = time.monotonic() - start
  assert 0.29 <= waited < 5.0
  assert any('worker 2 dropped' in m for m in warnings_of(caplog))

  c[2].arrive(2)  # back with its next step: alone, the others are past it
  assert c[2].group(2, timeout_s=WAIT_S).members == (2,)
  c[2].arrive(3)
  assert c[2].group(3, timeout_s=WAIT_S).members == (2,)
  for client in (c[2], c[0], c[1]):  # 2 first: 0 and 1 do not wait for it in vain
    client.arrive(4)
  assert all(client.group(4, timeout_s=WAIT_S).members == (2, 0, 1) for client in c)
  c[0].leave()
  c[1].leave()
  time.sleep(0.05)
  assert service.thread.is_alive()  # 2 has not left yet
  c[2].leave()
  report = service.join(WAIT_S)

  assert [w for w, _ in report.drops] == [2]
  assert report.drops[0][1] >= 0.3
  assert [w for w, _ in report.rejoins] == [2]
  assert report.rejoins[0][1] > report.drops[0][1]
  assert (report.groups, report.global_groups) == (6, 6)
  logged = warnings_of(caplog)
  assert len([m for m in logged if 'dropped' in m]) == 1
  assert len([m for m in logged if 'worker 2 is back' in m]) == 1


def test_stop_after_s_stops_a_service_whose_workers_never_leave(caplog):
  caplog.set_level(logging.WARNING, logger='hetjax.replicas')
  channel, prefix = LocalChannel(), 'stop'
  start = time.monotonic()
  service = start_service(channel, SyncPolicy('periodic-average', 2, {'every': 2}), prefix, stop_after_s=0.3)
  SyncClient(channel, prefix, 1).arrive(1)
  with pytest.raises(TimeoutError, match='still running'):
    service.join(0.01)
  report = service.join(WAIT_S)

  assert 0.3 <= time.monotonic() - start < 5.0
  assert (report.groups, report.messages) == (1, 1)
  assert SyncClient(channel, prefix, 0).report(timeout_s=WAIT_S) == report
  stops = [m for m in warnings_of(caplog) if 'stops after' in m]
  assert len(stops) == 1 and '[0, 1]' in stops[0]


def test_service_and_client_reject_bad_arguments():
  channel = LocalChannel()
  for policy in (object(), 'all-reduce', None):
    with pytest.raises(ConfigError, match='SyncPolicy'):
      SyncService(channel, policy, 'p')
    with pytest.raises(ConfigError, match='SyncPolicy'):
      start_service(channel, policy, 'p')
  for lost_after_s in (0, -1.0, float('inf'), 'soon'):
    with pytest.raises(ConfigError, match='lost_after_s'):
      SyncService(channel, SyncPolicy('all-reduce', 2), 'p', lost_after_s=lost_after_s)
  for worker in (-1, True, 1.5, '0'):
    with pytest.raises(ConfigError, match='worker'):
      SyncClient(channel, 'p', worker)


def test_client_waits_time_out_with_a_message_naming_worker_and_step():
  client = SyncClient(LocalChannel(), 'nobody/', 1)
  start = time.monotonic()
  with pytest.raises(TimeoutError, match=r"worker 1: no group for step 3 .*'nobody'"):
    client.group(3, timeout_s=0.1)
  assert time.monotonic() - start >= 0.1
  with pytest.raises(TimeoutError, match='no scheduler report'):
    client.report(timeout_s=0.05)


def test_service_thread_join_reraises_what_stopped_the_service():
  class Broken(LocalChannel):
    def wait(self, key, timeout_s):
      raise OSError('the coordination service is gone')

  service = start_service(Broken(), SyncPolicy('all-reduce', 2), 'broken')
  assert isinstance(service, ServiceThread)
  with pytest.raises(OSError, match='is gone'):
    service.join(WAIT_S)


# --- report --------------------------------------------------------------------------------


def test_service_report_round_trips_through_json():
  report = ServiceReport(policy='sdpipe', groups=7, global_groups=2, mean_group=2.5,
                         drops=((2, 1.25), (0, 3.0)), rejoins=((2, 4.5),),
                         ignored={'duplicate': 1, 'stale': 0, 'early': 2, 'malformed': 3,
                                  'lost': 1},
                         messages=40)
  data = json.loads(json.dumps(report.to_json()))
  assert isinstance(data['drops'], list)  # JSON turned the tuples into lists
  assert ServiceReport.from_json(data) == report
  empty = ServiceReport('periodic-average', 0, 0, 0.0, (), (), {}, 0)
  assert ServiceReport.from_json(json.loads(json.dumps(empty.to_json()))) == empty


# --- LocalChannel --------------------------------------------------------------------------


def test_local_channel_waits_time_out_and_reads_block_until_set():
  ch = LocalChannel()
  start = time.monotonic()
  assert ch.wait('absent', timeout_s=0.1) is None
  assert time.monotonic() - start >= 0.1
  with pytest.raises(TimeoutError, match='absent'):
    ch.get('absent', timeout_s=0.05)
  assert ch.try_get('absent') is None

  timer = threading.Timer(0.05, ch.set, args=('late', {'x': 1}))
  timer.start()
  assert ch.wait('late', timeout_s=WAIT_S) == {'x': 1}
  timer.join(WAIT_S)
  assert ch.get('late', timeout_s=0.01) == {'x': 1}
  ch.delete('late')
  assert ch.try_get('late') is None
  ch.delete('late')  # deleting a missing key is fine


def test_local_channel_increment_is_atomic_across_threads():
  ch = LocalChannel()
  seen = [[] for _ in range(4)]

  def bump(out):
    for _ in range(200):
      out.append(ch.increment('n'))

  threads = [threading.Thread(target=bump, args=(out,), daemon=True) for out in seen]
  for t in threads:
    t.start()
  for t in threads:
    t.join(WAIT_S)
  assert not any(t.is_alive() for t in threads)
  assert sorted(v for out in seen for v in out) == list(range(1, 801))  # distinct tickets
  assert ch.increment('n', 0) == 800 == ch.get('n')
  assert ch.increment('n', 5) == 805


def test_local_channel_values_are_json_copies():
  ch = LocalChannel()
  value = {'members': [0, 1], 'step': (3, 4)}
  ch.set('g', value)
  value['members'].append(2)
  got = ch.get('g')
  assert got == {'members': [0, 1], 'step': [3, 4]}  # as stored, tuples as JSON lists
  got['members'].clear()
  assert ch.try_get('g') == {'members': [0, 1], 'step': [3, 4]}
  with pytest.raises(TypeError):
    ch.set('bad', {1, 2})  # what the coordination service could not carry either
  assert ch.try_get('bad') is None
