"""`calibrate_row_cost`: fixed + per-row seconds fitted to scripted timings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.emulation import RowCost, calibrate_row_cost

ROW_S, FIXED_S = 1e-4, 4e-3


def line(rows: int) -> float:
  return FIXED_S + rows * ROW_S


class Script:
  """``measure``: the line's time, except that call i (from 0) takes ``spikes[i]`` × as long."""

  def __init__(self, time_of=line, spikes=None):
    self.time_of, self.spikes, self.calls = time_of, dict(spikes or {}), []

  def __call__(self, rows: int) -> float:
    seconds = self.time_of(rows) * self.spikes.get(len(self.calls), 1.0)
    self.calls.append(rows)
    return seconds


def test_recovers_the_line_times_the_margin():
  script = Script()
  cost = calibrate_row_cost(script, rows=(64, 256, 1024), repeats=5, margin=1.25)
  assert isinstance(cost, RowCost)
  assert cost.row_s == pytest.approx(1.25 * ROW_S, rel=1e-9)
  assert cost.fixed_s == pytest.approx(1.25 * FIXED_S, rel=1e-9)
  assert cost.seconds(100) == pytest.approx(1.25 * line(100), rel=1e-9)
  assert script.calls == [64, 256, 1024] * 5  # sizes interleaved, every size once per round
  assert cost.measured == tuple((r, line(r)) for r in script.calls)
  plain = calibrate_row_cost(Script(), rows=(64, 256), repeats=1, margin=1.0)
  assert (plain.row_s, plain.fixed_s) == pytest.approx((ROW_S, FIXED_S), rel=1e-9)


@pytest.mark.parametrize('spike', range(10))
def test_one_10x_spike_does_not_move_the_fit(spike):
  script = Script(spikes={spike: 10.0})  # any one of 2 sizes × 5 repeats is 10× slow
  cost = calibrate_row_cost(script, rows=(64, 256), repeats=5, margin=1.25)
  assert cost.row_s == pytest.approx(1.25 * ROW_S, rel=1e-9)
  assert cost.fixed_s == pytest.approx(1.25 * FIXED_S, rel=1e-9)
  assert sum(s != line(r) for r, s in cost.measured) == 1  # the spike is kept in `measured`


def test_two_spikes_on_one_size_and_a_compile_on_the_other_are_absorbed():
  # Calls alternate 64, 256, 64, …: two of size 64's five are 10× slow, 256's first is 100×.
  script = Script(spikes={0: 10.0, 2: 10.0, 1: 100.0})
  cost = calibrate_row_cost(script, rows=(64, 256), repeats=5, margin=1.0)
  assert (cost.row_s, cost.fixed_s) == pytest.approx((ROW_S, FIXED_S), rel=1e-9)


def test_a_negative_intercept_is_clamped_and_refitted_through_the_origin():
  # t = 2e-4·rows − 1e-3 at rows 10 and 20: the line through (10, 1e-3), (20, 3e-3) hits −1e-3.
  cost = calibrate_row_cost(lambda r: 2e-4 * r - 1e-3, rows=(10, 20), repeats=3, margin=1.0)
  assert cost.fixed_s == 0.0
  # Least squares through the origin: Σ r·t / Σ r² = (10·1e-3 + 20·3e-3) / 500 = 1.4e-4.
  assert cost.row_s == pytest.approx(1.4e-4, rel=1e-9)


@pytest.mark.parametrize(('kwargs', 'needle'), [
    ({'rows': (64,)}, 'needs at least two distinct row counts, got (64,)'),
    ({'rows': (64, 64)}, 'at least two distinct row counts'),
    ({'rows': (0, 64)}, 'rows must be an int >= 1, got 0'),
    ({'rows': (64, 12.5)}, 'rows must be an int >= 1, got 12.5'),
    ({'repeats': 0}, 'repeats must be an int >= 1, got 0'),
    ({'margin': 0.9}, 'margin must be a finite number >= 1, got 0.9'),
    ({'margin': math.inf}, 'margin must be a finite number >= 1, got inf'),
    ({'measure': lambda r: -1.0}, 'measure(64) returned -1.0; it must be seconds >= 0'),
    ({'measure': lambda r: math.nan}, 'measure(64) returned nan'),
    ({'measure': lambda r: None}, 'measure(64) returned None'),
    ({'measure': lambda r: 0.0}, 'calibration measured no time at rows (64, 256)'),
])
def test_bad_calibrations_are_config_errors(kwargs, needle):
  args = {'measure': line, 'rows': (64, 256)} | kwargs
  with pytest.raises(ConfigError) as info:
    calibrate_row_cost(**args)
  assert needle in str(info.value) and '\n' not in str(info.value)


def test_a_tail_quantile_scales_the_median_line_up_to_the_slow_spells():
  # 20 rounds of (64, 256): rounds 16–19 run 3× slow, a slow spell that slows both sizes.
  script = Script(spikes={i: 3.0 for i in range(32, 40)})
  cost = calibrate_row_cost(script, rows=(64, 256), repeats=20, margin=1.25, tail=0.9)
  # Medians keep the line's shape; the 0.9 quantile of measured / line over the 40 timings is
  # the interpolated 36.1th of 32 ones and 8 threes: 3.0, above the margin.
  assert cost.scale == pytest.approx(3.0)
  assert (cost.row_s, cost.fixed_s) == pytest.approx((3 * ROW_S, 3 * FIXED_S), rel=1e-9)
  calm = calibrate_row_cost(Script(), rows=(64, 256), repeats=20, margin=1.25, tail=0.9)
  assert calm.scale == 1.25  # no spell: the margin
  median = calibrate_row_cost(Script(spikes={i: 3.0 for i in range(32, 40)}), rows=(64, 256),
                              repeats=20, margin=1.25, tail=0.5)
  assert median.scale == 1.25


