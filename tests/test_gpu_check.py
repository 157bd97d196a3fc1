"""experiments/gpu_check.py on a CPU with tiny sizes (``--platform=cpu --quick``): every part runs
and writes its rows and its markdown, so the check cannot rot before a GPU is lent; bad input
is one line.

The check runs once (the module's `report`), and each part's rows are checked here against what
its module promises; the parts' pure functions (fits, shares, tables from hand-made rows) are
tested in ``test_gpu_curve.py`` and ``test_gpu_schmp.py``, the planner's timed profile in
``test_planner_profile.py``."""

import json
import math
import pathlib
import subprocess
import sys

import pytest

from experiments import _gpu_curve, _gpu_planner, _gpu_schmp

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ('-m', 'experiments.gpu_check')  # from the checkout (cwd=ROOT)


@pytest.fixture(scope='module')
def report(tmp_path_factory):
  """The quick check's JSON report, with its markdown under ``'markdown'``."""
  out = tmp_path_factory.mktemp('gpu-check')
  result = subprocess.run([sys.executable, *SCRIPT, '--platform=cpu', '--quick',
                           f'--out={out}'], cwd=ROOT, capture_output=True, text=True,
                          timeout=500)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  return {**json.loads((out / 'gpu_check.json').read_text()),
          'markdown': (out / 'gpu_check.md').read_text()}


@pytest.mark.slow
def test_every_part_runs_on_a_cpu_and_writes_json_and_markdown(report):
  assert report['platform'] == 'cpu' and report['quick']
  parts = report['parts']
  assert list(parts) == ['device', 'tests', 'planner', 'schmp', 'curve', 'lm']
  assert all('error' not in p and p['rows'] for p in parts.values()), parts
  device = parts['device']['rows'][0]
  assert device['bfloat16_flops_per_s'] > 0 and device['float32_flops_per_s'] > 0
  assert device['float32_highest_flops_per_s'] > 0
  tests = parts['tests']['rows'][0]
  assert tests['returncode'] == 0 and 'collected' in tests['summary']
  lm = parts['lm']['rows']
  compare = [r for r in lm if r['kind'] == 'compare']
  assert {(r['remat'], r['side']) for r in compare} == {
      (remat, side) for remat in ('none', 'save_dots') for side in ('hetjax', 'plain')}
  assert not [r for r in lm if r['kind'] == 'failed'], lm
  # A CPU has no cuDNN: attention='auto' is XLA's there, like the variant that asks for it.
  assert {r['attention'] for r in compare} == {'xla'}
  assert all(r['mfu'] > 0 and r['hfu'] > 0 and r['mfu_datasheet'] is None for r in compare)
  # The same model, data and optimizer on both sides: the same losses.
  assert all(r['loss_max_rel_diff'] == 0.0 for r in compare)
  assert [r['largest_batch'] for r in lm if r['kind'] == 'largest_batch'] == [8]
  # Where the first variant's step goes: every matmul timed, the rest what remains of the step.
  (breakdown,) = [r for r in lm if r['kind'] == 'breakdown']
  assert [r['kind'] for r in lm][:3] == ['compare', 'compare', 'breakdown']
  assert breakdown['untimed'] == [] and breakdown['matmul_s'] > 0
  assert breakdown['attention_kernel_s'] == 0  # XLA's attention is dot_generals
  assert breakdown['rest_s'] == pytest.approx(breakdown['step_s'] - breakdown['matmul_s'])
  (first,) = [r for r in compare if r['remat'] == 'none' and r['side'] == 'hetjax']
  assert 0 < breakdown['matmul_flops'] < first['xla_flops_per_step']  # XLA:CPU's: + elementwise
  assert "Where the step's time goes" in report['markdown']
  for heading in ('### The device', '### Exactness tests', '### The gpt language model',
                  "### LB-BSP's GPU curve", '### The planner on the device',
                  '### SchMP Lasso on the device'):
    assert heading in report['markdown'], heading


@pytest.mark.slow
def test_curve_rows(report):
  rows = report['parts']['curve']['rows']
  assert [r['model'] for r in rows] == ['mlp', 'gpt']
  for r in rows:
    assert r['part'] == 'lbbsp_curve' and r['platform'] == 'cpu'
    assert r['batch_sizes'] == list(_gpu_curve.QUICK_SIZES) and r['stopped'] is None
    assert all(t > 0 and math.isfinite(t) for t in r['step_s'])
    assert math.isfinite(r['fit_max_rel_err']) and math.isfinite(r['fit_mean_rel_err'])
    assert r['fit_mean_rel_err'] <= r['fit_max_rel_err']
    assert r['global_batch'] == _gpu_curve.QUICK_SIZES[-1]
    assert sum(r['shares']) == pytest.approx(r['global_batch'])
    assert min(r['shares']) >= 1 - 1e-9
    assert r['finish_s'] == pytest.approx(max(r['share_s']))
    assert not set(r['measured']) & set(r['modelled'])
    assert set(r['measured']) | set(r['modelled']) <= set(r)
  lines = _gpu_curve.markdown(rows)
  assert lines[0] == "### LB-BSP's GPU curve"
  assert sum(line.startswith('| mlp |') for line in lines) == 2
  assert lines[-1].startswith('goal: fit within 10% of measured: ')


