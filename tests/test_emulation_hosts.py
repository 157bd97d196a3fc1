"""`KnownSpeedHost`: a real step padded by sleep to the time its emulated host takes.

A fake clock and a fake sleep stand in for time, so the targets and sleeps are checked exactly and
the tests take no time.
"""

from __future__ import annotations

import math
import time

import pytest

from hetjax._errors import ConfigError
from hetjax.emulation import KnownSpeedHost, StaticTrace, TransientTrace, parse_trace


class FakeTime:
  """``sleep`` records the request and moves ``clock`` on by it, plus ``late`` seconds."""

  def __init__(self, late: float = 0.0):
    self.now, self.late, self.sleeps = 100.0, late, []

  def sleep(self, seconds: float) -> None:
    self.sleeps.append(seconds)
    self.now += seconds + self.late

  def clock(self) -> float:
    return self.now


def host(trace, worker, fake, row_s=0.25, fixed_s=0.5) -> KnownSpeedHost:
  # Binary fractions: every target below is exact in floating point.
  return KnownSpeedHost(trace, worker, row_s=row_s, fixed_s=fixed_s, sleep=fake.sleep,
                        clock=fake.clock)


def test_targets_are_factor_times_the_nominal_step():
  fake = FakeTime()
  trace = parse_trace('step:3:1,2:1,4', 2)
  fast, slow = host(trace, 0, fake), host(trace, 1, fake)
  assert fast.nominal_s(6) == 0.5 + 6 * 0.25 == 2.0
  assert fast.target_s(0, rows=6) == 2.0 and fast.factor(0) == 1.0
  assert slow.target_s(0, rows=6) == 4.0 and slow.factor(2) == 2.0
  assert slow.target_s(3, rows=6) == 8.0 and slow.factor(3) == 4.0
  assert slow.target_s(3, rows=0) == 4 * 0.5  # no rows: the fixed cost, slowed down
  assert fake.sleeps == []  # asking for a target never sleeps


def test_transient_delays_add_h_nominal_steps_on_the_drawn_steps():
  fake = FakeTime()
  trace = parse_trace('static:2*transient:3:0.5:seed=2', 1)
  h = host(trace, 0, fake)
  transient = TransientTrace(1, 3.0, 0.5, seed=2)
  hits = [s for s in range(50) if transient.delay(0, s) > 0]
  misses = [s for s in range(50) if transient.delay(0, s) == 0]
  assert hits and misses
  assert all(h.target_s(s, rows=6) == 2 * 2.0 + 3 * 2.0 for s in hits)
  assert all(h.target_s(s, rows=6) == 2 * 2.0 for s in misses)


def test_pad_sleeps_the_rest_of_the_target():
  fake = FakeTime()
  slow = host(StaticTrace((1, 3)), 1, fake)  # target 3 × (0.5 + 4 × 0.25) = 4.5 s for 4 rows
  assert slow.pad(0, rows=4, measured_s=1.25) == (3.25, 0.0)
  assert slow.pad(1, rows=4, measured_s=0.0) == (4.5, 0.0)
  assert fake.sleeps == [3.25, 4.5]
  late = FakeTime(late=0.125)  # a sleep that returns late: reported as slept, not overrun
  assert host(StaticTrace((1, 3)), 1, late).pad(0, rows=4, measured_s=1.25) == (3.375, 0.0)
  assert late.sleeps == [3.25]


def test_a_compute_past_the_target_is_an_overrun_and_not_padded():
  fake = FakeTime()
  fast = host(StaticTrace((1, 3)), 0, fake)  # target 0.5 + 4 × 0.25 = 1.5 s
  assert fast.pad(0, rows=4, measured_s=2.0) == (0.0, 0.5)
  assert fast.pad(0, rows=4, measured_s=1.5) == (0.0, 0.0)  # exactly on time: nothing to do
  assert fake.sleeps == []


def test_several_calls_a_step_carry_what_they_are_late_to_the_next():
  """A token worker's host runs its calls back to back: a call past its time is made up by the
  next one's padding (`TokenTrainer` passes ``measured_s + late``), so only what is still late
  after the step's last call is an overrun."""
  fake = FakeTime()
  fast = host(StaticTrace((1, 3)), 0, fake)  # target 1.5 s a call of 4 rows
  late = 0.0
  for measured, expected in ((2.0, (0.0, 0.5)), (0.75, (0.25, 0.0)), (1.75, (0.0, 0.25)),
                             (1.5, (0.0, 0.25))):
    slept, late = fast.pad(0, rows=4, measured_s=measured + late)
    assert (slept, late) == expected
  # The host's call ends: 1.5, 3.0, 4.5 and 6.0 s; the real ones 2.0, 3.0, 4.75 and 6.25 s.
  assert fake.sleeps == [0.25]


def test_pad_really_sleeps_by_default():
  h = KnownSpeedHost(StaticTrace((1.0,)), 0, row_s=0.001)
  start = time.perf_counter()
  slept, overrun = h.pad(0, rows=30, measured_s=0.01)  # target 30 ms: sleeps ~20 ms
  # time.sleep never returns early. The upper bound is a second of scheduler lateness on a
  # loaded machine: a pad of the wrong unit (20 s) or of the whole target again would pass it.
  assert 0.02 <= slept <= time.perf_counter() - start < 0.02 + 1.0 and overrun == 0.0


@pytest.mark.parametrize(('kwargs', 'needle'), [
    ({'worker': 2}, 'worker 2 out of range for 2 workers'),
    ({'worker': -1}, 'worker must be an int >= 0, got -1'),
    ({'worker': True}, 'worker must be an int >= 0, got True'),
    ({'row_s': 0.0}, 'row_s must be > 0, got 0'),
    ({'row_s': -1e-3}, 'row_s must be a finite number >= 0, got -0.001'),
    ({'row_s': math.nan}, 'row_s must be a finite number >= 0, got nan'),
    ({'fixed_s': math.inf}, 'fixed_s must be a finite number >= 0, got inf'),
    ({'fixed_s': '0.1'}, "fixed_s must be a finite number >= 0, got '0.1'"),
])
def test_bad_hosts_are_config_errors(kwargs, needle):
  args = {'trace': StaticTrace((1, 3)), 'worker': 0, 'row_s': 1e-3} | kwargs
  with pytest.raises(ConfigError) as info:
    KnownSpeedHost(**args)
  assert needle in str(info.value) and '\n' not in str(info.value)


def test_bad_steps_rows_and_timings_are_config_errors():
  fake = FakeTime()
  h = host(StaticTrace((1, 3)), 0, fake)
  with pytest.raises(ConfigError, match='rows must be an int >= 0, got -1'):
    h.target_s(0, rows=-1)
  with pytest.raises(ConfigError, match=r'rows must be an int >= 0, got 2\.5'):
    h.pad(0, rows=2.5, measured_s=0.1)
  with pytest.raises(ConfigError, match='measured_s must be a finite number >= 0, got nan'):
    h.pad(0, rows=2, measured_s=math.nan)
  with pytest.raises(ConfigError, match='step -1 is negative'):
    h.pad(-1, rows=2, measured_s=0.1)
  assert fake.sleeps == []
