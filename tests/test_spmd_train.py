"""Mode spmd across launched workers through the runner (`hetjax.run.train`, train.py): one
jitted step over the mesh of every worker's devices, chosen by ``auto`` for a homogeneous job,
equal to the same mesh on one process (FSDP, and a hybrid mesh whose 'data' axis spans the
workers)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from hetjax import run as run_lib
from tests.conftest import require_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / 'experiments' / 'train.py')
SETS = ['model_args.hidden=32', 'model_args.width=16', 'global_batch=64', 'optimizer=momentum',
        'learning_rate=0.05', 'log_every=1']
ARGS = ['--config=mlp', *[arg for s in SETS for arg in ('--set', s)], '--steps=4']


def _losses(workdir: pathlib.Path) -> list[float]:
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [r['loss'] for r in rows]


def _one_process(workdir, strategy, mesh):
  """The run of ``ARGS`` on this process's 8 devices (what train.py runs after parsing them):
  `hetjax.run.train` here, not a subprocess that would start JAX again."""
  require_devices(8)
  config = run_lib.override(run_lib.load_config('mlp'), [
      *SETS, 'steps=4', f'strategy={strategy}', f'mesh={mesh}',
      'compilation_cache=False'])  # the test process's JAX config stays as it is
  assert run_lib.train(config, workdir)['final_step'] == 4
  return _losses(workdir)


def _launched(workdir, workers, *args):
  result = subprocess.run(
      [sys.executable, '-m', 'hetjax.launch', '--workers', str(workers), '--devices-per-worker',
       str(8 // workers), '--timeout', '200', '--', sys.executable, TRAIN, *ARGS, *args,
       f'--workdir={workdir}'], cwd=ROOT, capture_output=True, text=True, timeout=260)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result.stdout


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_spmd_over_launched_workers_equals_one_process(tmp_path):
  # FSDP over 2 x 4 devices and a hybrid mesh whose 'model' spans processes are checked against
  # one device in tests/test_spmd_multiprocess.py (the library); this is the runner's path.
  workers, strategy, mesh = 2, 'hybrid', '4x2'
  args = [f'--strategy={strategy}', f'--mesh={mesh}']
  reference = _one_process(tmp_path / 'one', strategy, mesh)
  stdout = _launched(tmp_path / 'job', workers, *args)  # mode auto: a homogeneous job
  assert f'spmd, {strategy} on mesh {mesh} (8 cpu devices of {workers} workers)' in stdout
  np.testing.assert_allclose(_losses(tmp_path / 'job'), reference, rtol=1e-5)
  run = json.loads((tmp_path / 'job' / 'run.json').read_text())
  assert (run['mode'], run['workers']) == ('spmd', workers)
  summary = json.loads((tmp_path / 'job' / 'summary.json').read_text())
  assert summary['checkpoint_steps'] == [4]
