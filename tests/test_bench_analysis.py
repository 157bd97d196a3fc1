"""The benchmarks' analysis on made-up numbers with hand-computed answers (no workers launched).

`experiments/_analysis.py` (settling, reversals, limits, tiling, ranks, blocks) and the telemetry
side of `experiments/_harness.py` (a job read back by block, its limit, its share-policy rows).
"""

from __future__ import annotations

import doctest
import json
import math

import numpy as np
import pytest

from experiments import _analysis, _harness
from hetjax import ConfigError, emulation


def test_doctests():
  assert doctest.testmod(_analysis, extraglobs={'np': np}).failed == 0


# Settling and reversals. Shares are [step, worker]; a move is a change of more than a bucket.

def test_settles_after_the_last_move():
  shares = [[4, 4], [6, 2], [6, 2], [6, 2], [6, 2]]
  assert _analysis.settle(np.array(shares), bucket=1) == (1, 0)


def test_never_moving_settles_at_once_and_an_empty_tail_is_fine():
  assert _analysis.settle(np.full((6, 3), 8), bucket=2) == (0, 0)
  assert _analysis.settle(np.array([[4, 4]]), bucket=1) == (0, 0)  # one step: nothing moved


def test_a_move_near_the_end_means_never_settled():
  shares = np.array([[4, 4], [4, 4], [4, 4], [4, 4], [6, 2]])  # moves[3]: the last change
  assert _analysis.settle(shares, bucket=1) == (None, 0)
  assert _analysis.settle(shares, bucket=1, tail=0) == (4, 0)  # unless no tail must be still


def test_settling_counts_from_after_and_past_the_end_is_unknown():
  shares = np.array([[4, 4]] * 2 + [[6, 2]] * 4 + [[2, 6]] * 4)  # moves at t = 1 and t = 5
  assert _analysis.settle(shares, bucket=1) == (6, 0)
  assert _analysis.settle(shares, bucket=1, after=3) == (3, 0)  # settled at 6, counted from 3
  assert _analysis.settle(shares, bucket=1, after=6) == (0, 0)
  assert _analysis.settle(shares, bucket=1, after=10) == (None, 0)


def test_one_bucket_wobbles_are_not_moves_but_are_reversals():
  shares = np.array([[4, 4], [5, 3], [4, 4], [5, 3], [5, 3], [5, 3]])
  # Worker 0: +1, -1, +1, 0, 0 -> 2 reversals; worker 1 the mirror -> 2.
  assert _analysis.settle(shares, bucket=1) == (0, 4)
  assert _analysis.settle(shares, bucket=0, tail=0) == (3, 0)  # bucket 0: every change moves


def test_a_hold_between_opposite_moves_is_still_a_reversal():
  assert _analysis.reversals(np.array([[2], [3], [3], [2]])) == 1  # up, hold, down
  assert _analysis.reversals(np.array([[2], [3], [4], [4], [5]])) == 0  # always up
  assert _analysis.reversals(np.array([[2, 2]])) == 0


# Balanced limits with fixed costs.

def test_balanced_time_counts_fixed_costs():
  assert _analysis.balanced_time_s(400, [1, 1, 1, 3], 1e-3) == pytest.approx(0.4 / (3 + 1 / 3))
  # Each worker pays f x 30 ms first: T = (0.4 + 4 x 0.03) / (3 + 1/3) = 0.156, not 0.12 + 0.03.
  assert _analysis.balanced_time_s(400, [1, 1, 1, 3], 1e-3, fixed_s=0.03) == pytest.approx(0.156)


def test_balanced_time_leaves_out_a_worker_too_slow_to_take_rows():
  # Both: (0.1 + 0.2) / 1.1 = 0.273 < 10 x 0.1, the slow worker's fixed cost alone: so worker 0
  # takes all 100 rows, 0.1 + 0.1 = 0.2 s.
  assert _analysis.balanced_time_s(100, [1, 10], 1e-3, fixed_s=0.1) == pytest.approx(0.2)


def test_balanced_time_with_unequal_base_speeds():
  # T / 1 ms + T / 2 ms = 300 rows -> T = 0.2 s.
  assert _analysis.balanced_time_s(300, [1, 1], [1e-3, 2e-3]) == pytest.approx(0.2)


