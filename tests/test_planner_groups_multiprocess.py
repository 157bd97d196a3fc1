"""Grouped plans across launched workers train exactly like one device.

Each case launches real workers (`tests/workers/plan_groups.py`, always with a timeout) that
compile one plan into stages on its groups of workers — a stage spanning several processes, a
stage on a subset, workers of different device counts — train `STEPS` steps and write their
stages' parameters. The reference is the single-device step of `tests/test_planner_groups.py`.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest
from flax import traverse_util

from hetjax.runtime import launch_local
from tests.test_planner_groups import _reference
from tests.workers.common import MODELS, STEPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 180
CASES = {  # name: (model, devices per worker, plan, micro-batches)
    # 4 workers x 2 devices: the table and the wide part over all 8 (one stage spanning the
    # four processes), the tower tensor-parallel on workers 0 and 1.
    '4w-wide_deep-2-groups': ('wide_deep', 2, {
        'devices': 8, 'workers': 4,
        'submodels': {'embedding': {'tensor': 8}, 'wide': {'tensor': 8},
                      'tower': {'tensor': 2, 'group': [0, 1]}}}, 2),
    # Workers of 2, 1 and 1 devices: up data-parallel over all 4, down tensor-parallel on the
    # 2-device worker, the head on the two 1-device workers.
    '3w-unequal-mlp-3-groups': ('mlp', (2, 1, 1), {
        'devices': 4, 'workers': 3, 'worker_devices': [2, 1, 1],
        'submodels': {'up': {'tensor': 1}, 'down': {'tensor': 2, 'group': [0]},
                      'head': {'tensor': 1, 'group': [1, 2]}}}, 2),
}


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
@pytest.mark.parametrize('case', sorted(CASES))
def test_grouped_plan_across_processes_equals_one_device(tmp_path, case):
  model, devices, plan, micro = CASES[case]
  workers = plan['workers']
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'plan_groups.py'), str(tmp_path),
             model, json.dumps({'name': case, **plan}), str(micro)]
  result = launch_local(command, workers=workers, devices_per_worker=devices,
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  outs = []
  for w in range(workers):
    with np.load(tmp_path / f'w{w}.npz') as arrays:
      outs.append(dict(arrays))
  _, _, ref_losses, ref_params = _reference_of(model)
  np.testing.assert_allclose(outs[0]['losses'], ref_losses, rtol=1e-5)
  got = {}
  for out in outs:
    got |= {k.removeprefix('params/'): v for k, v in out.items() if k.startswith('params/')}
  want = {'/'.join(map(str, k)): np.asarray(v)
          for k, v in traverse_util.flatten_dict(ref_params).items()}
  assert got.keys() == want.keys()
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
  # Every worker ran the stages of the groups it is in, and only those.
  assert all(len(out['stages']) >= 1 for out in outs)


def _reference_of(model):
  return _reference(model, MODELS[model], STEPS)
