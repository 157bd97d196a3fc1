"""bench_local's plan and analysis (`experiments._local_bench`), without launching anything."""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from experiments import _local_bench as lb
from hetjax.emulation import parse_links


def test_a_methods_command_is_the_training_cli_with_its_options(tmp_path):
  setup = lb.Setup()
  command = setup.command('diloco-hetero', tmp_path, 600, 'link:1:2', evaluate=True)
  sets = dict(a.removeprefix('--set=').split('=', 1) for a in command if a.startswith('--set='))
  assert command[1].endswith('experiments/train.py') and '--config=gpt' in command
  assert sets['local.inner_steps'] == '20' and sets['local.cutoff'] == '1.5'
  assert sets['balance.policy'] == 'lbbsp' and sets['emulation.network'] == 'link:1:2'
  assert float(sets['emulation.host_row_s']) * 8 == pytest.approx(setup.compute_s)
  assert sets['checkpoint.every'] == '600' and sets['eval.every'] == '20'
  bsp = setup.command('bsp', tmp_path, 300, None, evaluate=False)
  assert not any('local.' in a or 'emulation.network' in a for a in bsp)


def test_the_links_cost_the_asked_ratio_of_a_step():
  setup, nbytes = lb.Setup(compute_s=0.08), 529408
  for ratio in (1.0, 4.0, 16.0):
    links = parse_links(setup.network(ratio, nbytes), lb.WORKERS)
    assert links.all_reduce_s(range(lb.WORKERS), nbytes) == pytest.approx(ratio * 0.08,
                                                                          rel=1e-5)


def test_runs_share_curves_where_the_computation_is_the_same():
  setup = lb.Setup()
  curves = {r['id']: r for r in lb.curve_runs(setup, ('equal', 'slow'))}
  assert set(curves) == {'curve-bsp', 'curve-allreduce-overlap', 'curve-diloco',
                         'curve-diloco-int8', 'curve-diloco-stream',
                         'curve-diloco-hetero-equal', 'curve-diloco-hetero-slow'}
  assert curves['curve-diloco']['steps'] == setup.local_steps
  assert lb.curve_for('lbbsp', 'slow') == 'curve-bsp'
  assert lb.curve_for('diloco-hetero', 'slow') == 'curve-diloco-hetero-slow'
  timing = lb.timing_runs(setup, ('slow',), (4.0, 16.0), repeats=2)
  assert len(timing) == 2 * 2 * len(lb.METHODS) and len({r['id'] for r in timing}) == len(timing)
  assert [r['method'] for r in timing[:len(lb.METHODS)]] == list(lb.METHODS)  # interleaved
  stream = dict(a.removeprefix('--set=').split('=', 1) for a in setup.command(
      'diloco-stream', pathlib.Path('x'), 600, None, True) if a.startswith('--set='))
  assert stream['local.overlap_steps'] == '5' and stream['local.fragments'] == '4'


def _curve(*losses, every=20):
  return [(every * (k + 1), loss) for k, loss in enumerate(losses)]


def test_time_to_target_is_the_curves_steps_times_the_step_time(tmp_path):
  curves = {'curve-bsp': _curve(3.0, 2.0), 'curve-allreduce-overlap': _curve(3.0, 2.1),
            'curve-diloco': _curve(3.0, 2.5, 2.0, 1.9),
            'curve-diloco-hetero-slow': _curve(3.0, 1.99, 1.9, 1.8)}
  times = {('slow', 16.0, 'bsp'): [1.7, 1.7], ('slow', 16.0, 'lbbsp'): [1.5],
           ('slow', 16.0, 'allreduce-overlap'): [1.0], ('slow', 16.0, 'diloco'): [0.3],
           ('slow', 16.0, 'diloco-hetero'): [0.2]}
  table = {r['method']: r for r in lb.rows(lb.Setup(), curves, times, 4000)}
  assert table['bsp']['time_to_target_s'] == pytest.approx(40 * 1.7)
  assert table['lbbsp']['steps_to_target'] == 40   # BSP's steps: the same computation
  assert table['allreduce-overlap']['steps_to_target'] is None
  assert table['allreduce-overlap']['vs_bsp'] == math.inf
  assert table['diloco']['vs_bsp'] == pytest.approx(60 * 0.3 / 68)
  assert table['diloco-hetero']['vs_diloco'] == pytest.approx(40 * 0.2 / 18)
  assert table['diloco']['final_vs_bsp'] == pytest.approx(1.9 / 2.0 - 1)
  assert table['diloco']['bytes_per_worker_step'] == pytest.approx(
      table['bsp']['bytes_per_worker_step'] / 20)
  said = lb.goals(list(table.values()))
  assert 'diloco slow ratio 16: 0.265x BSP\'s time (goal <= 0.25): NOT met' in said
  assert any(line.startswith('diloco-hetero slow ratio 16: 0.444x fixed-H') for line in said)


def test_a_runs_curve_and_step_time_are_read_from_its_files(tmp_path):
  rows = [{'step': 20, 'loss': 3.0}, {'step': 20, 'eval_loss': 2.5}, {'step': 40, 'loss': 2.0},
          {'step': 40, 'eval_loss': 2.25}]
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows))
  assert lb.eval_curve(tmp_path) == [(20, 2.5), (40, 2.25)]
  assert lb.steps_to(lb.eval_curve(tmp_path), 2.3) == 40 and lb.steps_to([(20, 3.0)], 2) is None
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(
      {'step': s, 'loss': 1.0, 'returned_s': 10.0 + 0.5 * s + (2.0 if s > 3 else 0.0)})
      for s in range(1, 7)))
  assert lb.step_time_s(tmp_path, skip=2) == pytest.approx((13.0 + 2.0 - 11.0) / 4)
  with pytest.raises(RuntimeError, match='no step after 6'):
    lb.step_time_s(tmp_path, skip=6)
  setup = lb.Setup(inner_steps=20)
  assert setup.steps_timed('bsp') == (30, 10) and setup.steps_timed('diloco') == (80, 40)
  assert setup.steps_timed('diloco-hetero') == (160, 100)


def test_the_virtual_clock_rows_at_1024_workers():
  rows = {r['method']: r for r in lb.virtual_rows(lb.Setup(), 1024, (16.0,), 529408, rounds=6)}
  assert rows['bsp']['step_vs_bsp'] == 1.0
  # One exchange a round instead of a step, and LB-BSP's shares around the slow host.
  assert rows['diloco']['step_vs_bsp'] < 0.3
  assert rows['diloco-hetero']['step_s'] < rows['diloco']['step_s']
  assert all(r['source'] == 'virtual clock' for r in rows.values())