def test_effective_slowdown_is_busy_over_the_hosts_nominal_time():
  busy = np.array([[0.3, 0.9], [0.5, 0.9]])
  share = np.array([[100, 100], [200, 100]])
  np.testing.assert_allclose(_analysis.effective_slowdown(busy, share, 2e-3, 0.1),
                             [[1, 3], [1, 3]])


# Tiling a 4-worker pattern over a larger cluster.

def test_tiling_static_and_step_patterns():
  assert _analysis.tile_trace(emulation.StaticTrace((1, 1, 1, 3)), 8).values == (1, 1, 1, 3) * 2
  step = _analysis.tile_trace(emulation.StepChangeTrace(2, (1, 1), (1, 3)), 4)
  np.testing.assert_array_equal(step.factors(1), [1, 1, 1, 1])
  np.testing.assert_array_equal(step.factors(2), [1, 3, 1, 3])
  parsed = emulation.parse_trace('step:20:1,1,1,1:1,1,1,3', 4)
  assert _analysis.tile_trace(parsed, 64).factors(20).sum() == 48 + 16 * 3


def test_tiling_markov_gives_every_worker_its_own_chain():
  base = emulation.MarkovTrace(2, slow=3.0, stay=0.9, seed=1)
  tiled = _analysis.tile_trace(base, 6)
  assert tiled.workers == 6
  rows = np.array([tiled.factors(t) for t in range(200)])
  np.testing.assert_array_equal(rows[:, :2], [base.factors(t) for t in range(200)])
  assert not (rows[:, 2:4] == rows[:, :2]).all()  # not a copy of the first two
  some = _analysis.tile_trace(emulation.MarkovTrace(2, 3.0, 0.9, slow_workers=(1,)), 4)
  assert some.slow_workers == (1, 3)


def test_tiling_products_and_refusals():
  spec = 'static:1,2*transient:3:0.5'
  tiled = _analysis.tile_trace(emulation.parse_trace(spec, 2), 4)
  np.testing.assert_array_equal(tiled.factors(0), [1, 2, 1, 2])
  assert tiled.workers == 4
  with pytest.raises(ConfigError, match='over 6 workers'):
    _analysis.tile_trace(emulation.StaticTrace((1, 1, 1, 3)), 6)
  with pytest.raises(ConfigError, match='cannot tile'):
    _analysis.tile_trace(emulation.CsvTrace(np.ones((3, 2))), 4)


# Rank correlation: average ranks for ties, duplicate programs once.

def test_average_ranks():
  np.testing.assert_array_equal(_analysis.average_ranks([10, 20, 20, 30]), [1, 2.5, 2.5, 4])
  np.testing.assert_array_equal(_analysis.average_ranks([3, 1, 2]), [3, 1, 2])
  np.testing.assert_array_equal(_analysis.average_ranks([5, 5, 5]), [2, 2, 2])
  np.testing.assert_array_equal(_analysis.average_ranks([2, 1, 2, 1]), [3.5, 1.5, 3.5, 1.5])