@pytest.mark.parametrize('tail', [0, -0.1, 1.5, True, 'high', math.nan])
def test_a_bad_tail_is_a_config_error(tail):
  with pytest.raises(ConfigError, match=r'^tail must be a quantile in \(0, 1\] or None, got '):
    calibrate_row_cost(line, rows=(64, 256), tail=tail)


@pytest.mark.parametrize('time_of', [lambda r: 0.01, lambda r: 1.0 / r])
def test_no_rise_with_the_rows_makes_the_cost_all_per_row(time_of):
  """Medians that do not grow: the slowest median over the fewest rows, × the margin."""
  cost = calibrate_row_cost(Script(time_of), rows=(64, 256), repeats=3, margin=1.5)
  slowest = max(time_of(64), time_of(256))
  assert not cost.resolved and cost.fixed_s == 0.0 and cost.scale == 1.5
  assert cost.row_s == cost.per_row_s == pytest.approx(1.5 * slowest / 64, rel=1e-12)
  assert cost.seconds(64) >= max(s for _, s in cost.measured)  # no 64-row call overruns


def noisy(row_s: float, seed: int = 0, fixed_s: float = 4e-3, noise_s: float = 3e-4):
  """A machine whose dispatch (``fixed_s``) jitters by ``noise_s`` (normal, seeded)."""
  rng = np.random.default_rng(seed)
  return lambda rows: fixed_s + rows * row_s + noise_s * rng.standard_normal()


@pytest.mark.parametrize('seed', range(20))
def test_a_cost_per_row_inside_the_noise_is_not_fitted(seed):
  """The small model that failed (4 ms ± 0.3 ms of dispatch at 10 and 42 rows, 1 µs a row):
  its fitted slope is noise whatever its sign, so the cost is all per row, never a slope
  fitted to noise (with these 20 seeds, 13 slopes came out positive)."""
  cost = calibrate_row_cost(noisy(1e-6, seed), rows=(10, 42), repeats=5, margin=1.5)
  assert not cost.resolved and cost.fixed_s == 0.0
  slowest = max(np.median([s for r, s in cost.measured if r == n]) for n in (10, 42))
  assert cost.row_s == pytest.approx(1.5 * slowest / 10, rel=1e-12)


#: One median of 5 normal timings of spread 0.3 ms errs by about √(π/2) × 0.3 / √5 = 0.17 ms.
MEDIAN_ERR = math.sqrt(math.pi / 2) * 3e-4 / math.sqrt(5)


@pytest.mark.parametrize('seed', range(20))
def test_a_cost_per_row_above_the_noise_is_fitted(seed):
  """0.4 ms a row rises 12.8 ms from 10 to 42 rows, 40 times the jitter, and makes 0.8 of the
  42-row step: fitted, within 4 standard errors of the two-point line (slope: √2 × MEDIAN_ERR
  / 32; intercept: √(42² + 10²) / 32 × MEDIAN_ERR), times the margin."""
  cost = calibrate_row_cost(noisy(4e-4, seed), rows=(10, 42), repeats=5, margin=1.5)
  assert cost.resolved
  assert cost.row_s == pytest.approx(6e-4, abs=1.5 * 4 * math.sqrt(2) * MEDIAN_ERR / 32)
  assert cost.fixed_s == pytest.approx(6e-3, abs=1.5 * 4 * math.hypot(42, 10) / 32 * MEDIAN_ERR)


@pytest.mark.parametrize(('row_s', 'resolved'), [(1e-4, False), (2e-4, True)])
def test_a_step_mostly_fixed_cost_is_taken_as_all_per_row(row_s, resolved):
  """Noiseless, so resolved at any slope; kept only where the rows make 2/3 of the largest
  size's step: 4 ms fixed against 42 × 0.1 ms = 4.2 ms (0.51) is not, 8.4 ms (0.68) is."""
  cost = calibrate_row_cost(lambda r: 4e-3 + r * row_s, rows=(10, 42), repeats=3, margin=1.5)
  assert cost.resolved is resolved
  if not resolved:
    assert (cost.row_s, cost.fixed_s) == (pytest.approx(1.5 * (4e-3 + 42 * row_s) / 10), 0.0)


def test_the_all_per_row_cost_covers_the_tail_of_a_stream():
  # Flat 10 ms calls, 4 of 20 rounds 3× slow: the 0.9 quantile of timing / slowest median is 3.
  script = Script(lambda r: 0.01, spikes={i: 3.0 for i in range(32, 40)})
  cost = calibrate_row_cost(script, rows=(64, 256), repeats=20, margin=1.25, tail=0.9)
  assert not cost.resolved and cost.scale == pytest.approx(3.0)
  assert cost.row_s == pytest.approx(3.0 * 0.01 / 64)


def test_a_fitted_cost_offers_its_all_per_row_cost_too():
  cost = calibrate_row_cost(Script(), rows=(64, 256), repeats=5, margin=1.25)
  assert cost.resolved and cost.per_row_s == pytest.approx(1.25 * line(256) / 64, rel=1e-12)
