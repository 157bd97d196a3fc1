"""experiments/plan.py and train.py --plan end to end: a plan printed, trained, and bad input."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT = 300
SMALL_WD = ['--set', 'model_args.rows=4096', '--set', 'model_args.dim=16',
            '--set', 'global_batch=64']


def _run(script, *args):
  command = [sys.executable, str(ROOT / 'experiments' / script), '--jax_num_cpu_devices=8', *args]
  return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


def _cluster(tmp_path, workers):
  path = tmp_path / 'cluster.json'
  path.write_text(json.dumps({'workers': workers, 'alpha_s': 1e-5, 'beta_gbit_s': 10}))
  return path


def test_plan_prints_a_table_and_the_plan_trains(tmp_path):
  """A cluster file's plan, priced analytically from timed sub-models (the profiled costs,
  plan.py's default, are docs/heterogeneous.md's command: `tests/test_readme.py`)."""
  cluster = _cluster(tmp_path, [{'devices': 8, 'speed': 2e10, 'memory': 4e9}])
  out = tmp_path / 'plan.json'
  result = _run('plan.py', '--config=wide_deep', *SMALL_WD, f'--cluster={cluster}',
                '--cost=analytic', '--profile=timed', f'--json={out}')
  assert result.returncode == 0, result.stderr
  for name in ('embedding', 'wide', 'tower', 'predicted step', 'baseline pure_dp'):
    assert name in result.stdout
  assert re.search(r'sub-models timed on cpu: a program call costs \d+ µs, paid once a step',
                   result.stdout), result.stdout
  plan = json.loads(out.read_text())
  assert set(plan['submodels']) == {'embedding', 'wide', 'tower'}
  trained = _run('train.py', '--config=wide_deep', *SMALL_WD, '--steps=2', f'--plan={out}',
                 f'--workdir={tmp_path / "run"}')
  assert trained.returncode == 0, trained.stderr
  assert "plan" in trained.stdout and 'step 2/2 | loss' in trained.stdout


@pytest.mark.parametrize('script, args, fragment', [
    ('plan.py', ['--cluster={cluster_neg}'], 'worker 0: "speed" must be a positive'),
    ('plan.py', ['--cluster={cluster_missing}'], 'worker 0'),
    ('plan.py', ['--plan={bad_name}'], "no sub-model named 'towr'"),
    ('plan.py', ['--plan={bad_degrees}'], 'data 2 × tensor 2 = 4, not the 8 devices'),
    ('train.py', ['--plan={bad_degrees}', '--steps=1'], 'data 2 × tensor 2 = 4, not the 8'),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, script, args, fragment):
  files = {
      'cluster_neg': _cluster(tmp_path, [{'devices': 8, 'speed': -1, 'memory': 4e9}]),
      'cluster_missing': tmp_path / 'missing.json',
      'bad_name': tmp_path / 'name.json', 'bad_degrees': tmp_path / 'degrees.json'}
  (tmp_path / 'missing.json').write_text(json.dumps({'workers': [{'devices': 8}]}))
  files['bad_name'].write_text(json.dumps(
      {'devices': 8, 'submodels': {'*': {'tensor': 8}, 'towr': {'tensor': 1}}}))
  files['bad_degrees'].write_text(json.dumps(
      {'devices': 8, 'submodels': {'*': {'data': 2, 'tensor': 2}}}))
  args = [a.format(**files) for a in args]
  if script == 'plan.py' and not any(a.startswith('--cluster') for a in args):
    args.append('--cluster=' + str(_cluster(tmp_path, [{'devices': 8, 'speed': 2e10,
                                                        'memory': 4e9}])))
  result = _run(script, '--config=wide_deep', *SMALL_WD, f'--workdir={tmp_path / "w"}'
                if script == 'train.py' else '--batch=64', *args)
  assert result.returncode == 2, (result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and fragment in lines[0], result.stderr
