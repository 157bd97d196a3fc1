"""``python -m hetjax.report RUN_A RUN_B …`` (issue 44): runs side by side, a warning when they
emulated different hosts, and each run's report naming the hosts it ran on.

The user's case, in made-up telemetry: 4 workers, worker 3 at 3x, a global batch of 1024. The
uniform run calibrated its hosts at 0.02 ms a row, the LB-BSP run separately at 0.1 ms (a busy
machine), so LB-BSP looked slower; run again on the uniform run's hosts it is faster. Times are
binary fractions, so every figure below is exact.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from hetjax import report
from hetjax.report.__main__ import main

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
CALIBRATED = {'host_row_s': 2e-5, 'host_fixed_s': 0.0005, 'host_source': 'calibrated',
              'host_calibration_retries': []}


def _write(run_dir: pathlib.Path, shares, step_s: float, run: dict, steps: int = 5):
  """A run of ``steps`` steps: the first compiles (10 s), every other takes ``step_s``; each
  worker computes its share and waits for the slowest."""
  run_dir.mkdir(parents=True)
  rows = []
  for step in range(1, steps + 1):
    for worker, share in enumerate(shares):
      time = 10.0 if step == 1 else step_s
      busy = step_s * share * (3 if worker == 3 else 1) / max(
          s * (3 if w == 3 else 1) for w, s in enumerate(shares))
      rows.append({'step': step, 'worker': worker, 'share': share,
                   'slowdown': 3.0 if worker == 3 else 1.0, 'data_s': 0.0, 'compute_s': busy / 4,
                   'dilation_s': 3 * busy / 4, 'comm_s': 0.0, 'wait_s': time - busy,
                   'step_s': time, 'compile_s': 9.0 if step == 1 else 0.0})
  (run_dir / 'telemetry.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  (run_dir / 'run.json').write_text(json.dumps(
      {'workers': len(shares), 'global_batch': sum(shares), 'model': 'mlp', 'mode': 'shares',
       'slowdown': 'static:1,1,1,3', **run}))
  return run_dir


@pytest.fixture
def runs(tmp_path):
  """``(uniform, lbbsp calibrated apart, lbbsp on the uniform run's hosts)``."""
  uniform = _write(tmp_path / 'c_uniform', (256, 256, 256, 256), 0.015625,
                   {'policy': 'uniform', **CALIBRATED})
  apart = _write(tmp_path / 'c_lbbsp', (320, 320, 320, 64), 0.03125,
                 {'policy': 'lbbsp-ewma', **CALIBRATED, 'host_row_s': 1e-4,
                  'host_fixed_s': 0.002})
  same = _write(tmp_path / 'c_same', (320, 320, 320, 64), 0.0078125,
                {'policy': 'lbbsp-ewma', **CALIBRATED, 'host_source': 'reused',
                 'hosts_from': str(uniform), 'host_calibration_retries': None})
  return uniform, apart, same


def test_two_runs_on_different_hosts_are_compared_with_one_warning(runs, capsys):
  uniform, apart, _ = runs
  assert main([str(uniform), str(apart), '--no-plots']) == 0
  out = capsys.readouterr().out.splitlines()
  head, first, second, ratio, warning = out
  assert head.split() == ['run', 'mode', 'policy', 'slowdown', 'samples/s', 'step', 'ms',
                          'goodput', 'hosts']
  # 1024 rows every 1/64 s and every 1/32 s: 65,536 and 32,768 samples/s.
  assert first.split()[:7] == [str(uniform), 'shares', 'uniform', 'static:1,1,1,3', '65,536',
                               '15.62', '-']
  assert second.split()[:7] == [str(apart), 'shares', 'lbbsp-ewma', 'static:1,1,1,3', '32,768',
                                '31.25', '-']
  assert first.endswith('0.02 ms a row + 0.5 ms a step (a host of speed 1), calibrated at start')
  assert ratio == f'{apart}: 0.50x the samples/s of {uniform}'
  assert warning == (
      f'warning: these runs emulated different hosts ({uniform}: 0.02 ms a row + 0.5 ms a step '
      f'(a host of speed 1); {apart}: 0.1 ms a row + 2 ms a step (a host of speed 1)), so they '
      f'compare clusters as well as policies: run the others again with --hosts={uniform}')


def test_runs_on_one_cluster_compare_without_a_warning_and_plot_together(runs, capsys):
  uniform, _, same = runs
  assert main([str(uniform), str(same)]) == 0
  out = capsys.readouterr().out.splitlines()
  assert not any(line.startswith('warning') for line in out)
  assert out[2].endswith(f'0.02 ms a row + 0.5 ms a step (a host of speed 1), reused from '
                         f'{uniform}')
  assert out[3] == f'{same}: 2.00x the samples/s of {uniform}'
  plot = uniform.parent / 'compare.png'
  assert out[-1] == f'wrote {plot}' and plot.read_bytes()[:8] == PNG_MAGIC
  assert not list(uniform.glob('*.png'))  # each run's own plots are its own report's


def test_the_plot_goes_where_out_says(runs, tmp_path, capsys):
  uniform, apart, same = runs
  out = tmp_path / 'side_by_side.png'
  assert main([str(uniform), str(apart), str(same), f'--out={out}']) == 0
  assert capsys.readouterr().out.splitlines()[-1] == f'wrote {out}'
  assert out.read_bytes()[:8] == PNG_MAGIC


def test_a_run_without_telemetry_is_compared_from_its_summary(runs, tmp_path, capsys):
  """One process (no telemetry): its steady samples/s from summary.json, its step time the
  global batch over it, and it is left out of the plot, which says so."""
  uniform, _, _ = runs
  one = tmp_path / 'one'
  one.mkdir()
  (one / 'metrics.jsonl').write_text('{"step": 1, "loss": 2.0}\n')
  (one / 'summary.json').write_text(json.dumps({'steady_samples_per_s': 4096.0}))
  (one / 'run.json').write_text(json.dumps({'global_batch': 1024, 'mode': 'spmd',
                                            'policy': None, 'host_row_s': None}))
  assert main([str(uniform), str(one), '--no-plots']) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[2].split() == [str(one), 'spmd', '-', '-', '4,096', '250.00', '-', 'none']
  assert out[-1].startswith('warning: these runs emulated different hosts') \
      and f'{one}: none' in out[-1]


def test_one_run_dir_keeps_its_report_and_names_its_hosts(runs, capsys):
  uniform, _, same = runs
  assert main([str(same), '--no-plots']) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == ('model mlp, policy lbbsp-ewma (LB-BSP: each worker\'s speed predicted by an '
                    'exponentially weighted moving average), slowdown static:1,1,1,3')
  assert out[1] == (f'hosts: 0.02 ms a row + 0.5 ms a step (a host of speed 1), reused from '
                    f'{uniform}')
  assert out[2].split()[0] == 'worker'


@pytest.mark.parametrize('run, line', [
    ({'host_row_s': 1e-3, 'host_fixed_s': 0.0, 'host_source': 'declared'},
     'hosts: 1 ms a row (a host of speed 1), declared (emulation.host_row_s)'),
    ({**CALIBRATED, 'host_calibration_retries': ['worker 2: …', 'worker 2: …']},
     'hosts: 0.02 ms a row + 0.5 ms a step (a host of speed 1), calibrated at start '
     '(2 retries: run.json host_calibration_retries)'),
    ({'host_row_s': 0.004, 'mode': 'schmp'},
     'hosts: 4 ms a unit of work (a host of speed 1), source not recorded'),
    ({'host_row_s': None, 'host_fixed_s': None}, None),
    ({}, None),
])
def test_the_hosts_line(run, line):
  assert report.describe_hosts(run) == line


def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys):
  uniform, _, _ = runs
  empty = tmp_path / 'empty'
  empty.mkdir()
  for args, fragment in [([str(uniform), str(tmp_path / 'nope')], f'no run directory '
                          f'{tmp_path / "nope"}'),
                         ([str(uniform), str(empty)], 'holds neither telemetry.jsonl nor '
                          'metrics.jsonl'),
                         ([str(uniform), f'--out={tmp_path / "x.png"}'],
                          '--out names the plot of several runs compared')]:
    with pytest.raises(SystemExit) as exit_:
      main(args)
    assert exit_.value.code == 2
    [error] = capsys.readouterr().err.strip().splitlines()
    assert error.startswith('report: error: ') and fragment in error, error
