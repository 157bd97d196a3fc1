"""experiments/bench_sdpipe.py: its rows and table on synthetic runs (the analysis itself,
`experiments/_sdpipe_analysis.py`, is checked piece by piece in `test_bench_analysis.py`), and its
one-line errors."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments import bench_sdpipe as bench

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _replica(step_s: float, steps: int, loss_at, k: int, distance: float) -> dict:
  """A replica's record: steps of ``step_s`` (compute step_s / 2, pause step_s / 2, no wait or
  sync), loss ``loss_at(end)``, group size ``k``."""
  ends = step_s * np.arange(1, steps + 1)
  return {'steps': [[e, loss_at(e), step_s / 2, step_s / 2, 0.0, 0.001, k] for e in ends],
          'distances': [distance] * 5}


def _info(budget_s: float) -> dict:
  def run(policy, step_s, k, distance):
    return {'round': 0, 'scenario': 's', 'policy': policy,
            'report': {'mean_group': float(k)},
            'replicas': [_replica(step_s, int(budget_s / step_s), lambda e: 1.0 / (1.0 + e), k,
                                  distance) for _ in range(bench.WORKERS)]}

  return {'config': {'scenarios': {'s': 'transient:3'}, 'policies': ['all-reduce', 'sdpipe']},
          'runs': [run('all-reduce', 0.2, 4, 0.0), run('sdpipe', 0.1, 2, 0.5)]}


def test_ratios_are_taken_against_all_reduce_of_the_same_round():
  budget = 10.0
  rows, ring_base = bench.measured_rows(_info(budget), budget)
  ar, sd = rows
  assert (ar['policy'], sd['policy']) == ('all-reduce', 'sdpipe')
  assert list(sd) == [  # --json's fields, in this order
      'scenario', 'policy', 'workers', 'source', 'rounds', 'throughput_vs_allreduce',
      'of_no_wait_limit', 'time_to_target_vs_allreduce', 'mean_group_size',
      'consensus_distance', 'throughput', 'no_wait_limit', 'target_loss',
      'time_to_target_reached']
  assert ar['throughput_vs_allreduce'] == 1.0 and ar['time_to_target_vs_allreduce'] == 1.0
  # Twice the steps per second: 4 replicas x 100 steps in 10 s against 4 x 50.
  assert sd['throughput'] == pytest.approx(40.0) and ar['throughput'] == pytest.approx(20.0)
  assert sd['throughput_vs_allreduce'] == pytest.approx(2.0)
  # No waiting in the synthetic runs: throughput equals the no-wait limit 4 / step.
  assert sd['of_no_wait_limit'] == pytest.approx(1.0)
  # The same loss curve in time: the target is reached at the same time, up to one step and
  # the smoothing window (16 steps: 4 x 0.1 s vs 4 x 0.2 s of pooled replicas).
  assert 0.8 < sd['time_to_target_vs_allreduce'] < 1.0
  assert sd['mean_group_size'] == 2.0 and sd['consensus_distance'] == 0.5
  assert ring_base == pytest.approx(0.001 / 1.5)


def test_a_policy_that_never_reaches_the_target_has_no_time_to_target():
  budget = 10.0
  info = _info(budget)
  for replica in info['runs'][1]['replicas']:
    for step in replica['steps']:
      step[1] = 5.0  # never learns
  rows, _ = bench.measured_rows(info, budget)
  assert rows[1]['time_to_target_vs_allreduce'] is None
  assert rows[1]['time_to_target_reached'] == 0
  assert '-' in bench.table(rows).splitlines()[-1]


@pytest.mark.parametrize('flag', ['--rounds=0', '--max_group=5', '--window=0', '--nope',
                                  '--policies=sdpipe', '--policies=all-reduce,magic'])
def test_bad_flags_are_one_line_and_exit_2(flag):
  result = subprocess.run([sys.executable, '-m', 'experiments.bench_sdpipe', flag],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert result.returncode == 2
  assert result.stderr.strip().count('\n') == 0 and 'bench_sdpipe.py: error:' in result.stderr
