"""Test setup: 8 virtual CPU devices, set once before any JAX backend starts."""

import jax
import pytest

NUM_DEVICES = 8
jax.config.update('jax_num_cpu_devices', NUM_DEVICES)


def require_devices(n: int) -> list[jax.Device]:
  """The first ``n`` devices, or skip the test when fewer exist (e.g. on a real 1-GPU host)."""
  devices = jax.devices()
  if len(devices) < n:
    pytest.skip(f'needs {n} devices, found {len(devices)}')
  return devices[:n]
