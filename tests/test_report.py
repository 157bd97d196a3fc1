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
    Throughput,
    WorkerSummary,
    format_table,
    iteration_summary,
    load_telemetry,
    plot_timeline,
    steady_throughput,
    summarise,
    summary_fields,
    telemetry_throughput,
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
      iteration_s=0.8, global_batch=128.0,
      throughput=Throughput(160.0, steps=(2, 3, 4, 5, 6), warmup=(1,), compiling=()))
  # With the compile step (this telemetry has no compile_s, so it counts): 14 s for 6 × 128.
  it = iteration_summary(t, skip=0)
  assert (it.steps, it.skipped, it.iteration_s, it.samples_per_s) == (6, 0, 14 / 6, 6 * 128 / 14)
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
                       'global batch 128 | steps 2-6, 5 counted: 1 warm-up step excluded')


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
  assert 'wrote' not in out and '| steps 1-6, 6 counted\n' in out
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


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
  _expect_error(_report(tmp_path / 'nope'), f'no run directory {tmp_path / "nope"}')  # a process
  malformed, incomplete = _bad_lines()
  for run_dir, fragment in ((_write(tmp_path / 'm', lines=malformed), 'line 7: not valid JSON'),
                            (_write(tmp_path / 'g', lines=incomplete),
                             'incomplete grid: step 4 lacks worker 2')):
    with pytest.raises(SystemExit) as exit_info:
      main([str(run_dir), '--no-plots'])
    _expect_error(subprocess.CompletedProcess([], exit_info.value.code, '',
                                              capsys.readouterr().err), fragment)


def _without(field):
  return [json.dumps({k: v for k, v in r.items() if k != field}) for r in _rows()]


