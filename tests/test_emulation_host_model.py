"""The one host model (`hetjax.emulation.HostModel`): emulated hosts and virtual clocks charge it."""

import doctest
import math

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.bench import HostPause
from hetjax.emulation import HostModel, KnownSpeedHost, _host_model, parse_trace
from hetjax.simulation import ClockCosts

TRACE = 'static:1.1,3.3,1,2.7*transient:0.7:0.5:seed=7'


def test_the_docstring_examples_hold():
  assert doctest.testmod(_host_model, raise_on_error=True).attempted > 0


def test_fixed_plus_rows_times_row_cost_times_slowdown():
  host = HostModel(row_s=2e-3, fixed_s=1e-2, speed=2.0)
  assert host.nominal_s(20) == 1e-2 + 20 * 2e-3 / 2.0
  assert host.step_s(20, 3.0) == 3.0 * host.nominal_s(20)
  assert host.step_s(0, 2.0) == 2e-2   # an empty step still pays the fixed cost


@pytest.mark.parametrize('kwargs, match', [({'row_s': 0.0}, 'row_s'), ({'row_s': -1.0}, 'row_s'),
                                           ({'row_s': (1e-3, math.nan)}, 'row_s'),
                                           ({'row_s': 1e-3, 'fixed_s': -1.0}, 'fixed_s'),
                                           ({'row_s': 1e-3, 'speed': 0.0}, 'speed'),
                                           ({'row_s': 1e-3, 'speed': True}, 'speed')])
def test_bad_hosts_are_one_line(kwargs, match):
  with pytest.raises(ConfigError, match=match) as info:
    HostModel(**kwargs)
  assert '\n' not in str(info.value)


def test_the_virtual_clock_charges_what_an_emulated_host_pads_to():
  trace = parse_trace(TRACE, 4)
  costs = ClockCosts(per_sample_s=(1e-3, 1.3e-3, 2e-3, 1e-3), fixed_s=5e-3)
  rows = np.array([40, 10, 25, 0])
  hosts = [KnownSpeedHost(trace, w, row_s=costs.per_sample_s[w], fixed_s=5e-3)
           for w in range(4)]
  for step in range(12):
    virtual = costs.compute_s(rows, trace.factors(step) + trace.delays(step))
    real = [hosts[w].target_s(step, int(rows[w])) for w in range(4)]
    assert virtual.tolist() == real   # exactly: one model, not two that agree


def test_a_virtual_replica_steps_as_its_host_pause():
  from hetjax.simulation._sync import simulate_sync

  pauses = [HostPause.of_step('persistent:1:3', 2, w, step_s=0.05, seed=0) for w in range(2)]
  run = simulate_sync('all-reduce', 2, steps=4, step_s=0.05, slowdown='persistent:1:3')
  assert run.total_s == pytest.approx(sum(max(p.target_s(s) for p in pauses)
                                          for s in range(1, 5)))
