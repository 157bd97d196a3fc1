"""The planner plans the devices its process sees, and a count that does not fit names the flag
that sets it (issue 44, item 4).

A new user's ``hetjax-plan --config=digits.py`` planned "on 8 devices" on a machine with one CPU
device, and ``--worker_devices=1,1,1,1`` then failed with "… must add up to the 8 devices
measured", without naming ``--jax_num_cpu_devices``. Each case is ``experiments/plan.py`` in a
process of its own (the CPU device count is fixed when JAX starts), all four at once.
"""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from hetjax import ConfigError, configs
from hetjax.planner import Plan
from tests.conftest import require_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT = 120
SMALL = ['--config=mlp', '--set', 'model_args.hidden=16', '--set', 'model_args.width=8',
         '--cost=analytic', '--profile=analysed']
CASES = {
    'default': [],
    'workers': ['--worker_devices=1,1,1,1'],
    'both': ['--jax_num_cpu_devices=8', '--worker_devices=1,1,1,1'],
    'plan': [f'--plan={configs.PLANS / "hybrid.json"}'],
}


def _plan_all() -> dict[str, subprocess.CompletedProcess]:
  """Every case of `CASES` run at once; no device count comes from this test's environment."""
  env = {k: v for k, v in os.environ.items() if k != 'JAX_NUM_CPU_DEVICES'}
  running = {
      name: subprocess.Popen([sys.executable, str(ROOT / 'experiments' / 'plan.py'), *SMALL,
                              *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
      for name, args in CASES.items()}
  done = {}
  for name, process in running.items():
    out, err = process.communicate(timeout=TIMEOUT)
    done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
  return done


def test_the_planner_counts_the_devices_it_sees_and_names_the_flags():
  results = _plan_all()
  default = results['default']
  assert default.returncode == 0, default.stderr
  assert default.stdout.startswith('mlp on 1 devices over 1 worker(s)'), default.stdout
  assert ('planned on the 1 cpu device(s) this process sees: --jax_num_cpu_devices=8 (or '
          '--worker_devices=2,2,2,2) plans on 8 virtual CPU devices\n') in default.stdout
  # --worker_devices alone: as many CPU devices as it adds up to.
  workers = results['workers']
  assert workers.returncode == 0, workers.stderr
  assert workers.stdout.startswith('mlp on 4 devices over 4 worker(s)'), workers.stdout
  # Both given and not agreeing: one line naming both ways to fix it, exit 2.
  both = results['both']
  assert (both.returncode, both.stderr) == (2, (
      'plan.py: error: --worker_devices 1,1,1,1 adds up to 4 devices, not the 8 cpu device(s) '
      'this process sees: give --jax_num_cpu_devices=4, or counts adding up to 8\n'))
  plan = results['plan']
  assert (plan.returncode, plan.stderr) == (2, (
      f'plan.py: error: --plan {configs.PLANS / "hybrid.json"} is for 8 devices, not the 1 cpu '
      'device(s) this process sees: use --jax_num_cpu_devices=8\n'))


def test_training_a_plan_for_another_count_names_the_flag():
  """The next step of the user's case: a plan for 4 devices trained on a process that has
  another count; the hint only where the devices are all of this one process's."""
  devices = require_devices(8)
  plan = Plan.from_json({'name': 'four', 'devices': 4,
                         'submodels': {'*': {'data': 4, 'tensor': 1}}})
  assert plan.count_error(jax.devices()) == (
      "plan 'four' is for 4 devices, 8 are available (on CPU: --jax_num_cpu_devices=4)")
  assert plan.count_error(devices[:2]) == "plan 'four' is for 4 devices, 2 are available"
  with pytest.raises(ConfigError) as err:
    plan.mesh()
  assert str(err.value) == plan.count_error(jax.devices())