@pytest.mark.parametrize('lines, run, args, fragment', [
    ([], None, [], 'telemetry.jsonl is empty'),
    (['[1, 2]'], None, [], 'line 1: expected a JSON object, got list'),
    (_without('wait_s'), None, [], 'line 1: missing field(s) wait_s'),
    ([json.dumps(_row(1, 0) | {'share': 1.5})], None, [], 'share must be a non-negative integer'),
    ([json.dumps(_row(1, 0) | {'comm_s': -1})], None, [], 'comm_s must be a non-negative number'),
    ([json.dumps(_row(1, 0))] * 2, None, [], 'line 2: a second row for step 1 worker 0'),
    ([json.dumps(_row(1, 0) | {'sampled': 0})], None, [], 'sampled must be true or false, got 0'),
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


def _compiling_rows():
  """The run above, with step 1 compiling (9 s of its 10) and steps 3 and 5 waiting 2 s for
  worker 2 to compile a new size: those iterations take 3 s instead of 0.5 s."""
  rows = []
  for row in _rows():
    row |= {'compile_s': 0.0}
    if row['step'] == 1:
      row |= {'compile_s': 9.0}
    elif row['step'] in (3, 5):
      row |= {'step_s': 3.0, 'compile_s': 2.0 if row['worker'] == 2 else 0.0}
    rows.append(row)
  return rows


STEADY = 'steps 2-6, 3 counted: 1 warm-up step and 2 compiling steps (3, 5) excluded'


def test_report_and_summary_share_one_steady_throughput(tmp_path, capsys):
  rows = _compiling_rows()
  run_dir = _write(tmp_path / 'run', rows=rows)
  # The shared definition, fed straight from the rows: per step the global batch, the slowest
  # worker's time, and whether any worker compiled.
  steps = sorted({r['step'] for r in rows})
  of = [[r for r in rows if r['step'] == s] for s in steps]
  expected = steady_throughput(steps, [sum(r['share'] for r in g) for g in of],
                               [max(r['step_s'] for r in g) for g in of],
                               [max(r['compile_s'] for r in g) for g in of])
  # Steps 2, 4, 6: 3 × 128 examples in 3 × 1 s. All steps averaged in: 768 / 19 s = 40.4.
  assert expected == Throughput(128.0, steps=(2, 4, 6), warmup=(1,), compiling=(3, 5))
  t = load_telemetry(run_dir)
  assert telemetry_throughput(t) == expected
  assert iteration_summary(t).throughput == expected
  assert iteration_summary(t).samples_per_s == 128.0 and iteration_summary(t).iteration_s == 1.0
  assert [w.step_s for w in summarise(t)] == [1.0] * 4  # the table's means: the same steps
  assert expected.describe() == STEADY
  assert summary_fields(run_dir) == {'steady_samples_per_s': 128.0, 'steady_steps': STEADY}
  assert main([str(run_dir), '--no-plots']) == 0
  assert capsys.readouterr().out.splitlines()[-1] == (
      f'iteration 1000.00 ms (slowest worker) | 128.0 samples/s | global batch 128 | {STEADY}')


def _resized_share_rows():
  """4 workers on hosts of known speed (worker 3 at 3x), global batch 2048, 20 steps of 0.25 s
  after a compiling first one; at steps 6-7 the policy has moved worker 2 to a new share size,
  which it runs as pieces while the size compiles in the background: it waits for no compile
  (``compile_s`` 0) but overruns its host by 3.4 s, and the others wait for it."""
  rows = []
  for step in range(1, 21):
    resized = step in (6, 7)
    for worker, share in enumerate((640, 640, 640, 128)):
      compute = 9.0 if step == 1 else 3.5 if resized and worker == 2 else 0.1
      step_s = 10.0 if step == 1 else 3.75 if resized else 0.25
      rows.append({'step': step, 'worker': worker, 'share': share,
                   'slowdown': 3.0 if worker == 3 else 1.0, 'data_s': 0.0, 'compute_s': compute,
                   'dilation_s': 0.0 if compute > 0.1 else 0.1, 'comm_s': 0.05,
                   'wait_s': round(step_s - 0.05 - max(compute, 0.2), 6), 'step_s': step_s,
                   'compile_s': 9.0 if step == 1 else 0.0, 'load': 1.0,
                   'overrun_s': 3.4 if resized and worker == 2 else 0.0,
                   'sampled': not (resized and worker == 2)})
  return rows


def test_a_step_beside_a_background_compile_is_not_steady(tmp_path, capsys):
  """The report's headline and summary.json's figure are one, and near the true steady rate
  (2048 rows every 0.25 s): the steps that overran beside a compile are left out, not averaged
  in (3,312/s here; 554/s on a user's run whose plot showed 2,000-8,000)."""
  rows = _resized_share_rows()
  run_dir = _write(tmp_path / 'run', rows=rows, run={'workers': 4, 'policy': 'lbbsp'})
  steady = 'steps 2-20, 17 counted: 1 warm-up step and 2 compiling steps (6-7) excluded'
  assert summary_fields(run_dir) == {'steady_samples_per_s': 8192.0, 'steady_steps': steady}
  t = load_telemetry(run_dir)
  assert iteration_summary(t).samples_per_s == 8192.0 == 2048 / 0.25
  assert main([str(run_dir), '--no-plots']) == 0
  assert capsys.readouterr().out.splitlines()[-1] == (
      f'iteration 250.00 ms (slowest worker) | 8,192.0 samples/s | global batch 2048 | {steady}')
  # The same telemetry from before runs recorded ``sampled``: those steps counted as steady.
  old = _write(tmp_path / 'old', rows=[{k: v for k, v in r.items() if k != 'sampled'}
                                       for r in rows])
  assert summary_fields(old)['steady_samples_per_s'] == round(2048 * 19 / (17 * 0.25 + 7.5), 1)


def test_steady_throughput_edges():
  # The docstring's example: step 3 compiled.
  assert steady_throughput([1, 2, 3, 4], [128] * 4, [10.0, 1.0, 3.0, 1.0],
                           [9.0, 0.0, 2.0, 0.0]) == Throughput(128.0, (2, 4), (1,), (3,))
  # No warm-up: a compiling first step is still left out, as compiling.
  none = steady_throughput([1, 2], [8, 8], [5.0, 2.0], [4.0, 0.0], warmup=0)
  assert none == Throughput(4.0, (2,), (), (1,))
  assert none.describe() == 'steps 1-2, 1 counted: 1 compiling step (1) excluded'
  # Every step compiled: no figure, and the description says why.
  steps = list(range(1, 20))
  every = steady_throughput(steps, [8] * 19, [1.0] * 19, [0.5] * 19)
  assert every.samples_per_s is None and every.to_json()['steady_samples_per_s'] is None
  assert every.describe() == ('steps 2-19, 0 counted: 1 warm-up step and 18 compiling steps '
                              '(2-19) excluded')
  gaps = steady_throughput(steps, [8] * 19, [1.0] * 19, [float(s % 2) for s in steps])
  assert gaps.describe().endswith('9 compiling steps (3, 5, 7, 9, 11, 13, …) excluded')
  with pytest.raises(ValueError, match='one entry per step'):
    steady_throughput([1, 2], [8], [1.0], [0.0])


def test_a_run_with_no_steady_step_reports_every_step_after_the_warm_up(tmp_path, capsys):
  # A run shorter than its compiles (CI's loaded machine: 20 LB-BSP steps, every one beside a
  # background compile) still gets its table and plots, over steps 2-6, and no throughput.
  rows = [r | {'compile_s': 1.0} for r in _rows()]
  run_dir = _write(tmp_path, rows=rows)
  t = load_telemetry(run_dir)
  it = iteration_summary(t)
  assert it.samples_per_s is None and it.steps == 0
  assert it.iteration_s == pytest.approx(float(t.iteration_s()[1:].mean()))
  means = summarise(t)
  assert [s.step_s for s in means] == pytest.approx(t.step_s[1:].mean(axis=0).tolist())
  assert main([str(run_dir)]) == 0
  out = capsys.readouterr().out
  assert ('no steady samples/s: the means cover every step after the warm-up, compiles '
          'included; run more steps') in out
  assert 'steps 2-6, 0 counted: 1 warm-up step and 5 compiling steps (2-6) excluded' in out
  assert (run_dir / 'throughput.png').is_file() and 'wrote ' in out
  assert summary_fields(run_dir) == {
      'steady_samples_per_s': None,
      'steady_steps': 'steps 2-6, 0 counted: 1 warm-up step and 5 compiling steps (2-6) excluded'}


def test_summary_fields_without_readable_telemetry(tmp_path):
  assert summary_fields(tmp_path) == {}  # an SPMD run: summary.json keeps the logger's figure
  malformed, _ = _bad_lines()
  fields = summary_fields(_write(tmp_path / 'm', lines=malformed))
  assert fields['steady_samples_per_s'] is None
  assert fields['steady_steps'].startswith('unknown: ') and 'line 7: not valid JSON' in fields[
      'steady_steps']
