"""The parameter server as launched processes: ``launch --workers N --servers K``."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from hetjax.runtime import launch_local
from tests.test_ps import _reference

ROOT = pathlib.Path(__file__).resolve().parents[1]
JOB = str(ROOT / 'tests' / 'workers' / 'ps_job.py')
pytestmark = [pytest.mark.timeout(240), pytest.mark.multiprocess]


def _launch(tmp_path, spec, steps, workers=2, servers=1, die=''):
  args = [sys.executable, JOB, str(tmp_path), spec, str(steps)] + ([die] if die else [])
  with open(tmp_path / 'log.txt', 'w') as log:
    return launch_local(args, workers, servers=servers, timeout=180, init_timeout=60,
                        stdout=log)


@pytest.fixture(scope='module')
def bsp_job(tmp_path_factory):
  """One launch for two cases: BSP on 2 workers and 2 servers for 3 steps, the servers
  checkpointing with orbax every 2 versions (``die='checkpoint'``)."""
  out = tmp_path_factory.mktemp('bsp')
  result = _launch(out, 'bsp', steps=3, workers=2, servers=2, die='checkpoint')
  assert result.returncode == 0, (out / 'log.txt').read_text()[-2000:]
  return out


def test_bsp_over_processes_equals_one_device(bsp_job):
  tmp_path = bsp_job
  got = np.load(tmp_path / 'params.npz')
  expected = [np.asarray(x) for x in jax.tree.leaves(_reference(3))]
  for i, leaf in enumerate(expected):
    np.testing.assert_allclose(got[f'arr_{i}'], leaf, rtol=2e-5, atol=2e-6)
  reports = [json.loads((tmp_path / f'server-{s}.json').read_text()) for s in range(2)]
  assert [r['version'] for r in reports] == [3, 3]
  assert '[s1] server 1 done' in (tmp_path / 'log.txt').read_text()   # servers' lines: [sJ]


def test_a_dead_server_is_named_and_the_job_ends(tmp_path):
  result = _launch(tmp_path, 'asp', steps=50, workers=2, servers=1, die='server')
  assert result.returncode == 3
  assert result.cause == 'server 0 exited with status 3'
  assert result.failed_worker == 2


def test_servers_checkpoint_with_orbax(bsp_job):
  # BSP: one version a step, 3 in all; saved every 2 versions and at the end, 2 kept.
  for server in ('server-0', 'server-1'):
    saved = sorted(int(p.name) for p in (bsp_job / 'ckpt' / server).iterdir()
                   if p.name.isdigit())
    assert saved == [2, 3], (server, saved)


@pytest.mark.parametrize('flags, error', [
    (['--network', 'link:1'], "launch: error: bad links 'link:1'; expected none or "
     'link:LATENCY_MS:BANDWIDTH_MB_S[:exchange=ring|server] (one value, or one per worker, '
     'each)'),
    (['--network', 'link:1:1,2,3'], 'launch: error: link bandwidth has 3 values for 2 workers; '
     'give 2 or 1'),
    (['--servers', '-1'], 'launch: error: servers must be between 0 and 1024, got -1'),
])
def test_launch_cli_rejects_bad_servers_and_networks(flags, error):
  proc = subprocess.run([sys.executable, '-m', 'hetjax.launch', '--workers', '2', *flags, '--',
                         'true'], capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [error]


def test_train_py_mode_ps_resumes_from_the_servers_checkpoints(tmp_path):
  """``launch --servers 1 -- train.py``: mode ps by itself; --resume continues the metrics and
  the servers' versions from their checkpoints."""
  def run(steps, *extra):
    command = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp',
               '--set', 'optimizer=sgd', '--set', 'learning_rate=0.3', '--set',
               'global_batch=32', '--set', 'checkpoint_every=2', '--set', 'ps=asp,eager',
               f'--steps={steps}', f'--workdir={tmp_path / "run"}', *extra]
    with open(tmp_path / 'log.txt', 'a') as log:
      return launch_local(command, 2, servers=1, network='link:1:100', timeout=180,
                          init_timeout=60, stdout=log)

  assert run(4).returncode == 0, (tmp_path / 'log.txt').read_text()[-3000:]
  assert run(8, '--resume').returncode == 0, (tmp_path / 'log.txt').read_text()[-3000:]
  rows = [json.loads(x) for x in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows] == list(range(1, 9))
  server = json.loads((tmp_path / 'run' / 'server-0.json').read_text())
  assert server['version'] == 16 and server['refused'] == {'shape': 0, 'version': 0,
                                                           'staleness': 0}
  run_info = json.loads((tmp_path / 'run' / 'run.json').read_text())
  assert run_info['ps'] == 'asp,eager' and run_info['network'] == 'link:1:100'
