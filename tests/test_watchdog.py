"""The stall watchdog's rule on a scripted clock: a slow healthy job is never ended, a worker that
truly stops is named once the timeout that follows the measured step time has passed, and a
worker in a long checkpoint save is given the busy bound instead.

Each case is a job of 4 workers polled every 0.5 s of scripted time, as `ProgressWatchdog`'s
thread polls the channel; the scripted job compiles for 20 s, then takes 14 s a step (the
3.3M-parameter GPT on 4 workers that the old 10 s default ended at step 2), or, for the saves,
takes 0.1 s a step (the step timeout is the 10 s floor).
"""

from __future__ import annotations

import math
import time

import pytest

from hetjax.runtime import LocalChannel, ProgressWatchdog, _watchdog
from hetjax.runtime._watchdog import BUSY_FACTOR, BUSY_FLOOR_S, FACTOR, FLOOR_S, StallDetector

WORKERS, COMPILE_S, STEP_S, POLL_S = 4, 20.0, 14.0, 0.5


def _finished(w: int, t: float) -> int | None:
  """The last step worker ``w`` finished at ``t`` s (None before its first); worker ``w`` ends
  each step ``0.1 w`` s after worker 0, as unequal hosts do."""
  steps = math.floor((t - COMPILE_S - 0.1 * w) / STEP_S)
  return steps if steps >= 1 else None


def _run(detector, finished, until_s, beating=lambda w, t: True, busy=lambda w, t: None):
  """Polls ``detector`` every 0.5 s from 0 to ``until_s``; ``finished(w, t)`` is worker w's last
  finished step, ``beating(w, t)`` whether its heartbeat (once a second) still beats, ``busy(w,
  t)`` the phase it published (None: nothing published). Returns (the time of the verdict, the
  verdict) or None, and the timeouts seen after each poll."""
  beats: dict[int, int] = {}
  timeouts = []
  for i in range(int(until_s / POLL_S) + 1):
    t = i * POLL_S
    values = {}
    for w in range(WORKERS):
      if beating(w, t):
        beats[w] = int(t) + 1
      values[f'progress/{w}'], values[f'alive/{w}'] = finished(w, t), beats.get(w)
      values[f'busy/{w}'] = busy(w, t)
    verdict = detector.observe(t, values)
    timeouts.append(detector.timeout_s())
    if verdict is not None:
      return (t, verdict), timeouts
  return None, timeouts


def test_a_job_whose_step_takes_14_s_is_never_declared_stalled():
  detector = StallDetector(WORKERS, started=0.0)
  verdict, timeouts = _run(detector, _finished, until_s=COMPILE_S + 40 * STEP_S)
  assert verdict is None
  # The first step (compilation included) is the first step time: every worker had finished it
  # at the poll at 34.5 s, so the timeout is 5 x 34.5 s until the next step.
  first = int((COMPILE_S + STEP_S + 0.3) / POLL_S) + 1
  assert timeouts[first - 1] is None and timeouts[first] == FACTOR * (first * POLL_S)
  # Once the 14 s steps outnumber it, the timeout is 5 x 14 s.
  assert timeouts[-1] == FACTOR * STEP_S == 70.0


def test_nothing_is_declared_before_every_worker_finished_a_step():
  """A 10-minute compile on one worker (the others are done) is not a stall."""
  def finished(w, t):
    return _finished(w, t - (600.0 if w == 3 else 0.0))

  detector = StallDetector(WORKERS, started=0.0)
  verdict, timeouts = _run(detector, finished, until_s=600.0 + COMPILE_S + 10 * STEP_S)
  assert verdict is None and timeouts[int(600 / POLL_S)] is None
  assert timeouts[-1] >= FLOOR_S


@pytest.mark.parametrize('stops', ['hangs in a hook', 'is stopped'])
def test_a_worker_that_stops_is_named_after_five_measured_step_times(stops):
  """Worker 2 finishes step 5 and never step 6: it hangs in a hook after the step (its
  heartbeat beats on; the others finish step 6, then wait for it in step 7), or it is stopped
  (SIGSTOP: no heartbeat; the others wait for it in step 6)."""
  hung = stops == 'hangs in a hook'
  last = 6 if hung else 5
  stop_at = COMPILE_S + 6 * STEP_S if hung else COMPILE_S + 5 * STEP_S + 1.0

  def finished(w, t):
    step = _finished(w, t)
    return step if step is None else min(step, 5 if w == 2 else last)

  detector = StallDetector(WORKERS, started=0.0)
  verdict, _ = _run(detector, finished, until_s=COMPILE_S + 40 * STEP_S,
                    beating=lambda w, t: hung or w != 2 or t < stop_at)
  assert verdict is not None
  t, (worker, cause) = verdict
  # Every worker had finished step 5 at the poll at 90.5 s; the step times measured are 34.5 s,
  # then 14 s each: 5 x 14 s later the job is stalled.
  since = POLL_S * math.ceil((COMPILE_S + 5 * STEP_S + 0.3) / POLL_S)
  assert t == since + FACTOR * STEP_S
  assert worker == 2
  if hung:
    assert cause == 'worker 2 made no progress for 70.0 s after step 5, while others finished ' \
                    'step 6'
  else:
    assert cause == 'worker 2 made no progress for 70.0 s after step 5 and its heartbeat ' \
                    'stopped (stopped or wedged)'


