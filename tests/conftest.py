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


def pytest_collection_modifyitems(config, items):
  """Under pytest-xdist (`make test` runs two test processes), the tests that launch several
  worker processes run one at a time in one group: each already keeps both cores busy, and two
  launches at once would only slow both. The in-process tests share the other test process."""
  if not config.pluginmanager.hasplugin('xdist'):
    return
  for item in items:
    if item.get_closest_marker('multiprocess'):
      item.add_marker(pytest.mark.xdist_group('launches'))
