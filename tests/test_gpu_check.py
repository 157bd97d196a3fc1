"""experiments/gpu_check.py on a CPU with tiny sizes (``--platform=cpu --quick``): every part runs
and writes its rows and its markdown, so the check cannot rot before a GPU is lent; bad input
is one line."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / 'experiments' / 'gpu_check.py'


@pytest.mark.slow
def test_every_part_runs_on_a_cpu_and_writes_json_and_markdown(tmp_path):
  result = subprocess.run([sys.executable, str(SCRIPT), '--platform=cpu', '--quick',
                           f'--out={tmp_path}'], cwd=ROOT, capture_output=True, text=True,
                          timeout=500)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  report = json.loads((tmp_path / 'gpu_check.json').read_text())
  assert report['platform'] == 'cpu' and report['quick']
  parts = report['parts']
  assert list(parts) == ['device', 'lm', 'curve', 'planner', 'schmp', 'tests']
  assert all('error' not in p and p['rows'] for p in parts.values()), parts
  device = parts['device']['rows'][0]
  assert device['bfloat16_flops_per_s'] > 0 and device['float32_flops_per_s'] > 0
  tests = parts['tests']['rows'][0]
  assert tests['returncode'] == 0 and 'collected' in tests['summary']
  lm = parts['lm']['rows']
  compare = [r for r in lm if r['kind'] == 'compare']
  assert {(r['remat'], r['side']) for r in compare} == {
      (remat, side) for remat in ('none', 'save_dots') for side in ('hetjax', 'plain')}
  # The same model, data and optimizer on both sides: the same losses.
  assert all(r['loss_max_rel_diff'] == 0.0 for r in compare)
  assert [r['largest_batch'] for r in lm if r['kind'] == 'largest_batch'] == [8]
  markdown = (tmp_path / 'gpu_check.md').read_text()
  for heading in ('### The device', '### Exactness tests', '### The gpt language model',
                  "### LB-BSP's GPU curve", '### The planner on the device',
                  '### SchMP Lasso on the device'):
    assert heading in markdown, heading


@pytest.mark.parametrize('args, message', [
    (['--parts=device,warp'], "--parts: unknown ['warp']"),
    (['--platform=quantum'], 'platform'),
])
def test_bad_input_is_one_line(args, message, tmp_path):
  result = subprocess.run([sys.executable, str(SCRIPT), f'--out={tmp_path}', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().count('\n') == 0 and message in result.stderr, result.stderr
