"""Hosts of known speed for pipeline stages: padding each action, and its nominal cost from the
compiled program's work."""

import jax
import jax.numpy as jnp
import pytest

from hetjax import ConfigError
from hetjax.emulation import StagePace, parse_trace
from hetjax.pipeline import roofline_costs


class _Clock:
  def __init__(self):
    self.now, self.slept = 0.0, []

  def sleep(self, seconds):
    self.slept.append(seconds)
    self.now += seconds


def _pace(spec='static:1,3', worker=1, nominal=None):
  clock = _Clock()
  pace = StagePace(parse_trace(spec, 2), worker, nominal or {(0, 'forward'): 0.010,
                                                            (1, 'update'): 0.002},
                   sleep=clock.sleep, clock=lambda: clock.now)
  return pace, clock


def test_an_action_is_padded_to_factor_times_its_nominal_cost():
  pace, clock = _pace()
  assert pace.pad_action(0, 0, 'forward', measured_s=0.004) == pytest.approx((0.026, 0.0))
  assert clock.slept == [pytest.approx(0.026)]  # 3 × 10 ms − 4 ms
  assert pace.pad_action(5, 1, 'update', measured_s=0.001) == pytest.approx((0.005, 0.0))
  assert pace.slept_s == pytest.approx(0.031) and pace.overruns == 0


def test_an_action_past_its_time_is_not_padded_and_counts():
  pace, clock = _pace(worker=0)
  assert pace.pad_action(0, 0, 'forward', measured_s=0.013) == pytest.approx((0.0, 0.003))
  assert clock.slept == [] and pace.overruns == 1 and pace.overrun_s == pytest.approx(0.003)


def test_transient_delays_add_to_the_factor():
  pace, _ = _pace('transient:2:1.0', worker=0)  # a delay of 2 nominal steps every step
  assert pace.target_s(0, 0, 'forward') == pytest.approx(0.030)


def test_an_action_without_a_cost_is_one_line():
  pace, _ = _pace()
  with pytest.raises(ConfigError, match='no calibrated cost for stage 2 backward on worker 1'):
    pace.pad_action(0, 2, 'backward', 0.0)


def test_a_stage_host_is_a_pace_of_actions_only():
  pace, clock = _pace()
  assert (pace.factor(3), pace.load(3)) == (3.0, 3.0)
  with pace.exchange(1 << 20):  # no links: a move between stages takes the machine's time
    pass
  with pytest.raises(ConfigError, match=r"stage host \(worker 1\) paces stage actions, not steps "
                                        'of 8 rows') as error:
    pace.pad(0, 8, 0.0)
  assert '\n' not in str(error.value) and clock.slept == []


def test_roofline_costs_price_each_program_from_its_work():
  big = jax.jit(lambda a: jnp.tanh(a @ a)).lower(jnp.ones((256, 256))).compile()
  copy = jax.jit(lambda a: a * 2.0).lower(jnp.ones((1 << 16,))).compile()
  flops_per_s, bytes_per_s = 1e10, 1e9
  costs = roofline_costs({'s0/forward': big, 's1/update': copy}, flops_per_s, bytes_per_s, 1.5)
  big_work = big.cost_analysis()
  assert costs[0, 'forward'] == pytest.approx(1.5 * max(
      big_work['flops'] / flops_per_s, big_work['bytes accessed'] / bytes_per_s))
  # A streaming program is priced by its bytes: 256 KiB read and written at 1 GB/s.
  assert costs[1, 'update'] == pytest.approx(1.5 * copy.cost_analysis()['bytes accessed'] / 1e9)
  assert costs[1, 'update'] >= 1.5 * 2 * 4 * (1 << 16) / 1e9 * 0.99
