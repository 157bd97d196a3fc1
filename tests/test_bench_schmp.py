"""bench_schmp's pieces that need no run: blocks sized by speed, and the goal lines read from
hand-made rows."""

import itertools

import numpy as np
import pytest

from experiments import _schmp_bench, _schmp_launched, _schmp_report
from tests.conftest import require_devices


@pytest.mark.parametrize('work, weights', [
    (np.ones(10), [1, 1, 3]),
    (np.arange(1, 41), [1, 1, 1, 1 / 3]),
    (np.random.default_rng(0).zipf(1.5, 1000).clip(max=500), [1, 1, 1, 1 / 3]),
    (np.array([100, 1, 1, 1]), [1, 1, 1, 1]),
])
def test_shares_by_work_follow_the_weights_in_contiguous_units(work, weights):
  shares = _schmp_launched.shares_by_work(work, weights)
  assert len(shares) == len(weights) and sum(shares) == len(work) and min(shares) >= 1
  edges = np.concatenate([[0], np.cumsum(shares)])
  got = np.array([work[a:b].sum() for a, b in itertools.pairwise(edges)])
  ideal = work.sum() * np.asarray(weights) / np.sum(weights)
  # Each boundary is within one unit of the ideal cumulative split, so each worker's work is
  # within two units of its ideal (the minimum of one unit each aside).
  assert np.all(np.abs(got - ideal) <= 2 * work.max())


def test_shares_by_work_exactly():
  assert _schmp_launched.shares_by_work(np.ones(10), [1, 1, 3]) == (2, 2, 6)
  assert _schmp_launched.shares_by_work(np.ones(12), [1, 1, 1, 1 / 3]) == (4, 4, 3, 1)
  assert _schmp_launched.shares_by_work(np.array([100, 1, 1, 1]), [1] * 4) == (1, 1, 1, 1)
  # One heavy unit spans two workers' targets: each still gets a unit.
  assert _schmp_launched.shares_by_work(np.array([1, 100, 1, 1, 1]), [1] * 4) == (2, 1, 1, 1)


def _row(app, scheduler, workers, rounds, seconds=None, final=1.0, diverged=False, size=None,
         design='correlated', reference=1.0):
  return {'app': app, 'design': design, 'scheduler': scheduler, 'workers': workers,
          'schedule_size': size or (32 if scheduler == 'schmp' else workers),
          'source': _schmp_bench.SOURCE, 'rounds_to_target': rounds, 'time_to_target_s': seconds,
          'rounds_run': rounds or 600, 'final_objective': final,
          'reference_objective': reference, 'diverged': diverged}


def test_the_goal_lines_say_met_or_not_with_the_numbers():
  rows = [_row('lasso', 'schmp', 1, 60, final=1.0005), _row('lasso', 'shotgun', 1, None),
          _row('lasso', 'schmp', 2, 60), _row('lasso', 'shotgun', 2, 90),
          _row('lasso', 'schmp', 8, 60), _row('lasso', 'shotgun', 8, None, final=None,
                                                diverged=True),
          _row('lda', 'schmp', 4, 24, 1.0, final=7.0, design='d', reference=None)
          | {'sweeps_to_schmp_final': 10},
          _row('lda', 'unscheduled', 4, 8, 2.0, final=7.2, design='d', reference=None)
          | {'sweeps_to_schmp_final': None},
          _row('lda', 'unscheduled-rounds', 4, 30, 1.5, final=7.1, design='d', reference=None)
          | {'sweeps_to_schmp_final': 12},
          _row('mf', 'schmp', 4, 40, 3.0, final=0.11, design='d', reference=None),
          _row('mf', 'unscheduled', 4, 40, 2.0, final=0.10, design='d', reference=None)]
  lines = _schmp_report.goals(rows)
  assert lines[0] == ('lasso correlated P=1: Shotgun not there after 600 rounds: ≥ 10.0x '
                      'fewer, met; SchMP vs scikit-learn 5.0e-04')
  assert '1.50x fewer rounds: NOT met' in lines[1]
  assert 'Shotgun diverged; SchMP converged: met' in lines[2]
  assert lines[3].startswith('lda d P=4: to target 1.00 s vs 2.00 s (met)') and 'no worse' in lines[3]
  assert lines[3].endswith("; unscheduled-rounds 1.50 s, 1.50x SchMP's (ends 7.1); sweeps to "
                           "SchMP's final 7: SchMP 10, unscheduled —, unscheduled-rounds 12")
  assert '(NOT met)' in lines[4] and '(worse)' in lines[4]


def test_the_svm_and_cdmf_rows_have_their_goal_lines():
  rows = [_row('svm', 'schmp', 4, 170, 1.0, final=1.0004, design='one-group'),
          _row('svm', 'shotgun', 4, 380, 2.0, design='one-group'),
          _row('cdmf', 'schmp', 4, 3000, 8.0, final=132.0, design='zipf-20k', reference=None,
               size=4),
          _row('mf', 'schmp', 4, 160, 1.0, final=136.0, design='zipf-20k', reference=None,
               size=4)]
  lines = _schmp_report.goals(rows)
  assert lines[0] == ('svm one-group P=4: 2.24x fewer rounds: met; SchMP vs scikit-learn '
                      '4.0e-04')
  assert lines[1].startswith('cdmf zipf-20k P=4: CD-MF vs SGD-MF to target 8.00 s vs 1.00 s '
                             '(SGD-MF first), ends 132 vs 136')
  table = _schmp_report.table(rows)
  assert 'cdmf' in table and 'svm' in table


def test_the_bench_lists_the_new_apps_and_their_designs():
  assert {d.app for d in _schmp_bench.designs(quick=True)} >= {'svm'}
  assert all(d.cap for d in _schmp_bench.designs(quick=False) if d.app == 'svm')
  [pair] = _schmp_bench.mf_pairs(quick=True)
  assert pair.workers == 4 and pair.args == {}


def test_lda_static_rows_run_three_schedulers_and_the_longer_baselines():
  require_devices(2)
  static = _schmp_bench.Static('lda', 'tiny', 'unscheduled',
                               dict(topics=4, documents=64, vocabulary=200), 2,
                               _schmp_bench.LDA_ROUNDS)
  rows = {r['scheduler']: r for r in _schmp_bench.static_rows(static, [2], repeats=1)}
  assert set(rows) == {'schmp', 'unscheduled', 'unscheduled-rounds'}
  assert rows['schmp']['rounds_run'] == 4 and rows['unscheduled']['rounds_run'] == 2
  assert rows['unscheduled-rounds']['rounds_run'] == 4       # P rounds a sweep, as SchMP's
  assert rows['schmp']['sweeps_to_schmp_final'] == 2
  for name in ('unscheduled', 'unscheduled-rounds'):        # reached within 4x, or None
    got = rows[name]['sweeps_to_schmp_final']
    assert got is None or 1 <= got <= _schmp_bench.LONGER * 2
