"""experiments/bench_lm.py at its tiniest (the ``tiny`` llama, one round of two steps, float32,
without the launched part): its JSON rows, hetjax's losses against the hand-written loop's, and
its one-line errors."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ('-m', 'experiments.bench_lm')  # from the checkout (cwd=ROOT)
FIELDS = ('model', 'size', 'params', 'strategy', 'dtype', 'side', 'step_s', 'cpu_step_s',
          'tokens_per_s', 'mfu', 'loss_max_rel_diff_vs_plain', 'compile_s', 'flops_ratio')


def test_tiny_run_writes_every_row_and_float32_losses_match(tmp_path):
  out = tmp_path / 'lm.json'
  # The suite's fast-compile XLA flag (conftest.py) reaches the child through the environment:
  # about 30 s on a loaded 2-core machine, most of it compiling.
  result = subprocess.run(
      [sys.executable, *SCRIPT, '--models=llama', '--sizes=tiny', '--rounds=1', '--steps=2',
       '--dtypes=float32', '--nolaunched', f'--json={out}'],
      capture_output=True, text=True, timeout=58, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads(out.read_text())
  assert sorted((r['strategy'], r['side']) for r in rows) == [
      ('data_parallel', 'hetjax'), ('data_parallel', 'plain'), ('fsdp', 'hetjax'),
      ('fsdp', 'plain')]
  for r in rows:
    assert all(field in r for field in FIELDS), r
    assert r['model'] == 'llama' and r['size'] == 'tiny' and r['dtype'] == 'float32'
    assert r['params'] == 79_040  # num_params, checked by the bench against the model's arrays
    assert 1.0 <= r['flops_ratio'] <= 1.1, r  # XLA's count: the formula plus norms, softmax
    assert r['step_s'] > 0 and r['cpu_step_s'] > 0 and r['mfu'] > 0 and r['compile_s'] > 0
    assert r['loss_max_rel_diff_vs_plain'] <= 1e-6, r
  assert 'goal: float32 losses within 1e-06 relative of plain: met by 2/2' in result.stdout


@pytest.mark.parametrize('flag', ['--models=bert', '--sizes=huge', '--strategies=hybrid', '--dtypes=float16',
                                  '--rounds=0', '--steps=-1', '--launched_steps=2',
                                  '--goodput_steps=0', '--checkpoint_every=0', '--host_row_s=0',
                                  '--nointerleaved --nolaunched'])
def test_bad_flags_are_one_line_and_exit_2(flag):
  result = subprocess.run([sys.executable, *SCRIPT, *flag.split()], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
  assert result.returncode == 2
  assert result.stderr.strip().count('\n') == 0 and 'bench_lm.py: error:' in result.stderr
