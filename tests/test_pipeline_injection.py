"""`StragglerPause`: SDPipe's straggler injection on a real worker, as a sleep after each step.

The pause pads a step to ``factor × step_s`` plus, for a transient straggler, ``h × step_s`` on
the steps drawn with probability ``p`` (seeded by (seed, worker, step)). Sleeping is replaced by a
fake clock in most tests, so they check the requested sleep exactly and take no time.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.pipeline import _injection
from hetjax.pipeline._injection import StragglerPause
from hetjax.pipeline._virtual_sdpipe import Straggler, parse_straggler

STEP_S = 0.06


@pytest.fixture
def fake_time(monkeypatch):
  """Replaces the module's `time` by a fake: `sleep` records and moves `perf_counter` on."""
  clock = types.SimpleNamespace(now=100.0, sleeps=[])

  def sleep(seconds):
    clock.sleeps.append(seconds)
    clock.now += seconds

  monkeypatch.setattr(_injection, 'time',
                      types.SimpleNamespace(sleep=sleep, perf_counter=lambda: clock.now))
  return clock


def injected(pause, steps):
  """The steps of ``steps`` on which ``pause`` draws a transient sleep."""
  return [s for s in steps if pause.transient_s(s) > 0]


# --- targets -------------------------------------------------------------------------------


@pytest.mark.parametrize('spec', ['none', None, Straggler()])
def test_no_straggler_pads_every_step_to_step_s(spec):
  pause = StragglerPause(spec, worker=2, step_s=STEP_S)
  assert pause.straggler == Straggler()
  assert pause.factor == 1.0
  assert all(pause.target_s(s) == STEP_S and pause.transient_s(s) == 0.0 for s in range(100))


def test_persistent_straggler_slows_only_its_own_worker():
  slow = StragglerPause('persistent:1:3', worker=1, step_s=STEP_S)
  assert slow.straggler == Straggler('persistent', worker=1, factor=3.0)
  assert slow.factor == 3.0
  assert all(slow.target_s(s) == pytest.approx(3 * STEP_S) for s in range(100))
  for w in (0, 2, 7):
    other = StragglerPause('persistent:1:3', worker=w, step_s=STEP_S)
    assert other.factor == 1.0
    assert all(other.target_s(s) == STEP_S for s in range(100))
  assert StragglerPause('persistent:0:0.5', 0, STEP_S).target_s(1) == pytest.approx(STEP_S / 2)


def test_transient_straggler_adds_h_steps_on_drawn_steps_only():
  pause = StragglerPause('transient:3:0.5', worker=0, step_s=STEP_S)
  assert pause.factor == 1.0
  targets = [pause.target_s(s) for s in range(200)]
  assert {round(t, 12) for t in targets} == {round(STEP_S, 12), round(4 * STEP_S, 12)}
  assert all(pause.target_s(s) == STEP_S + pause.transient_s(s) for s in range(200))
  assert StragglerPause('transient:3:0', 0, STEP_S).target_s(5) == STEP_S  # p = 0: never
  assert all(StragglerPause('transient:2:1', 0, STEP_S).transient_s(s) == pytest.approx(
      2 * STEP_S) for s in range(50))  # p = 1: always


def test_transient_draws_are_fixed_by_seed_worker_and_step():
  a = StragglerPause('transient:1:0.3', worker=1, step_s=STEP_S, seed=5)
  b = StragglerPause('transient:1:0.3', worker=1, step_s=STEP_S, seed=5)
  steps = range(500)
  assert injected(a, steps) == injected(b, steps)
  assert injected(a, reversed(steps))[::-1] == injected(a, steps)  # no state across calls
  assert injected(a, steps) != injected(StragglerPause('transient:1:0.3', 1, STEP_S, seed=6),
                                        steps)
  assert injected(a, steps) != injected(StragglerPause('transient:1:0.3', 0, STEP_S, seed=5),
                                        steps)
  # The draw decides whether, h only how long: the same steps for any h.
  assert injected(StragglerPause('transient:3:0.3', 1, STEP_S, seed=5), steps) == \
      injected(a, steps)


@pytest.mark.parametrize(('p', 'seed', 'worker'), [(0.1, 0, 0), (0.1, 3, 2), (0.5, 1, 1)])
def test_fraction_of_injected_steps_is_close_to_p(p, seed, worker):
  n = 2000
  pause = StragglerPause(f'transient:3:{p}', worker=worker, step_s=STEP_S, seed=seed)
  fraction = len(injected(pause, range(n))) / n
  assert abs(fraction - p) <= 4 * math.sqrt(p * (1 - p) / n)


