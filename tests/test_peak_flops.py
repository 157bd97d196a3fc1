"""Peak FLOP/s of one device: measured by a timed matmul, or declared."""

import jax
import pytest

from hetjax import ConfigError, runtime
from hetjax.runtime import _peak_flops


def test_a_measured_peak_is_positive_and_quick():
  # n = 256 keeps it well under a second; the default on CPU is 1024 (0.3 s on 2 cores).
  flops = runtime.measure_peak_flops('float32', jax.devices()[0], size=256, repeats=2)
  assert 1e8 < flops < 1e14  # a CPU core does at least 0.1 GFLOP/s; no CPU does 100 TFLOP/s
  assert _peak_flops.SIZES['cpu'] == 1024 and _peak_flops.SIZES['gpu'] == 8192


def test_accelerators_chain_products_in_one_program():
  # An H200 timed a lone 4096² bfloat16 product at 292 TFLOP/s, a third of its speed: a call's
  # dispatch and wait. A CPU's product is long enough alone.
  from hetjax.runtime import _calibrate
  assert _calibrate.chain_length(jax.devices()[0]) == 1
  assert _calibrate.ACCELERATOR_CHAIN >= 8
  stacked = jax.numpy.ones((2, 64, 64), jax.numpy.bfloat16)
  # Three 64² products: microseconds; the bound is a loaded machine's scheduling, and it
  # catches a time in the wrong unit (milliseconds read as seconds).
  assert 0 < _calibrate.matmul_seconds(stacked, chain=3, repeats=1) < 1.0


def test_the_default_size_on_cpu():
  # n = 1024: 2.1 GFLOP a call; 0.26-0.37 s in all on a 2-core VM, 44-67 GFLOP/s.
  assert runtime.measure_peak_flops() > 1e8


def test_bfloat16_is_measured_in_bfloat16():
  assert runtime.measure_peak_flops('bfloat16', size=128, repeats=1) > 0


def test_a_declared_peak_is_taken_as_it_is():
  assert runtime.peak_flops(989e12, 'bfloat16') == (989e12, 'declared')
  assert runtime.peak_flops(5, 'float32') == (5.0, 'declared')


def test_no_declared_peak_is_measured(monkeypatch):
  monkeypatch.setattr(_peak_flops, 'measure_peak_flops', lambda dtype, device: 7.0e10)
  assert runtime.peak_flops(None, 'float32') == (7.0e10, 'measured')


@pytest.mark.parametrize('declared', [0, -1.0, float('nan'), float('inf'), 'fast', True])
def test_a_bad_declared_peak_is_one_config_error(declared):
  with pytest.raises(ConfigError, match=r'^declared peak FLOP/s must be a positive number'):
    runtime.peak_flops(declared)


@pytest.mark.parametrize('dtype', ['int32', 'bool', 'nonsense'])
def test_a_dtype_that_is_not_floating_is_one_config_error(dtype):
  with pytest.raises(ConfigError, match='measured in a floating-point dtype'):
    runtime.measure_peak_flops(dtype)


def test_a_size_that_is_not_positive_is_one_config_error():
  with pytest.raises(ConfigError, match='size and repeats must be positive'):
    runtime.measure_peak_flops(size=0)


def test_seconds_per_call_times_back_to_back_calls_after_one_untimed():
  from hetjax.runtime import seconds_per_call

  calls = []

  def fn(x):
    calls.append(x)
    return jax.numpy.asarray(x)

  seconds = seconds_per_call(fn, (3.0,), rounds=4, calls=2)
  # An identity call takes microseconds: a second of bound is scheduling on a loaded machine
  # and catches a total (8 calls) or a time in the wrong unit passed off as one call's.
  assert len(calls) == 1 + 4 * 2 and 0 < seconds < 1
