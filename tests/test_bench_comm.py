"""bench_comm's plan and analysis (`experiments._comm_bench`), without launching anything."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments import _comm_bench as cb
from hetjax.emulation import parse_links


def test_links_give_the_asked_communication_time():
  setup = cb.Setup(compute_s=0.04, model_bytes=26280)
  for ratio in (0.5, 1.0, 2.0):
    ps = parse_links(setup.ps_network(ratio), 4)
    assert 2 * ps.transfer_s(0, setup.model_bytes) == pytest.approx(ratio * 0.04, rel=1e-5)
    ar = parse_links(setup.allreduce_network(ratio), 4)
    assert ar.all_reduce_s(range(4), setup.model_bytes) == pytest.approx(ratio * 0.04, rel=1e-5)
  alpha = setup.allreduce_link(1.0, 1024).alpha_s   # latency capped at a quarter of the ring
  assert 2 * 1023 * alpha == pytest.approx(0.01)


def test_runs_interleave_every_scheme_at_each_ratio():
  runs = cb.runs(cb.Setup(), 'ps', 'straggler', (0.5, 1.0))
  assert [r['scheme'] for r in runs[:5]] == list(cb.PS_SCHEMES)
  assert [r['ratio'] for r in runs] == [0.5] * 5 + [1.0] * 5
  assert {r['hosts'] for r in runs} == {'static:1,1,1,3'}
  assert len({r['id'] for r in runs}) == len(runs)
  steps = {r['scheme']: r['steps'] for r in runs}   # eager: about the baseline's wall time
  assert steps['ps-eager'] == steps['ps-eager-stale-lr'] == 2 * steps['ps-asp'] == 80


def test_a_servers_curve_times_are_read_off_its_clock(tmp_path):
  # [global batches, loss, server clock]: times from the first global batch applied
  curve = [[0, 3.0, 0.0], [1, 2.0, 5.0]] + [[k, 1.0, 5.0 + 0.25 * k] for k in range(2, 5)]
  (tmp_path / 'final.json').write_text(json.dumps({'final_loss': 1.0, 'curve': curve}))
  assert cb.curve_seconds(tmp_path) == pytest.approx([0.0, 0.5, 0.75, 1.0])
  assert cb.curve(tmp_path) == [2.0, 1.0, 1.0, 1.0]
  (tmp_path / 'final.json').write_text(json.dumps({'final_loss': 1.0,
                                                   'curve': [[k, 1.0] for k in range(9)]}))
  assert cb.curve_seconds(tmp_path) is None   # all-reduce: no clock, its iteration time counts


def _record(scheme, iter_s, curve, final, scenario='straggler', curve_s=None):
  return {'scheme': scheme, 'scenario': scenario, 'comm_ratio': 1.0, 'workers': 4,
          'source': cb.MEASURED, 'iter_time_s': iter_s, 'final_loss': final, 'curve': curve,
          'curve_s': curve_s}


def test_compare_and_goals():
  records = [
      _record('ps-asp', 0.10, [2.0, 1.8, 1.6, 1.4, 1.2, 1.0], 1.0),
      _record('ps-bsp', 0.16, [2.0, 1.9, 1.7, 1.5, 1.3, 1.1], 1.1),   # target 1.7: its trailing
      # mean over 3 at 4 of 6 iterations
      _record('ps-asp-stale-lr', 0.10, [2.0, 1.6, 1.4, 1.2, 1.0, 0.9], 0.9),
      _record('ps-eager', 0.05, [2.0, 2.5, 3.0, math.inf, math.nan, math.nan], math.nan),
      _record('ps-eager-stale-lr', 0.05, [2.0, 1.7, 1.5, 1.4, 1.3, 1.2], 1.2,
              curve_s=[0.0, 0.04, 0.08, 0.12, 0.5, 0.9]),   # the server's clock
      _record('ps-asp', 0.10, [2.0, 1.5, 1.0], 1.0, 'equal'),
      _record('ps-bsp', 0.10, [2.0, 1.5, 1.0], 1.0, 'equal'),
      _record('ps-eager', 0.055, [2.0, 1.5, 1.0], 1.0, 'equal'),
  ]
  rows = {(r['scheme'], r['scenario']): r for r in cb.compare(records)}
  asp, slr = rows['ps-asp', 'straggler'], rows['ps-asp-stale-lr', 'straggler']
  assert asp['target_loss'] == pytest.approx(1.7) and asp['iterations_to_target'] == 4
  assert slr['iterations_to_target'] == 3 and slr['iterations_to_target_vs_baseline'] == 0.75
  # from the first global batch: 2 iterations of 0.1 s against 3 of 0.1 s
  assert slr['time_to_target_vs_baseline'] == pytest.approx(2 / 3)
  assert rows['ps-bsp', 'straggler']['iter_time_vs_baseline'] == pytest.approx(1.6)
  eager = rows['ps-eager', 'straggler']
  assert eager['diverged'] and eager['final_loss'] is None and eager['final_loss_vs_bsp'] is None
  eager_lr = rows['ps-eager-stale-lr', 'straggler']
  assert eager_lr['iterations_to_target'] == 4   # at 0.12 s on the server's clock; bsp's 4th
  assert eager_lr['time_to_target_vs_bsp'] == pytest.approx(0.12 / (3 * 0.16))  # is 3 steps on
  assert eager_lr['time_to_target_vs_baseline'] == pytest.approx(0.12 / (3 * 0.10))
  assert rows['ps-bsp', 'straggler']['time_to_target_vs_bsp'] == 1.0
  assert slr['final_loss_vs_bsp'] == pytest.approx(0.9 / 1.1)
  goals = cb.goals(list(rows.values()))
  assert goals[0].startswith('eager pull: 45% less time') and goals[0].endswith('met')
  assert 'ps-eager-stale-lr reached it in 4, ps-eager never in 6: met' in goals[1]
  assert '3 vs 4 iterations, 25% fewer: met' in goals[2]
  assert goals[3] == ('eager pull with the staleness-aware rate reaches the synchronous target '
                      '(straggler): in 4 iterations, 0.25x ps-bsp\'s time: met')
  assert 'diverged' in cb.table(list(rows.values()))


def test_virtual_records_at_a_glance():
  records = cb.virtual_records(cb.Setup(), 4, 'equal', 1.0, iterations=8, lr=0.1)
  assert [r['scheme'] for r in records] == list(cb.VIRTUAL_SCHEMES)
  by = {r['scheme']: r for r in records}
  assert by['ps-eager']['iter_time_s'] == pytest.approx(0.5 * by['ps-asp']['iter_time_s'])
  assert by['allreduce-overlap']['iter_time_s'] == pytest.approx(
      0.5 * by['allreduce-sync']['iter_time_s'])
  assert all(len(r['curve']) == (16 if r['scheme'] in cb.EAGER else 8) for r in records)
  assert all(r['source'] == cb.VIRTUAL for r in records)
  gaps = np.diff(by['ps-asp']['curve_s'])   # equal hosts: a global batch each iteration
  assert by['ps-asp']['curve_s'][0] == 0 and gaps[1:] == pytest.approx(by['ps-asp']['iter_time_s'])


def test_one_lucky_point_does_not_reach_the_target():
  """asp's curves swing (1.3, then 3.8): the target is reached by the trailing mean."""
  assert cb.first_below(cb.trailing_mean([2.0, 1.9, 1.0, 3.8, 2.0, 1.2, 1.1, 1.0]), 1.5) == 7
  assert cb.first_below([2.0, 1.9, 1.0, 3.8], 1.5) == 3
