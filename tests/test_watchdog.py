"""The stall watchdog's rule on a scripted clock: a slow healthy job is never ended, a worker that
truly stops is named once the timeout that follows the measured step time has passed.

Each case is a job of 4 workers polled every 0.5 s of scripted time, as `ProgressWatchdog`'s
thread polls the channel; the scripted job compiles for 20 s, then takes 14 s a step (the
3.3M-parameter GPT on 4 workers that the old 10 s default ended at step 2).
"""

from __future__ import annotations

import math

import pytest

from hetjax.runtime._watchdog import FACTOR, FLOOR_S, StallDetector

WORKERS, COMPILE_S, STEP_S, POLL_S = 4, 20.0, 14.0, 0.5


def _finished(w: int, t: float) -> int | None:
  """The last step worker ``w`` finished at ``t`` s (None before its first); worker ``w`` ends
  each step ``0.1 w`` s after worker 0, as unequal hosts do."""
  steps = math.floor((t - COMPILE_S - 0.1 * w) / STEP_S)
  return steps if steps >= 1 else None


def _run(detector, finished, until_s, beating=lambda w, t: True):
  """Polls ``detector`` every 0.5 s from 0 to ``until_s``; ``finished(w, t)`` is worker w's last
  finished step, ``beating(w, t)`` whether its heartbeat (once a second) still beats. Returns
  (the time of the verdict, the verdict) or None, and the timeouts seen after each poll."""
  beats: dict[int, int] = {}
  timeouts = []
  for i in range(int(until_s / POLL_S) + 1):
    t = i * POLL_S
    values = {}
    for w in range(WORKERS):
      if beating(w, t):
        beats[w] = int(t) + 1
      values[f'progress/{w}'], values[f'alive/{w}'] = finished(w, t), beats.get(w)
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
