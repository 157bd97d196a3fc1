"""The benchmarks' analysis on made-up numbers with hand-computed answers (no workers launched).

`experiments/_analysis.py` (settling, reversals, limits, tiling, ranks, blocks), the telemetry
side of `experiments/_harness.py` (a job read back by block, its limit, its share-policy rows) and
`experiments/_sdpipe_analysis.py` (pooled loss curves, time to target, per-round ratios, medians).
"""

from __future__ import annotations

import doctest
import json
import math

import numpy as np
import pytest

from experiments import _analysis, _harness, _sdpipe_analysis
from hetjax import ConfigError, emulation


def test_doctests():
  assert doctest.testmod(_analysis, extraglobs={'np': np}).failed == 0
  assert doctest.testmod(_sdpipe_analysis, extraglobs={'np': np}).failed == 0


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
  assert ('overruns: 1 of 18 worker-steps, max 2.0 ms (per worker 0 1; per policy uniform 1, '
          'lbbsp-ewma 0)') in job.host_line()
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


# SDPipe's runs: replicas' step records [end, loss, compute, pause, wait, sync, group size].

def _steps(ends, losses, compute=0.05, pause=0.05, sync=0.0, group=4) -> list[list[float]]:
  return [[e, loss, compute, pause, 0.0, sync, group] for e, loss in zip(ends, losses, strict=True)]


def test_pooled_loss_curve_pools_replicas_in_time_order_and_smooths():
  replicas = [{'steps': _steps([0.1, 0.3, 0.5], [6.0, 4.0, 2.0])},
              {'steps': _steps([0.2, 0.4], [5.0, 3.0])}]
  ends, loss = _sdpipe_analysis.pooled_loss_curve(replicas, window=3)
  # Pooled: 6, 5, 4, 3, 2 at 0.1 … 0.5; means of 3: (6+5+4)/3 = 5 at 0.3, 4 at 0.4, 3 at 0.5.
  np.testing.assert_allclose(ends, [0.3, 0.4, 0.5])
  np.testing.assert_allclose(loss, [5.0, 4.0, 3.0])
  ends, loss = _sdpipe_analysis.pooled_loss_curve(replicas, window=6)  # 5 steps: no point yet
  assert ends.size == loss.size == 0


def test_time_to_a_target_is_the_first_point_at_or_below_it():
  curve = (np.array([1.0, 2.0, 3.0, 4.0]), np.array([5.0, 3.0, 4.0, 2.0]))
  assert _sdpipe_analysis.time_to(curve, 3.0) == 2.0  # at or below: 3.0 counts
  assert _sdpipe_analysis.time_to(curve, 2.5) == 4.0  # the bump at 3.0 s does not
  assert _sdpipe_analysis.time_to(curve, 1.0) is None


def test_loss_before_takes_the_last_point_strictly_before():
  curve = (np.array([1.0, 2.0, 3.0]), np.array([5.0, 4.0, 3.0]))
  assert _sdpipe_analysis.loss_before(curve, 2.0) == 5.0  # the point at 2.0 is not before
  assert _sdpipe_analysis.loss_before(curve, 9.0) == 3.0
  with pytest.raises(ConfigError, match='no smoothed loss before 1 s'):
    _sdpipe_analysis.loss_before(curve, 1.0)


def test_ring_base_inverts_the_ring_all_reduce():
  assert _sdpipe_analysis.ring_base_s(0.003, 4) == pytest.approx(0.002)  # 2 x 3/4 = 1.5
  assert _sdpipe_analysis.ring_base_s(0.001, 2) == pytest.approx(0.001)  # 2 x 1/2 = 1