# --- sleeping ------------------------------------------------------------------------------


def test_pause_sleeps_the_rest_of_the_target(fake_time):
  assert StragglerPause('none', 0, STEP_S)(1, compute_s=0.01) == pytest.approx(0.05)
  assert StragglerPause('persistent:1:3', 1, STEP_S)(1, compute_s=0.05) == pytest.approx(0.13)
  assert StragglerPause('persistent:1:3', 0, STEP_S)(1, compute_s=0.05) == pytest.approx(0.01)
  assert fake_time.sleeps == pytest.approx([0.05, 0.13, 0.01])

  pause = StragglerPause('transient:3:0.5', 0, STEP_S, seed=2)
  hit, miss = injected(pause, range(50))[0], next(s for s in range(50) if not pause.transient_s(s))
  fake_time.sleeps.clear()
  assert pause(hit, compute_s=0.02) == pytest.approx(4 * STEP_S - 0.02)
  assert pause(miss, compute_s=0.02) == pytest.approx(STEP_S - 0.02)
  assert fake_time.sleeps == pytest.approx([4 * STEP_S - 0.02, STEP_S - 0.02])


def test_pause_does_not_sleep_when_the_compute_took_the_target_or_longer(fake_time):
  assert StragglerPause('none', 0, STEP_S)(1, compute_s=STEP_S) == 0.0
  assert StragglerPause('none', 0, STEP_S)(1, compute_s=0.5) == 0.0
  assert StragglerPause('persistent:0:3', 0, STEP_S)(1, compute_s=3 * STEP_S + 0.01) == 0.0
  pause = StragglerPause('transient:3:0.5', 0, STEP_S, seed=2)
  hit = injected(pause, range(50))[0]
  assert pause(hit, compute_s=4 * STEP_S + 0.001) == 0.0
  assert fake_time.sleeps == []


def test_pause_really_sleeps_and_returns_the_time_slept():
  slept = StragglerPause('none', 0, step_s=0.03)(1, compute_s=0.01)
  assert 0.02 <= slept < 0.5


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize('step_s', [0, -0.1, math.inf, math.nan, '0.06', True, None])
def test_bad_step_s_is_a_config_error(step_s):
  with pytest.raises(ConfigError, match='step_s'):
    StragglerPause('none', 0, step_s)


@pytest.mark.parametrize('worker', [-1, True, 1.5, '1', None])
def test_bad_worker_is_a_config_error(worker):
  with pytest.raises(ConfigError, match='worker'):
    StragglerPause('none', worker, STEP_S)


@pytest.mark.parametrize('seed', [-1, True, 1.5, None])
def test_bad_seed_is_a_config_error(seed):
  with pytest.raises(ConfigError, match='seed'):
    StragglerPause('transient:3', 0, STEP_S, seed=seed)


def test_numpy_integers_are_accepted_and_a_negative_step_is_a_config_error():
  pause = StragglerPause('transient:3:1', np.int64(1), STEP_S, seed=np.int64(2))
  assert (pause.worker, pause.seed) == (1, 2)
  assert pause.target_s(np.int64(3)) == pytest.approx(4 * STEP_S)
  with pytest.raises(ConfigError, match='step'):
    pause.target_s(-1)


@pytest.mark.parametrize('spec', ['slow', 'transient', 'transient:x', 'transient:1:2',
                                  'transient:-1', 'transient:1:0.1:3', 'persistent:1',
                                  'persistent:1:0', 'persistent:-1:3', 'persistent:1.5:3',
                                  'none:1', 42, 3.0])
def test_bad_straggler_spec_is_a_config_error(spec):
  with pytest.raises(ConfigError, match='straggler'):
    StragglerPause(spec, 0, STEP_S)


def test_string_and_parsed_forms_are_the_same_pause():
  for spec in ('none', 'transient:3', 'transient:1:0.25', 'persistent:2:4'):
    pause = StragglerPause(spec, 2, STEP_S, seed=9)
    assert pause == StragglerPause(parse_straggler(spec), 2, STEP_S, seed=9)
    assert isinstance(pause.straggler, Straggler)
  assert StragglerPause('transient:3', 0, STEP_S).straggler.p == 0.1  # p left out: 0.1
