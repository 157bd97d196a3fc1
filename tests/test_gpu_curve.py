"""gpu_check's LB-BSP curve part: its fit, shares and table from hand-made ladders (its quick
run's rows are checked in ``test_gpu_check.py``)."""


import jax
import numpy as np
import pytest

from experiments import _gpu_curve


def _ladder(sizes, times, stopped=None, stopped_at=None):
  return {'batch_sizes': list(sizes), 'step_s': list(times), 'reps': [3] * len(sizes),
          'first_step_s': [1.0] * len(sizes), 'stopped': stopped, 'stopped_at': stopped_at}


def test_exact_curve_fits_and_splits_by_finish_time():
  # The docstring's example: max(1 ms, 0.5 ms + 10 µs·x) beside a device twice as slow. The
  # shares solve 0.5 + 0.01·x = 2·(0.5 + 0.01·(512 − x)) ms: x = 358, 4.08 ms each.
  sizes = [2**k for k in range(10)]
  r = _gpu_curve.curve_row('m', {}, _ladder(sizes, [max(1e-3, 5e-4 + 1e-5 * x) for x in sizes]))
  assert (r['fit_floor_s'], r['fit_intercept_s'], r['fit_slope_s']) == pytest.approx(
      (1e-3, 5e-4, 1e-5))
  assert r['fit_max_rel_err'] < 1e-9
  np.testing.assert_allclose(r['shares'], [358, 154])
  np.testing.assert_allclose(r['share_s'], [4.08e-3, 4.08e-3])
  assert r['proportional_finish_s'] == pytest.approx(2 * (5e-4 + 1e-5 * 512 / 3))
  assert r['speedup_vs_proportional'] > 1


def test_flat_curve_keeps_the_slow_device_at_its_minimum():
  sizes = [1, 2, 4, 8, 16]
  r = _gpu_curve.curve_row('m', {}, _ladder(sizes, [2e-3] * 5))
  np.testing.assert_allclose(r['shares'], [15, 1])
  assert r['finish_s'] == pytest.approx(4e-3)  # the slow device's doubled floor


def test_markdown_marks_out_of_memory_and_the_goal():
  fits = _gpu_curve.curve_row('gpt', {}, _ladder([1, 2, 4], [1e-3, 2e-3, 4e-3],
                                                 'out of memory', 8))
  rows = [{**fits, 'platform': 'gpu', 'device': 'H100', 'quick': False}]
  lines = _gpu_curve.markdown(rows)
  assert '| gpt | 1 | 2 | 4 | OOM |' in lines
  assert lines[-1] == 'goal: fit within 10% of measured: met (max 0.0%)'


def test_out_of_memory_is_told_apart():
  assert _gpu_curve.is_out_of_memory(jax.errors.JaxRuntimeError(
      'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.'))
  assert not _gpu_curve.is_out_of_memory(jax.errors.JaxRuntimeError('INTERNAL: failed'))