def test_run_measures_throughput_limit_full_syncs_and_consensus():
  # Replica 0: 4 steps of 0.1 + 0.1 s (one ends past the 0.7 s budget), full syncs of 10 and
  # 30 ms; replica 1: 2 steps of 0.3 + 0.1 s, a pair sync of 50 ms left out of full syncs.
  r0 = {'steps': [[0.2, 1.0, 0.1, 0.1, 0.0, 0.01, 4], [0.4, 1.0, 0.1, 0.1, 0.0, 0.03, 4],
                  [0.6, 1.0, 0.1, 0.1, 0.0, 0.0, 1], [0.8, 1.0, 0.1, 0.1, 0.0, 0.0, 1]],
        'distances': [0.0, 0.2]}
  r1 = {'steps': [[0.4, 1.0, 0.3, 0.1, 0.0, 0.05, 2], [0.8, 1.0, 0.3, 0.1, 0.0, 0.05, 2]],
        'distances': [0.4, 0.6]}
  m = _sdpipe_analysis.run_measures({'report': {'mean_group': 2.5}, 'replicas': [r0, r1]},
                                    budget_s=0.7, workers=4, window=2)
  assert m['throughput'] == pytest.approx(4 / 0.7)  # 3 + 1 steps end by 0.7 s
  assert m['no_wait_limit'] == pytest.approx(1 / 0.2 + 1 / 0.4)  # 5 + 2.5 steps/s
  assert m['full_sync_s'] == pytest.approx(0.02)
  assert m['consensus_distance'] == pytest.approx(0.3)
  assert m['mean_group_size'] == 2.5
  assert m['curve'][0].tolist() == [0.4, 0.4, 0.6, 0.8, 0.8]  # 6 pooled steps, window 2
  no_full = {'report': {'mean_group': 2.0}, 'replicas': [r1]}
  assert _sdpipe_analysis.run_measures(no_full, 0.7, workers=4)['full_sync_s'] is None


def _measures(throughput, limit, ends, loss) -> dict:
  return {'throughput': throughput, 'no_wait_limit': limit, 'mean_group_size': 2.0,
          'consensus_distance': 0.1, 'curve': (np.array(ends), np.array(loss))}


def test_vs_allreduce_ratios_and_the_target_from_all_reduce():
  ar = _measures(10.0, 20.0, [1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0])
  run = _measures(15.0, 20.0, [1.0, 2.0, 3.0], [3.5, 2.5, 1.5])
  # Target: all-reduce's loss before 2.5 s = 3.0, which it reaches at 2 s and the run at 2 s
  # (2.5 <= 3.0): ratio 1.0.
  row = _sdpipe_analysis.vs_allreduce(run, ar, target_s=2.5)
  assert row['target_loss'] == 3.0 and row['time_to_target_vs_allreduce'] == 1.0
  assert row['throughput_vs_allreduce'] == 1.5 and row['of_no_wait_limit'] == 0.75
  # Before 3.5 s: 2.0, reached at 3 s by all-reduce and never by a run stuck at 2.5.
  stuck = _measures(15.0, 20.0, [1.0, 2.0], [2.5, 2.5])
  assert _sdpipe_analysis.vs_allreduce(stuck, ar, 3.5)['time_to_target_vs_allreduce'] is None


def test_median_over_rounds_is_none_if_any_round_is():
  per_round = [{'a': 1.0, 'b': 2.0}, {'a': 3.0, 'b': None}, {'a': 8.0, 'b': 1.0}]
  assert _sdpipe_analysis.median_over_rounds(per_round) == {'a': 3.0, 'b': None}
  assert _sdpipe_analysis.median_over_rounds(per_round[:1] + per_round[2:]) == {'a': 4.5,
                                                                              'b': 1.5}


def _run(round_, policy, step_s, loss_scale=1.0) -> dict:
  """Two identical replicas stepping every ``step_s`` through a 1 s budget, the k-th step's
  loss 1 / (1 + k) (× loss_scale); syncs of 3 ms, of both replicas under all-reduce."""
  group = 2 if policy == 'all-reduce' else 1
  k = np.arange(1, round(1 / step_s) + 1)
  replica = {'steps': _steps(step_s * k, loss_scale / (1.0 + k), step_s / 2, step_s / 2,
                             sync=0.003, group=group), 'distances': [0.0]}
  return {'round': round_, 'scenario': 's', 'policy': policy,
          'report': {'mean_group': float(group)}, 'replicas': [replica, replica]}