def test_a_given_timeout_is_kept_and_workers_are_named_by_their_names():
  detector = StallDetector(2, timeout_s=3.0, started=0.0, names=['worker 4', 'worker 7'])
  assert detector.timeout_s() is None
  assert detector.observe(0.0, {'progress/0': 1, 'progress/1': 1, 'alive/0': 1}) is None
  assert detector.timeout_s() == 3.0
  assert detector.observe(2.5, {'progress/0': 1, 'progress/1': 1, 'alive/0': 2}) is None
  worker, cause = detector.observe(3.0, {'progress/0': 1, 'progress/1': 1, 'alive/0': 2})
  assert worker == 1 and cause.startswith('worker 7 made no progress for 3.0 s after step 1')


# The saves: 0.1 s steps from 1 s on, so step 30 is done at the poll at 4 s, when the saving
# workers enter step 31's checkpoint save. The heartbeat publishes a phase up to a second late:
# here, its name 1 s after the save starts and '' 1 s after it ends.
SAVE_FROM = 4.0


def _fast(t: float) -> int | None:
  """The last step finished at ``t`` (a poll time, a multiple of 0.5 s) at 0.1 s a step."""
  steps = round((t - 1.0) * 10)
  return steps if steps >= 1 else None


def _saving(saves: set[int], save_s: float):
  """``finished`` and ``busy`` of a job whose workers ``saves`` spend ``save_s`` in step 31's
  checkpoint save (math.inf: it hangs), while the others report step 31 and wait in step 32."""
  end = SAVE_FROM + save_s

  def finished(w, t):
    if t >= end:  # the save is over: the job goes on at 0.1 s a step
      return 31 + round((t - end) * 10)
    step = _fast(t)
    return step if step is None else min(step, 30 if w in saves else 31)

  def busy(w, t):
    return 'checkpoint save' if w in saves and SAVE_FROM + 1 <= t < end + 1 else ''

  return finished, busy


def test_a_25_s_save_on_every_worker_is_not_a_stall():
  """The job that was ended 10 s into its final save: with the phase published it goes on."""
  finished, busy = _saving({0, 1, 2, 3}, save_s=25.0)
  verdict, _ = _run(StallDetector(WORKERS, started=0.0), finished, until_s=60.0)
  assert verdict == (SAVE_FROM + FLOOR_S, (None, 'no worker made progress for 10.0 s after '
                                                 'step 30'))  # without the phase
  verdict, timeouts = _run(StallDetector(WORKERS, started=0.0), finished, until_s=60.0,
                           busy=busy)
  assert verdict is None and timeouts[-1] == FLOOR_S  # the save does not move the median


def test_a_save_that_hangs_is_named_after_the_busy_bound():
  finished, busy = _saving({2}, save_s=math.inf)
  detector = StallDetector(WORKERS, started=0.0)
  verdict, _ = _run(detector, finished, until_s=200.0, busy=busy)
  assert detector.busy_timeout_s() == max(BUSY_FLOOR_S, BUSY_FACTOR * FLOOR_S) == 120.0
  # The phase was first seen at 5 s: the verdict comes 120 s later, not 10 s after step 30.
  assert verdict == (SAVE_FROM + 1 + 120.0,
                     (2, 'worker 2 stuck in its checkpoint save for 120.0 s after step 30'))


def test_a_phase_that_ends_gives_back_the_step_timeout_from_its_end():
  """Worker 2's save takes 15 s; then it hangs, outside any phase, before reporting step 31."""
  finished, busy = _saving({2}, save_s=15.0)

  def hung(w, t):
    step = finished(w, t)
    return step if step is None else min(step, 30 if w == 2 else 31)

  verdict, _ = _run(StallDetector(WORKERS, started=0.0), hung, until_s=200.0, busy=busy)
  last_busy = SAVE_FROM + 15.0 + 1 - 0.5  # the last poll that saw its phase
  assert verdict == (last_busy + FLOOR_S, (2, 'worker 2 made no progress for 25.5 s after step '
                                              '30, while others finished step 31'))


def test_the_heartbeat_publishes_a_phase_that_lasts_and_not_one_that_does_not(monkeypatch):
  channel, writes = LocalChannel(), []
  channel_set = channel.set
  monkeypatch.setattr(channel, 'set', lambda k, v: (writes.append((k, v)), channel_set(k, v)))
  dog = ProgressWatchdog(channel, 1, 2)  # worker 1: a heartbeat, no watcher
  assert channel.wait('alive/1', timeout_s=5) == 1  # its first beat; the next in a second
  for _ in range(100):  # the checkpoint hook of steps that save nothing: no write
    with dog.busy('checkpoint save'):
      pass
  dog.close()
  assert [k for k, _ in writes] == ['alive/1']

  monkeypatch.setattr(_watchdog, '_HEARTBEAT_S', 0.01)
  dog = ProgressWatchdog(channel, 1, 2)

  def seen(value):
    deadline = time.monotonic() + 5
    while channel.try_get('busy/1') != value and time.monotonic() < deadline:
      time.sleep(0.005)
    return channel.try_get('busy/1')

  with dog.busy('checkpoint save'):
    assert seen('checkpoint save') == 'checkpoint save'
    with dog.busy('evaluation'):
      assert seen('evaluation') == 'evaluation'
    assert seen('checkpoint save') == 'checkpoint save'
  assert seen('') == ''
  dog.close()
