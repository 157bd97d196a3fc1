"""Test setup: 8 virtual CPU devices, set once before any JAX backend starts, and programs
compiled for the suite's speed (`FAST_COMPILE`)."""

import os
import shutil
import subprocess
import sys
import tempfile

import jax
import pytest

from tests import durations

NUM_DEVICES = 8
jax.config.update('jax_num_cpu_devices', NUM_DEVICES)

#: The suite's XLA setting, for this process and every process it starts (the environment is
#: inherited), made for compile time: almost all of a test's time is XLA:CPU compiling programs
#: that then run a few steps (a transformer's step: 6.6 s to compile at the default level, 1.6 s
#: at level 0, 0.05 s to run). Two flags, each a code generator's setting, not a change to the
#: program: LLVM's backend optimisation off, and XLA:CPU's loop fusions emitted by its older LLVM
#: IR emitters instead of the MLIR fusion emitters (`FAST_EMITTERS`: the same fusions, compiled
#: in 70% of the CPU time; 3 test files: 100 -> 70 CPU-seconds). XLA's HLO passes (fusion,
#: layout, SPMD partitioning) are unchanged, so every exactness test still compares the same
#: programs, both sides built the same way. Benchmarks, the demo and user runs keep XLA's
#: default. ``HETJAX_TEST_XLA_DEFAULT=1`` runs the suite at the default.
FAST_COMPILE = '--xla_backend_optimization_level=0'
FAST_EMITTERS = '--xla_cpu_use_fusion_emitters=false'
XLA_DEFAULT = 'HETJAX_TEST_XLA_DEFAULT'
_SUITE_FLAGS = (FAST_COMPILE, FAST_EMITTERS)
_CHECKED = 'HETJAX_TEST_XLA_FLAGS_CHECKED'  # set once the flags were tried (in the first process)


def _accepted(flags: str) -> bool:
  """Whether this jaxlib's XLA runs a program under ``XLA_FLAGS=flags``: an XLA that no longer
  knows a flag aborts the process, so a flag a newer jaxlib dropped is left out, not fatal."""
  probe = subprocess.run([sys.executable, '-c', 'import jax; jax.jit(lambda x: x + 1)(1.0)'],
                         env={**os.environ, 'XLA_FLAGS': flags, 'JAX_PLATFORMS': 'cpu'},
                         capture_output=True, timeout=120)
  return probe.returncode == 0


if not os.environ.get(XLA_DEFAULT) and not os.environ.get(_CHECKED):
  _flags = os.environ.get('XLA_FLAGS', '').split()
  for _flag in _SUITE_FLAGS:
    if _flag not in _flags and (_flag == FAST_COMPILE or _accepted(' '.join([*_flags, _flag]))):
      _flags.append(_flag)
  os.environ['XLA_FLAGS'] = ' '.join(_flags)
  os.environ[_CHECKED] = '1'

#: One persistent compilation cache for the whole run, empty at its start (as on a fresh
#: clone), shared by the test processes and every process they start: a program compiled once
#: (the same model, shapes and mesh in another test) is read back, not compiled again. The run
#: that made it (pytest-xdist's controller, or a plain pytest) removes it at its end; the suite
#: never reads or writes ``~/.cache/hetjax``. In this process it is on from the start; a
#: launched ``train.py`` uses it unless its config turns the cache off
#: (`hetjax.runtime.enable_compilation_cache` reads ``HETJAX_COMPILATION_CACHE``).
SUITE_CACHE = 'HETJAX_COMPILATION_CACHE'
_OWN_CACHE = SUITE_CACHE not in os.environ
if _OWN_CACHE:
  os.environ[SUITE_CACHE] = tempfile.mkdtemp(prefix='hetjax-suite-cache-')
jax.config.update('jax_compilation_cache_dir', os.environ[SUITE_CACHE])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


def pytest_unconfigure(config):
  if _OWN_CACHE and not os.environ.get('PYTEST_XDIST_WORKER'):
    shutil.rmtree(os.environ[SUITE_CACHE], ignore_errors=True)


def default_xla_env() -> dict[str, str]:
  """This process's environment with XLA at its default (without the suite's flags): for a
  process that should compile as a user's does."""
  flags = ' '.join(f for f in os.environ.get('XLA_FLAGS', '').split() if f not in _SUITE_FLAGS)
  return {**os.environ, XLA_DEFAULT: '1', 'XLA_FLAGS': flags}