def test_measured_rows_take_medians_of_same_round_ratios():
  info = {'config': {'scenarios': {'s': 'transient:1'}, 'policies': ['all-reduce', 'fast']},
          'runs': [_run(0, 'all-reduce', 0.1), _run(0, 'fast', 0.05),
                   _run(1, 'all-reduce', 0.2), _run(1, 'fast', 0.05),
                   _run(2, 'all-reduce', 0.1), _run(2, 'fast', 0.1)]}
  rows, base = _sdpipe_analysis.measured_rows(info, budget_s=1.0, workers=2, window=2)
  ar, fast = rows
  assert [r['policy'] for r in rows] == ['all-reduce', 'fast']
  assert (ar['rounds'], ar['workers'], ar['source']) == (3, 2, 'measured')
  # Steps in 1 s (2 replicas): all-reduce 20, 10, 20; fast 40, 40, 20 -> ratios 2, 4, 1.
  assert fast['throughput_vs_allreduce'] == 2.0 and fast['throughput'] == 40.0
  assert ar['throughput_vs_allreduce'] == 1.0 and ar['throughput'] == 20.0
  # Window 2 over pairs of equal losses: all-reduce's last point before 0.6 s is step 5's loss
  # (step 2's at 0.2 s steps), reached at step 5 (2) by both: ratios 0.25 / 0.5, 0.1 / 0.4, 1.
  assert fast['time_to_target_vs_allreduce'] == 0.5 and fast['time_to_target_reached'] == 3
  # All-reduce's full syncs (groups of 2) of 3 ms: ring base 3 ms / (2 x 1/2).
  assert base == pytest.approx(0.003)
  info['runs'][3] = _run(1, 'fast', 0.05, loss_scale=100.0)  # round 1: never reaches it
  rows, _ = _sdpipe_analysis.measured_rows(info, budget_s=1.0, workers=2, window=2)
  assert rows[1]['time_to_target_vs_allreduce'] is None
  assert rows[1]['time_to_target_reached'] == 2


def _unequal_row(model, plan, measured, predicted, layouts, bytes_=1e6):
  return {'model': model, 'plan': plan, 'cluster': 'unequal', 'source': 'measured',
          'slowdown': 'static:1,1,3,3',
          'layouts': layouts, 'stages': 1, 'bytes_per_device': bytes_,
          'measured_step_s': measured, 'predicted_step_s': predicted,
          'actions_past_host_time': 0}


def test_fela_unequal_goals_on_hand_made_rows():
  from experiments import _fela_unequal

  rows = [_unequal_row('wide_deep', 'planner', 0.20, 0.10, {'a': 'tp4@0,1'}, 2e6),
          _unequal_row('wide_deep', 'hybrid', 0.60, 0.30, {'a': 'dp2×tp4@0,1,2,3'}),
          _unequal_row('wide_deep', 'pure_dp', 2.00, 1.40, {'a': 'dp8@0,1,2,3'}),
          _unequal_row('wide_deep', 'pure_mp', 0.30, 0.20, {'a': 'tp8@0,1,2,3'}, 3e6)]
  rho, n = _analysis.rank_correlation_of_programs(rows, 'predicted_step_s', 'measured_step_s')
  for r in rows:
    r['rank_correlation'], r['rank_correlation_n'] = rho, n
  [line] = _fela_unequal.goals(rows)
  assert line.startswith("wide_deep (unequal): planner 0.667x the best baseline's time (pure_mp")
  assert '10.00x faster than pure data parallel' in line
  assert 'rho 1.00 over 4 programs (goal >= 0.8: met)' in line
  assert 'wide & deep >= 1.3x pure DP: met' in line
  assert 'pure_dp' in _fela_unequal.table(rows) and '10.00x' in _fela_unequal.table(rows)
  # A planner slower than a baseline by more than 3%: not met.
  rows[0]['measured_step_s'] = 0.32
  assert 'goal <= 1.03: NOT met' in _fela_unequal.goals(rows)[0]
