"""hetjax.report on made-up telemetry: loading, exact summaries, the table, PNGs and the CLI.

The run: 4 workers × 6 steps, worker 3 emulated 3× slower. Step 1 (compile) takes 10 s for
everyone. From step 2 every iteration takes 1.0 s on even and 0.5 s on odd steps; the fast
workers spend half of it waiting at the barrier, the slow one none. Times are binary fractions,
so every mean below is exact.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.report import (
    IterationSummary,
    WorkerSummary,
    format_table,
    iteration_summary,
    load_telemetry,
    plot_timeline,
    summarise,
    write_plots,
)
from hetjax.report.__main__ import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _row(step, worker):
  slow = worker == 3
  row = {'step': step, 'worker': worker, 'share': 8 if slow else 40,
         'slowdown': 3.0 if slow else 1.0}
  if step == 1:
    return row | {'data_s': 0.5, 'compute_s': 9.0, 'dilation_s': 0.0, 'comm_s': 0.25,
                  'wait_s': 0.0, 'step_s': 10.0}
  scale = 1.0 if step % 2 == 0 else 0.5
  times = {'data_s': 0.0625, 'compute_s': 0.25, 'dilation_s': 0.5 if slow else 0.0,
           'comm_s': 0.125, 'wait_s': 0.0 if slow else 0.5, 'step_s': 1.0}
  return row | {k: v * scale for k, v in times.items()}


def _rows():
  return [_row(step, worker) for step in range(1, 7) for worker in range(4)]


def _write(run_dir, rows=None, lines=None, run=None):
  run_dir.mkdir(parents=True, exist_ok=True)
  lines = lines if lines is not None else [json.dumps(r) for r in rows or _rows()]
  (run_dir / 'telemetry.jsonl').write_text(''.join(line + '\n' for line in lines))
  if run is not None:
    (run_dir / 'run.json').write_text(json.dumps(run))
  return run_dir


@pytest.fixture
def run_dir(tmp_path):
  return _write(tmp_path / 'run', run={'workers': 4, 'global_batch': 128, 'model': 'mlp',
                                       'policy': 'static', 'slowdown': '3:3'})


def test_load_builds_step_by_worker_arrays(run_dir):
  t = load_telemetry(run_dir)
  assert t.steps == (1, 2, 3, 4, 5, 6) and t.workers == (0, 1, 2, 3)
  assert t.run['model'] == 'mlp' and t.directory == run_dir
  assert t.step_s.shape == (6, 4) and t.share.dtype == np.int64
  assert t.dilation_s[1].tolist() == [0.0, 0.0, 0.0, 0.5]
  assert t.wait_s[2].tolist() == [0.25, 0.25, 0.25, 0.0]
  assert t.iteration_s().tolist() == [10.0, 1.0, 0.5, 1.0, 0.5, 1.0]
  assert t.batch().tolist() == [128] * 6
  with pytest.raises(ValueError, match='read-only'):
    t.step_s[0, 0] = 1.0


def test_run_json_is_optional(tmp_path):
  assert load_telemetry(_write(tmp_path)).run == {}


def test_summaries_are_exact(run_dir):
  t = load_telemetry(run_dir)
  fast = dict(share=40.0, slowdown=1.0, data_s=0.05, compute_s=0.2, dilation_s=0.0, comm_s=0.1,
              wait_s=0.4, step_s=0.8, idle_fraction=0.5)
  slow = fast | dict(share=8.0, slowdown=3.0, dilation_s=0.4, wait_s=0.0, idle_fraction=0.0)
  assert summarise(t) == [WorkerSummary(worker=w, **fast) for w in range(3)] + [
      WorkerSummary(worker=3, **slow)]
  # Steps 2..6: iterations 1, .5, 1, .5, 1 s -> 4 s for 5 × 128 examples.
  assert iteration_summary(t) == IterationSummary(
      steps=5, skipped=1, iteration_s=0.8, global_batch=128.0, samples_per_s=160.0)
  # With the compile step: 14 s for 6 × 128 examples.
  assert iteration_summary(t, skip=0) == IterationSummary(
      steps=6, skipped=0, iteration_s=14 / 6, global_batch=128.0, samples_per_s=6 * 128 / 14)
  assert summarise(t, skip=0)[0].compute_s == (9.0 + 1.0) / 6


@pytest.mark.parametrize('skip', [-1, 6])
def test_skip_must_leave_steps(run_dir, skip):
  with pytest.raises(ConfigError, match=f'skip must be in \\[0, 6\\) for 6 steps, got {skip}'):
    summarise(load_telemetry(run_dir), skip)


def test_table_has_a_row_per_worker_and_a_footer(run_dir):
  t = load_telemetry(run_dir)
  table = format_table(summarise(t), iteration_summary(t)).splitlines()
  assert table[0].split() == ['worker', 'slowdown', 'share', 'data', 'ms', 'compute', 'ms',
                              'dilation', 'ms', 'comm', 'ms', 'wait', 'ms', 'step', 'ms', 'idle']
  rows = [line.split() for line in table[2:6]]
  assert [r[0] for r in rows] == ['0', '1', '2', '3']
  assert rows[0] == ['0', '1.00', '40.0', '50.00', '200.00', '0.00', '100.00', '400.00', '800.00',
                     '50.0%']
  assert rows[3][1] == '3.00' and rows[3][5] == '400.00' and rows[3][-1] == '0.0%'
  assert len({len(line) for line in table[:7]}) == 1  # aligned
  assert table[-1] == ('iteration 800.00 ms (slowest worker) | 160.0 samples/s | '
                       'global batch 128 | 5 steps after skipping 1')


def _assert_png(path):
  data = path.read_bytes()
  assert data[:8] == PNG_MAGIC and len(data) > 1024, path


def test_plots_are_png_files(run_dir):
  paths = write_plots(load_telemetry(run_dir))
  assert [p.name for p in paths] == ['timeline.png', 'throughput.png', 'shares.png']
  for path in paths:
    assert path.parent == run_dir
    _assert_png(path)


def test_long_run_timeline_is_a_png(tmp_path):
  rows = [_row(step, worker) for step in range(1, 61) for worker in range(4)]
  path = plot_timeline(load_telemetry(_write(tmp_path, rows)), tmp_path / 'timeline.png')
  _assert_png(path)  # shows the last 40 steps only


def _report(*args):
  return subprocess.run([sys.executable, '-m', 'hetjax.report', *map(str, args)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_cli_prints_the_table_and_writes_plots(run_dir):
  result = _report(run_dir, '--skip', '1')
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0] == 'model mlp, policy static, slowdown 3:3'
  assert '160.0 samples/s' in result.stdout
  assert lines[-3:] == [f'wrote {run_dir / name}'
                        for name in ('timeline.png', 'throughput.png', 'shares.png')]
  for name in ('timeline.png', 'throughput.png', 'shares.png'):
    _assert_png(run_dir / name)


def test_no_plots_writes_nothing(run_dir, capsys):
  assert main([str(run_dir), '--no-plots', '--skip=0']) == 0
  out = capsys.readouterr().out
  assert 'wrote' not in out and '6 steps\n' in out
  assert not list(run_dir.glob('*.png'))


def _bad_lines():
  rows = _rows()
  malformed = [json.dumps(r) for r in rows]
  malformed[6] = '{"step": 2, "worker": 2,'
  incomplete = [json.dumps(r) for r in rows if (r['step'], r['worker']) != (4, 2)]
  return malformed, incomplete


def _expect_error(result, fragment):
  assert result.returncode == 2, (result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('report: error: '), result.stderr
  assert fragment in lines[0], lines[0]


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
  malformed, incomplete = _bad_lines()
  _expect_error(_report(tmp_path / 'nope'), f'no run directory {tmp_path / "nope"}')
  _expect_error(_report(_write(tmp_path / 'm', lines=malformed)), 'line 7: not valid JSON')
  _expect_error(_report(_write(tmp_path / 'g', lines=incomplete)),
                'incomplete grid: step 4 lacks worker 2')


def _without(field):
  return [json.dumps({k: v for k, v in r.items() if k != field}) for r in _rows()]


@pytest.mark.parametrize('lines, run, args, fragment', [
    ([], None, [], 'telemetry.jsonl is empty'),
    (['[1, 2]'], None, [], 'line 1: expected a JSON object, got list'),
    (_without('wait_s'), None, [], 'line 1: missing field(s) wait_s'),
    ([json.dumps(_row(1, 0) | {'share': 1.5})], None, [], 'share must be a non-negative integer'),
    ([json.dumps(_row(1, 0) | {'comm_s': -1})], None, [], 'comm_s must be a non-negative number'),
    ([json.dumps(_row(1, 0))] * 2, None, [], 'line 2: a second row for step 1 worker 0'),
    (None, {'workers': 5}, [], 'run.json says 5 workers but telemetry has 4 (no rows for worker 4)'),
    (None, None, ['--skip', '6'], 'skip must be in [0, 6) for 6 steps, got 6'),
    (None, None, ['--skip', 'x'], "argument --skip: invalid int value: 'x'"),
])
def test_more_bad_input(tmp_path, capsys, lines, run, args, fragment):
  run_dir = _write(tmp_path, lines=lines, run=run)
  with pytest.raises(SystemExit) as exit_info:
    main([str(run_dir), '--no-plots', *args])
  assert exit_info.value.code == 2
  _expect_error(subprocess.CompletedProcess([], 2, '', capsys.readouterr().err), fragment)


def test_no_telemetry_file(tmp_path):
  with pytest.raises(ConfigError, match=r'no telemetry\.jsonl in'):
    load_telemetry(tmp_path)
