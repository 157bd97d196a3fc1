"""train.py with a grouped plan under the launcher: stages on the plan's groups of workers, each
stage checkpointed by its processes, a run resumed; the losses are the one-process run's."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from hetjax.runtime import launch_local

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT = 240
# up data-parallel over both workers' 4 devices, down tensor-parallel on worker 0, the head on
# worker 1: three stages, two of them on one process each and one spanning both.
PLAN = {'name': 'mlp-groups', 'devices': 4, 'workers': 2,
        'submodels': {'up': {'tensor': 1}, 'down': {'tensor': 2, 'group': [0]},
                      'head': {'tensor': 1, 'group': [1]}}}
ARGS = ['--config=mlp', '--set', 'optimizer=momentum', '--set', 'learning_rate=0.05',
        '--set', 'checkpoint_every=2', '--set', 'log_every=1']


def _losses(workdir: pathlib.Path) -> list[float]:
  return [json.loads(line)['loss'] for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.multiprocess
@pytest.mark.timeout(3 * TIMEOUT)
def test_a_grouped_plan_trains_checkpoints_and_resumes_across_workers(tmp_path):
  plan = tmp_path / 'plan.json'
  plan.write_text(json.dumps(PLAN))
  train = [sys.executable, str(ROOT / 'experiments' / 'train.py'), *ARGS, f'--plan={plan}']
  reference = subprocess.run([*train, '--jax_num_cpu_devices=4', '--steps=6',
                              f'--workdir={tmp_path / "one"}'], cwd=ROOT, capture_output=True,
                             text=True, timeout=TIMEOUT)
  assert reference.returncode == 0, reference.stderr
  assert '3 stages (up on 4, down on 2, head on 2 cpu devices)' in reference.stdout
  run = tmp_path / 'launched'
  for steps, extra in ((4, ['--overwrite']), (6, ['--resume'])):
    result = launch_local([*train, f'--steps={steps}', f'--workdir={run}', *extra], workers=2,
                          devices_per_worker=2, timeout=TIMEOUT, init_timeout=60)
    assert result.returncode == 0, result
  steps = sorted(int(p.name) for p in (run / 'checkpoints').iterdir() if p.name.isdecimal())
  assert steps == [2, 4, 6]
  assert sorted(p.name for p in (run / 'checkpoints' / '6' / 'state').glob('*.npz')) == [
      'stage-0.npz', 'stage-1.npz', 'stage-2.npz']
  # Steps 1–4 from the first segment, 5–6 from the resumed one: the one-process run's losses.
  np.testing.assert_allclose(_losses(run), _losses(tmp_path / 'one'), rtol=1e-5)