def _finite(x) -> bool:
  return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_planner_rows_with_profiles_plan_and_times(report):
  rows = report['parts']['planner']['rows']
  assert [r['model'] for r in rows] == ['gpt', 'wide_deep']
  for row in rows:
    assert row['part'] == 'planner'
    assert row['device'].startswith('cpu')
    for field in ('predicted_step_s', 'measured_step_s', 'ratio', 'device_flops_per_s'):
      assert _finite(row[field]), (row['model'], field, row[field])
    assert row['ratio'] == pytest.approx(row['predicted_step_s'] / row['measured_step_s'])
    assert row['met'] == (abs(row['ratio'] - 1) <= _gpu_planner.GOAL)
    names = [s['name'] for s in row['submodels']]
    assert names and len(set(names)) == len(names)
    assert row['plan'] == ', '.join(f'{s["name"]} {s["layout"]}' for s in row['submodels'])
    assert row['call_s'] >= 0
    for s in row['submodels']:
      for field in ('flops_per_step', 'predicted_s'):
        assert _finite(s[field]), (row['model'], s['name'], field, s[field])
      # A sub-model no longer than a call's fixed cost (on a loaded CPU) is 0 s, with no rate:
      # wide & deep's linear `wide`, in a suite run beside two busy loops.
      assert math.isfinite(s['measured_s']) and s['measured_s'] >= 0, (row['model'], s)
      assert _finite(s['flops_per_s']) if s['measured_s'] > 0 else s['flops_per_s'] is None
      assert s['layout'] == 'dp1'  # one device: nothing to split
  assert [s['name'] for s in rows[0]['submodels']] == ['embed', 'block_0', 'head']
  # Every number is labelled measured, modelled or analysed, and never two of them.
  for row in rows:
    labels = row['measured'] + row['modelled'] + row['analysed']
    assert len(labels) == len(set(labels))
    assert 'measured_step_s' in row['measured'] and 'predicted_step_s' in row['modelled']
    assert 'submodels[].measured_s' in row['measured']
    assert 'submodels[].predicted_s' in row['modelled']
    for label in labels:  # each names a field the row (or each sub-model) has
      if label.startswith('submodels[].'):
        assert all(label.removeprefix('submodels[].') in s for s in row['submodels']), label
      else:
        assert label in row, label
  lines = _gpu_planner.markdown(rows)
  assert lines[0] == '### The planner on the device'
  sub_rows = [line for line in lines if line.startswith(('| gpt | ', '| wide_deep | '))]
  assert len(sub_rows) == sum(len(r['submodels']) for r in rows) + len(rows)
  goal = [line for line in lines if line.startswith('goal: predicted within 25% of measured: ')]
  assert len(goal) == 1
  assert goal[0].split(': ')[2].startswith('met' if all(r['met'] for r in rows) else 'not met')


SCHMP_KEYS = {'part', 'device', 'platform', 'role', 'features', 'rows', 'schedule_size',
              'rounds', 'rounds_run', 'timed_rounds', 'rounds_per_s', 'objective',
              'objective_rel_diff', 'speedup_vs_cpu', 'same_device', 'wall_s', 'note', 'measured'}


@pytest.mark.slow
def test_schmp_rows_time_rounds_and_agree(report):
  rows = report['parts']['schmp']['rows']
  size = _gpu_schmp.size(quick=True)
  assert [r['role'] for r in rows] == ['device', 'cpu']
  for row in rows:
    assert row.keys() >= SCHMP_KEYS
    assert row['part'] == 'schmp'
    assert (row['features'], row['rows']) == (size.features, size.rows)
    assert row['rounds_per_s'] > 0 and all(m > 0 for m in row['measured'])
    assert row['rounds'] <= row['rounds_run']
    assert math.isfinite(row['objective']) and row['objective'] > 0
  device, cpu = rows
  assert device['rounds'] == cpu['rounds']
  assert cpu['speedup_vs_cpu'] == 1.0
  # The default device is the CPU here: one device, one seeded schedule, so the same rounds
  # give the same β.
  assert device['same_device'] and cpu['same_device'] and device['device'] == cpu['device']
  assert 'same device' in device['note']
  assert device['objective'] == cpu['objective'] and device['objective_rel_diff'] == 0.0


@pytest.mark.parametrize('args, message', [
    (['--parts=device,warp'], "--parts: unknown ['warp']"),
    (['--platform=quantum'], 'platform'),
    (['--budget_s=0'], '--budget_s must be positive, got 0'),
])
def test_bad_input_is_one_line(args, message, tmp_path):
  result = subprocess.run([sys.executable, *SCRIPT, f'--out={tmp_path}', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().count('\n') == 0 and message in result.stderr, result.stderr


@pytest.mark.slow
def test_the_budget_stops_a_part_between_rows_and_skips_the_rest(tmp_path):
  """With the budget spent during the lm part's first measurement (hetjax's and the plain
  loop's rows, yielded together), the part keeps both rows and stops; the parts after it are
  listed as not run; the exit is 0 (the budget is the check's plan)."""
  result = subprocess.run([sys.executable, *SCRIPT, '--platform=cpu', '--quick',
                           '--parts=lm,device', '--budget_s=0.5', f'--out={tmp_path}'],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  parts = json.loads((tmp_path / 'gpu_check.json').read_text())['parts']
  assert [r['side'] for r in parts['lm']['rows']] == ['hetjax', 'plain']
  assert 'budget of 0.5 s' in parts['lm']['cut']
  assert parts['device'] == {'rows': [], 'not_run': 'the budget of 0.5 s was spent',
                             'seconds': 0.0}
  markdown = (tmp_path / 'gpu_check.md').read_text()
  assert 'the rest of the part did not run' in markdown
  assert 'not run: the budget of 0.5 s was spent (--budget_s)' in markdown