def at_default_xla(request) -> bool:
  """For a test that times compiled programs (what it decides follows their speed, which the
  suite's flags change), or that asserts two different programs compute the same bits (XLA's
  code generator decides their rounding: a rematerialised gradient equals the plain one to the
  bit with XLA's own fusion emitters, not with `FAST_EMITTERS`): True in a process at XLA's
  default, where the test's body runs; else runs this one test again in a fresh pytest at the
  default, fails with its output unless it passed, and returns False."""
  if os.environ.get(XLA_DEFAULT):
    return True
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'no:xdist',
       request.node.nodeid.split('@')[0]],
      cwd=request.config.rootpath, env=default_xla_env(), capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stdout[-3000:]
  assert result.stdout.splitlines()[-1].startswith('1 passed'), result.stdout[-3000:]
  return False


class MetricsClock:
  """Stands in for `time` in hetjax.train._metrics: ``perf_counter`` reads ``now``, ``time``
  (the Unix clock, read once at the logger's start) `UNIX_START` + ``now``."""

  UNIX_START = 1_800_000_000.0

  def __init__(self):
    self.now = 0.0

  def perf_counter(self):
    return self.now

  def time(self):
    return self.UNIX_START + self.now


@pytest.fixture
def clock(monkeypatch) -> MetricsClock:
  """A `MetricsClock` in place of `hetjax.train._metrics`'s ``time``: a test moves ``now``."""
  from hetjax.train import _metrics

  fake = MetricsClock()
  monkeypatch.setattr(_metrics, 'time', fake)
  return fake


def require_devices(n: int) -> list[jax.Device]:
  """The first ``n`` devices, or skip the test when fewer exist (e.g. on a real 1-GPU host)."""
  devices = jax.devices()
  if len(devices) < n:
    pytest.skip(f'needs {n} devices, found {len(devices)}')
  return devices[:n]


# First, before pytest-xdist's own hook turns the group marks into node ids (`@group`): marks added
# after it are ignored by ``--dist loadgroup``.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Under pytest-xdist (`make test` runs three test processes), the tests that launch several
  worker processes run one at a time in one group: each already keeps both cores busy, and two
  launches at once would only slow both. The in-process tests share the other test process.
  In-process tests that share a module-scoped fixture run in one process too, so that the
  fixture (a compiled model, a saved run) is built once, not once per test process."""
  if not config.pluginmanager.hasplugin('xdist'):
    return
  units = {}
  for item in items:
    if item.get_closest_marker('multiprocess'):
      units[item.nodeid] = 'launches'
    elif _uses_module_fixture(item):
      units[item.nodeid] = item.module.__name__
    else:
      continue
    item.add_marker(pytest.mark.xdist_group(units[item.nodeid]))
  _longest_first(items, units)


def _longest_first(items, units: dict[str, str]) -> None:
  """Orders ``items`` by the expected seconds of their unit of work (a group, or a test alone),
  longest first, from an earlier run's durations (`tests/durations.py`): with
  ``--no-loadscope-reorder`` (`make test`) pytest-xdist hands the units out in this order, so
  the launch group starts at once and no long test starts last."""
  seconds = durations.load()
  total: dict[str, float] = {}
  for item in items:
    unit = units.get(item.nodeid, item.nodeid)
    total[unit] = total.get(unit, 0.0) + seconds.get(item.nodeid, durations.DEFAULT_S)
  order = {item.nodeid: i for i, item in enumerate(items)}
  items.sort(key=lambda item: (-total[units.get(item.nodeid, item.nodeid)], order[item.nodeid]))


def _uses_module_fixture(item) -> bool:
  info = getattr(item, '_fixtureinfo', None)  # pytest's own record of the test's fixtures
  defs = getattr(info, 'name2fixturedefs', {})
  return any(d.scope == 'module' for name in item.fixturenames for d in defs.get(name, ()))


def pytest_configure(config):
  """Refuses ``--dist loadgroup`` under a pytest whose node ids pytest-xdist cannot tag with
  their group (9.2 on; pytest-dev/pytest-xdist#1386): the groups would be dropped silently and
  the launches run two at a time, slowly and with timing-dependent flakes."""
  version = tuple(int(p) for p in pytest.__version__.split('.')[:2] if p.isdigit())
  if config.getoption('dist', None) == 'loadgroup' and version >= (9, 2):
    raise pytest.UsageError(f'pytest {pytest.__version__} drops pytest-xdist\'s test groups '
                            '(pytest-dev/pytest-xdist#1386): install pytest<9.2 (make does)')
