"""experiments/schmp.py end to end: the apps run from absl, bad input is one line with exit 2,
and a resumed run equals the uninterrupted one."""

import json
import math
import subprocess
import sys

import pytest

from tests.test_train_cli import ROOT, TIMEOUT

SCHMP = ['schmp.py', '--jax_num_cpu_devices=8']

BAD_INPUT = [
    ([], ['--app is required: one of lasso, logreg, mf, lda, svm, cdmf']),
    (['--app=sgd'], ["unknown SchMP app 'sgd'; choose one of: lasso, logreg, mf, lda, svm, cdmf"]),
    (['--app=svm', '--set', 'model_args.c=0'], ["app 'svm': c must be > 0, got 0"]),
    (['--app=svm', '--set', "model_args.data='breast_cancer'"],
     ["app 'svm': 569 rows do not divide over 8 devices", '--set model_args.pad_rows=True']),
    (['--app=cdmf', '--set', 'model_args.inner=0'], ['CD-MF needs inner >= 1']),
    (['--app=lasso', '--lam=0'], ["app 'lasso': lam must be > 0, got 0.0"]),
    (['--app=logreg', '--lam=-1'], ["app 'logreg': lam must be > 0, got -1.0"]),
    (['--app=lasso', '--schedule_size=0'], ['schedule_size must be >= 1']),
    (['--app=lasso', '--scheduler=random'], ["unknown scheduler 'random'"]),
    (['--app=lasso', '--set', 'model_args.rows=1001'], ['1001 rows do not divide over 8 devices']),
    (['--app=lda', '--staleness=-1'], ['staleness must be >= 0']),
    (['--app=mf', '--set', 'model_args.items=4'], ['4 items cannot be split']),
    (['--app=lasso', '--config=mlp'], ['give --app, not --config']),
    (['--app=lasso', '--set', 'mode=spmd'], ["'lasso' is a SchMP app: it runs in mode schmp"]),
]


@pytest.fixture(scope='module')
def bad_input_results(tmp_path_factory):
  """Every `BAD_INPUT` command line, each in a forked child of one process
  (`tests/workers/cli_cases.py`), each with a run directory of its own."""
  scratch = tmp_path_factory.mktemp('schmp-bad-input')
  cases = [[*SCHMP, *args, f'--workdir={scratch / str(i)}'] for i, (args, _) in
           enumerate(BAD_INPUT)]
  (scratch / 'cases.json').write_text(json.dumps(cases))
  subprocess.run([sys.executable, str(ROOT / 'tests' / 'workers' / 'cli_cases.py'),
                  str(scratch / 'cases.json'), str(scratch / 'results.json')],
                 cwd=ROOT, check=True, timeout=TIMEOUT)
  return json.loads((scratch / 'results.json').read_text())


@pytest.mark.parametrize('case', range(len(BAD_INPUT)), ids=lambda i: ' '.join(BAD_INPUT[i][0]))
def test_bad_input_is_one_line_and_exit_2(bad_input_results, case):
  result, fragments = bad_input_results[case], BAD_INPUT[case][1]
  assert result['returncode'] == 2, result
  lines = result['stderr'].strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('schmp.py: error: '), result['stderr']
  for fragment in fragments:
    assert fragment in lines[0]


def _rows(workdir):
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


RESUMED_APPS = ('lasso', 'lda', 'svm', 'cdmf')


@pytest.fixture(scope='module')
def resumed_runs(tmp_path_factory):
  """Per app of `RESUMED_APPS`, ``(straight, parts, results)``: 12 rounds straight, and 6 rounds
  then a ``--resume`` to 12 in another directory; every run a child of its own, forked in order
  from one import (`tests/workers/cli_cases.py`: the real entry point, a fresh JAX backend per
  child, so the resumed run starts from the files alone)."""
  scratch = tmp_path_factory.mktemp('schmp-resumed')
  cases, dirs = [], {}
  for app in RESUMED_APPS:
    small = {'lasso': ['--set', 'model_args.features=256', '--set', 'model_args.group_size=64'],
             'lda': ['--set', 'model_args.documents=64', '--set', 'model_args.vocabulary=300'],
             'svm': ['--set', 'model_args.rows=256'],
             'cdmf': ['--set', 'model_args.rank=2', '--set', 'model_args.users=200', '--set',
                      'model_args.items=100', '--set', 'model_args.ratings=3000']}[app]
    common = ['schmp.py', '--jax_num_cpu_devices=4', f'--app={app}', *small, '--set',
              'objective_every=2', '--set', 'checkpoint_every=6']
    straight, parts = scratch / app / 'straight', scratch / app / 'parts'
    dirs[app] = straight, parts
    cases += [[*common, *args] for args in (
        [f'--workdir={straight}', '--steps=12'], [f'--workdir={parts}', '--steps=6'],
        [f'--workdir={parts}', '--steps=12', '--resume'])]
  (scratch / 'cases.json').write_text(json.dumps(cases))
  subprocess.run([sys.executable, str(ROOT / 'tests' / 'workers' / 'cli_cases.py'),
                  str(scratch / 'cases.json'), str(scratch / 'results.json')],
                 cwd=ROOT, check=True, timeout=TIMEOUT)
  results = json.loads((scratch / 'results.json').read_text())
  return {app: (*dirs[app], results[3 * i:3 * i + 3]) for i, app in enumerate(RESUMED_APPS)}


@pytest.mark.parametrize('app', RESUMED_APPS)
def test_a_resumed_run_equals_the_uninterrupted_one(resumed_runs, app):
  """Staleness 1 (the configs'): the round not yet reported is in the checkpoint."""
  straight, parts, results = resumed_runs[app]
  for result in results:
    assert result['returncode'] == 0, result['stderr']
  whole, resumed = _rows(straight), _rows(parts)
  assert [r['step'] for r in resumed] == list(range(1, 13))
  assert [r['loss'] for r in resumed] == [r['loss'] for r in whole]
  assert all((r['loss'] is None) == (r['step'] % 2 == 1) for r in resumed)  # every 2 rounds
  assert all(math.isfinite(r['loss']) for r in resumed if r['loss'] is not None)
  summary = json.loads((parts / 'summary.json').read_text())
  assert summary['final_step'] == 12 and summary['checkpoint_steps'] == [6, 12]