def test_rank_correlation_without_and_with_ties():
  assert _analysis.rank_correlation([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(1.0)
  assert _analysis.rank_correlation([1, 2, 3, 4], [8, 7, 6, 5]) == pytest.approx(-1.0)
  # No ties: 1 - 6 Σd² / (n (n² - 1)) = 1 - 6 x 2 / 60.
  assert _analysis.rank_correlation([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
  # Ties: ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4): covariance 4.5 / sqrt(4.5 x 5).
  assert _analysis.rank_correlation([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(
      4.5 / math.sqrt(22.5))
  # argsort-of-argsort ranks would break the tie by position and give 1.0 here.
  assert _analysis.rank_correlation([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)


def test_rank_correlation_is_undefined_for_one_point_or_all_ties():
  assert math.isnan(_analysis.rank_correlation([1], [2]))
  assert math.isnan(_analysis.rank_correlation([1, 1, 1], [1, 2, 3]))
  with pytest.raises(ConfigError):
    _analysis.rank_correlation([1, 2], [1, 2, 3])


def _plan(plan: str, layouts: str, measured: float, predicted: float) -> dict:
  return {'model': 'lm', 'plan': plan, 'layouts': {'blocks': layouts},
          'measured_step_s': measured, 'predicted_step_s': predicted}


def test_duplicate_programs_are_counted_once():
  rows = [_plan('planner', 'dp8', 1.0, 1.0), _plan('pure_dp', 'dp8', 1.2, 1.0),
          _plan('hybrid', 'dp2xtp4', 2.0, 3.0), _plan('pure_mp', 'tp8', 3.0, 2.0)]
  distinct = _analysis.merge_duplicates(rows, _analysis.layouts_key,
                                        ('measured_step_s', 'predicted_step_s'))
  assert [(r['plan'], r['copies']) for r in distinct] == [('planner', 2), ('hybrid', 1),
                                                          ('pure_mp', 1)]
  assert distinct[0]['measured_step_s'] == pytest.approx(1.1)
  # Ranks: measured (1, 2, 3), predicted (1, 3, 2): 1 - 6 x 2 / (3 x 8) = 0.5, over n = 3.
  rho, n = _analysis.rank_correlation_of_programs(rows, 'predicted_step_s', 'measured_step_s')
  assert (rho, n) == (pytest.approx(0.5), 3)
  # Counted twice, the tied pair would weigh double: a different, wrong answer.
  twice = _analysis.rank_correlation([r['predicted_step_s'] for r in rows],
                                     [r['measured_step_s'] for r in rows])
  assert twice != pytest.approx(0.5)


def test_the_same_layouts_under_another_model_are_another_program():
  rows = [_plan('a', 'dp8', 1.0, 1.0), _plan('b', 'dp8', 2.0, 2.0) | {'model': 'other'}]
  assert _analysis.rank_correlation_of_programs(rows, 'predicted_step_s',
                                                'measured_step_s')[1] == 2


# Blocks, interleaving, calibration arithmetic.

SCHEDULE = [{'policy': 'a', 'first_step': 1, 'last_step': 3},
            {'policy': 'b', 'first_step': 4, 'last_step': 6},
            {'policy': 'a', 'first_step': 7, 'last_step': 9}]


def test_block_rows_by_name_skip_and_after_step():
  steps = tuple(range(1, 10))
  np.testing.assert_array_equal(_analysis.block_rows(SCHEDULE, steps, 'a'), [0, 1, 2, 6, 7, 8])
  np.testing.assert_array_equal(_analysis.block_rows(SCHEDULE, steps, 'a', skip=1), [1, 2, 7, 8])
  np.testing.assert_array_equal(_analysis.block_rows(SCHEDULE, steps, 'a', after_step=2),
                                [2, 6, 7, 8])
  scenarios = [dict(b, scenario=b.pop('policy')) for b in map(dict, SCHEDULE)]
  np.testing.assert_array_equal(_analysis.block_rows(scenarios, steps, 'b', key='scenario'),
                                [3, 4, 5])
  with pytest.raises(ConfigError, match='not in the telemetry'):
    _analysis.block_rows(SCHEDULE, steps[:-1], 'a')


def test_round_order_rotates_or_stays():
  names = ['a', 'b', 'c']
  assert [_analysis.round_order(names, r) for r in range(4)] == [
      ['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['a', 'b', 'c']]
  assert _analysis.round_order(names, 1, rotate=False) == names


def test_interleave_runs_every_block_once_per_round_in_rotating_order():
  ran = []
  blocks = {name: (lambda name=name: ran.append(name) or len(ran)) for name in ('x', 'y')}
  results = _harness.interleave(blocks, rounds=3)
  assert ran == ['x', 'y', 'y', 'x', 'x', 'y']
  assert results == {'x': [1, 4, 5], 'y': [2, 3, 6]}


def test_two_point_cost():
  # 512 rows in 61.2 ms, 128 in 22.8 ms: 0.1 ms a row and 10 ms a call, in either order.
  for points in ((512, 0.0612, 128, 0.0228), (128, 0.0228, 512, 0.0612)):
    per_row, fixed = _analysis.two_point_cost(*points)
    assert (per_row, fixed) == (pytest.approx(1e-4), pytest.approx(0.01))
  assert _analysis.two_point_cost(512, 0.1, 128, 0.01)[1] == 0.0  # intercept clamped at 0
  assert _analysis.two_point_cost(512, 0.01, 128, 0.02) == (pytest.approx(1e-3 * 0.01 / 512),
                                                            pytest.approx(0.02 - 0.128 * 0.01 / 512))
  with pytest.raises(ConfigError):
    _analysis.two_point_cost(128, 0.1, 128, 0.2)


# A job read back from made-up telemetry: 2 workers, hosts of 1 ms a row + 10 ms a step.

ROW_S, FIXED_S = 1e-3, 0.01


def _write_job(path, blocks) -> None:
  """Two workers; per step (policy, shares, slowdowns); busy = slowdown x host time, comm 5 ms,
  no data time, everyone's step = the slowest busy + comm."""
  lines, schedule, shares, step = [], [], {}, 0
  for name, steps in blocks:
    first = step + 1
    for rows, slow in steps:
      step += 1
      busy = [s * (FIXED_S + r * ROW_S) for r, s in zip(rows, slow, strict=True)]
      for w in range(2):
        lines.append({'step': step, 'worker': w, 'share': rows[w], 'slowdown': slow[w],
                      'data_s': 0.0, 'compute_s': busy[w] / 2, 'dilation_s': busy[w] / 2,
                      'comm_s': 0.005, 'wait_s': max(busy) - busy[w],
                      'step_s': max(busy) + 0.005, 'compile_s': 0.0, 'load': slow[w],
                      'overrun_s': 0.002 if (step, w) == (2, 1) else 0.0})
      shares.setdefault(name, []).append(list(rows))
    schedule.append({'policy': name, 'first_step': first, 'last_step': step})
  path.mkdir()
  (path / 'telemetry.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
  (path / 'schedule.json').write_text(json.dumps(schedule))
  (path / 'run.json').write_text(json.dumps({
      'workers': 2, 'bucket': 10, 'host_row_s': ROW_S, 'host_fixed_s': FIXED_S,
      'shares': shares, 'grad_bytes': 0, 'allreduce': {'alpha_s': 0.0, 'beta_bytes_per_s': 1.0}}))


def test_a_job_by_block_its_fixed_cost_limit_and_its_rows(tmp_path):
  slow = (1, 3)
  uniform = [((100, 100), slow)] * 3
  balanced = [((100, 100), slow)] + [((140, 60), slow)] * 5
  _write_job(tmp_path / 'job', [('uniform', uniform), ('lbbsp-ewma', balanced)])
  job = _harness.JobRun.load(tmp_path / 'job')
  assert job.names() == ['uniform', 'lbbsp-ewma']
  np.testing.assert_array_equal(job.rows('lbbsp-ewma', skip=1), [4, 5, 6, 7, 8])
  idx = job.rows('uniform')
  np.testing.assert_allclose(job.iteration_s(idx), 3 * 0.11 + 0.005)
  # The limit with fixed costs: T/1 + T/3 = 200 ms + 2 x 10 ms -> T = 0.165 s (X / Σv would
  # say 0.15); plus 5 ms sync.
  np.testing.assert_allclose(job.limit_s(idx), 0.165 + 0.005)
  assert 'overruns: 1 of 18 worker-steps, max 2.0 ms (per worker 0 1)' in job.host_line()
  rows = _harness.share_policy_rows(job, 'static')
  assert [tuple(r) for r in rows] == [_harness.SHARE_ROW_FIELDS] * 2
  u, b = rows
  # lbbsp: one step of 0.335 s, then five of 3 x (10 + 60 ms) + 5 ms = 0.215 s: median 0.215.
  # Its limit: the same slowdowns, the same 0.17 s.
  assert b['iter_s'] == pytest.approx(0.215) and u['iter_s'] == pytest.approx(0.335)
  assert b['limit_s'] == pytest.approx(0.17)
  assert b['speedup_vs_uniform'] == pytest.approx(0.335 / 0.215)
  assert b['fraction_of_ideal_speedup'] == pytest.approx(0.17 / 0.215)
  assert b['ratio_to_limit'] == pytest.approx(0.215 / 0.17)
  # Shares (100, 100) -> (140, 60): one move of 40 rows > a bucket of 10, then still.
  assert (b['settle_iterations'], b['reversals_after_settle']) == (1, 0)
  assert (u['settle_iterations'], u['compile_overhead_share'], u['source']) == (0, 0.0,
                                                                              'measured')


def test_host_costs_are_the_hosts_with_the_measured_host_time(tmp_path):
  _write_job(tmp_path / 'job', [('uniform', [((100, 100), (1, 1))] * 3)])
  job = _harness.JobRun.load(tmp_path / 'job')
  cost = _harness.host_costs(job, job.rows('uniform'))
  assert (cost.per_sample_s, cost.fixed_s) == (ROW_S, FIXED_S)
  assert cost.host_s == pytest.approx(0.005)  # iteration - slowest busy, no all-reduce modelled
