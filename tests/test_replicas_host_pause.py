"""`HostPause`: a pipeline replica's emulated host priced per step, a sleep after each step (one
grammar); `replica_trace` reads its slowdown.

The pause pads a step to ``factor × step_s`` plus, for SDPipe's transient stragglers, ``h ×
step_s`` on the steps drawn with probability ``p`` (seeded by (seed, worker, step)), through a
`KnownSpeedHost` over a `parse_trace` trace. Sleeping is replaced by a fake clock in most tests,
so they check the requested sleep exactly and take no time.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.bench import HostPause
from hetjax.emulation import (
  KnownSpeedHost,
  StaticTrace,
  TransientTrace,
  parse_trace,
  replica_trace,
)

STEP_S = 0.06
WORKERS = 8


def pause_of(spec, worker, step_s=STEP_S, seed=None, **host):
  return HostPause.of_step(spec, WORKERS, worker, step_s, seed, **host)


@pytest.fixture
def fake_time():
  """A fake clock: `sleep` records and moves `now` on (given to the host)."""
  clock = types.SimpleNamespace(now=100.0, sleeps=[])

  def sleep(seconds):
    clock.sleeps.append(seconds)
    clock.now += seconds

  clock.host = {'sleep': sleep, 'clock': lambda: clock.now}
  return clock


def slept(pause, step, compute_s):
  """What the replica's pace sleeps after a step's compute of ``compute_s`` (any rows: every
  step is priced at the replica's batch)."""
  return pause.pad(step, 16, compute_s)[0]


def transient_s(pause, step):
  return pause.host.trace.delay(pause.host.worker, step) * STEP_S


def injected(pause, steps):
  """The steps of ``steps`` on which ``pause`` draws a transient sleep."""
  return [s for s in steps if transient_s(pause, s) > 0]


# --- targets -------------------------------------------------------------------------------


@pytest.mark.parametrize('spec', ['none', None, StaticTrace((1.0,) * WORKERS)])
def test_no_slowdown_pads_every_step_to_step_s(spec):
  pause = pause_of(spec, worker=2)
  assert pause.host.factor(0) == 1.0
  assert all(pause.target_s(s) == STEP_S and transient_s(pause, s) == 0.0 for s in range(100))


def test_persistent_straggler_slows_only_its_own_worker():
  slow = pause_of('persistent:1:3', worker=1)
  assert slow.host.trace == StaticTrace((1, 3, 1, 1, 1, 1, 1, 1))
  assert all(slow.target_s(s) == pytest.approx(3 * STEP_S) for s in range(100))
  for w in (0, 2, 7):
    other = pause_of('persistent:1:3', worker=w)
    assert all(other.target_s(s) == STEP_S for s in range(100))
  assert pause_of('persistent:0:0.5', 0).target_s(1) == pytest.approx(STEP_S / 2)


def test_transient_straggler_adds_h_steps_on_drawn_steps_only():
  pause = pause_of('transient:3:0.5', worker=0)
  targets = [pause.target_s(s) for s in range(200)]
  assert {round(t, 12) for t in targets} == {round(STEP_S, 12), round(4 * STEP_S, 12)}
  assert all(pause.target_s(s) == STEP_S + transient_s(pause, s) for s in range(200))
  assert pause_of('transient:3:0', 0).target_s(5) == STEP_S  # p = 0: never
  assert all(transient_s(pause_of('transient:2:1', 0), s) == pytest.approx(2 * STEP_S)
             for s in range(50))  # p = 1: always


def test_transient_draws_are_fixed_by_seed_worker_and_step():
  a = pause_of('transient:1:0.3', worker=1, seed=5)
  b = pause_of('transient:1:0.3:seed=5', worker=1)  # the seed in the spec or beside it
  steps = range(500)
  assert injected(a, steps) == injected(b, steps)
  assert injected(a, reversed(steps))[::-1] == injected(a, steps)  # no state across calls
  assert injected(a, steps) != injected(pause_of('transient:1:0.3', 1, seed=6), steps)
  assert injected(a, steps) != injected(pause_of('transient:1:0.3', 0, seed=5), steps)
  # The draw decides whether, h only how long: the same steps for any h.
  assert injected(pause_of('transient:3:0.3', 1, seed=5), steps) == injected(a, steps)
  # A seed named in the spec wins over the one beside it.
  assert injected(pause_of('transient:1:0.3:seed=5', 1, seed=6), steps) == injected(a, steps)


@pytest.mark.parametrize(('p', 'seed', 'worker'), [(0.1, 0, 0), (0.1, 3, 2), (0.5, 1, 1)])
def test_fraction_of_injected_steps_is_close_to_p(p, seed, worker):
  n = 2000
  pause = pause_of(f'transient:3:{p}', worker=worker, seed=seed)
  fraction = len(injected(pause, range(n))) / n
  assert abs(fraction - p) <= 4 * math.sqrt(p * (1 - p) / n)


def test_a_step_of_many_rows_takes_its_host_time():
  host = KnownSpeedHost(parse_trace('persistent:1:3', 2), 1, row_s=0.001, fixed_s=0.004)
  assert HostPause(host, rows=16).target_s(1) == pytest.approx(3 * (0.004 + 16 * 0.001))


# --- sleeping ------------------------------------------------------------------------------


def test_pause_sleeps_the_rest_of_the_target(fake_time):
  host = fake_time.host
  assert slept(pause_of('none', 0, **host), 1, compute_s=0.01) == pytest.approx(0.05)
  assert slept(pause_of('persistent:1:3', 1, **host), 1, compute_s=0.05) == pytest.approx(0.13)
  assert slept(pause_of('persistent:1:3', 0, **host), 1, compute_s=0.05) == pytest.approx(0.01)
  assert fake_time.sleeps == pytest.approx([0.05, 0.13, 0.01])

  pause = pause_of('transient:3:0.5', 0, seed=2, **host)
  hit = injected(pause, range(50))[0]
  miss = next(s for s in range(50) if not transient_s(pause, s))
  fake_time.sleeps.clear()
  assert slept(pause, hit, compute_s=0.02) == pytest.approx(4 * STEP_S - 0.02)
  assert slept(pause, miss, compute_s=0.02) == pytest.approx(STEP_S - 0.02)
  assert fake_time.sleeps == pytest.approx([4 * STEP_S - 0.02, STEP_S - 0.02])


def test_pause_does_not_sleep_when_the_compute_took_the_target_or_longer(fake_time):
  host = fake_time.host
  assert slept(pause_of('none', 0, **host), 1, compute_s=STEP_S) == 0.0
  assert slept(pause_of('none', 0, **host), 1, compute_s=0.5) == 0.0
  assert slept(pause_of('persistent:0:3', 0, **host), 1, compute_s=3 * STEP_S + 0.01) == 0.0
  pause = pause_of('transient:3:0.5', 0, seed=2, **host)
  hit = injected(pause, range(50))[0]
  assert slept(pause, hit, compute_s=4 * STEP_S + 0.001) == 0.0
  assert fake_time.sleeps == []


def test_pause_really_sleeps_and_returns_the_time_slept():
  seconds = slept(pause_of('none', 0, step_s=0.03), 1, compute_s=0.01)
  assert 0.02 <= seconds < 0.5


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize('step_s', [0, -0.1, math.inf, math.nan, '0.06', True, None])
def test_bad_step_s_is_a_config_error(step_s):
  with pytest.raises(ConfigError, match='step_s'):
    pause_of('none', 0, step_s)


@pytest.mark.parametrize('worker', [-1, True, 1.5, '1', None, WORKERS])
def test_bad_worker_is_a_config_error(worker):
  with pytest.raises(ConfigError, match='worker'):
    pause_of('none', worker)


@pytest.mark.parametrize('seed', [-1, True, 1.5])
def test_bad_seed_is_a_config_error(seed):
  with pytest.raises(ConfigError, match='seed'):
    pause_of('transient:3', 0, seed=seed)


def test_numpy_integers_are_accepted_and_a_negative_step_is_a_config_error():
  pause = pause_of('transient:3:1', np.int64(1), seed=np.int64(2))
  assert pause.host.worker == 1 and pause.host.trace.seed == 2
  assert pause.target_s(np.int64(3)) == pytest.approx(4 * STEP_S)
  with pytest.raises(ConfigError, match='step'):
    pause.target_s(-1)


@pytest.mark.parametrize('spec', ['slow', 'transient', 'transient:x', 'transient:1:2',
                                  'transient:-1', 'transient:1:0.1:3', 'persistent:1',
                                  'persistent:1:0', 'persistent:-1:3', 'persistent:1.5:3',
                                  'persistent:8:3', 'none:1', 42, 3.0])
def test_bad_slowdown_spec_is_a_config_error(spec):
  with pytest.raises(ConfigError, match='slowdown') as info:
    pause_of(spec, 0)
  assert '\n' not in str(info.value)


def test_the_one_grammar_parses_the_replicas_slowdown():
  for spec in ('none', 'transient:3', 'transient:1:0.25', 'persistent:2:4', 'static:1,2,1,1,1,1,1,1',
               'markov:3:0.9:seed=1', 'persistent:2:4*transient:1'):
    assert replica_trace(spec, WORKERS) == parse_trace(spec, WORKERS)
  assert replica_trace('transient:3', WORKERS) == TransientTrace(WORKERS, 3.0, 0.1, 0)  # p: 0.1
  with pytest.raises(ConfigError, match='trace is for 2 workers, the job has 8'):
    replica_trace(StaticTrace((1, 2)), WORKERS)
