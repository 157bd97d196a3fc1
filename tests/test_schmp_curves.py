"""A SchMP run's objective against rounds and time: the benchmark's driver and the report's
objective plot."""

import json
import math

import numpy as np
import pytest

from experiments import _schmp_runs
from hetjax import ConfigError, report
from tests.conftest import require_devices
from tests.test_schmp_program import BlockMeans, Cycle


class _Means(BlockMeans):
  scheduler = 'cycle'

  def policy(self, size, seed):
    return Cycle(self.blocks, per=size, size=size)


def _app():
  return _Means(np.random.default_rng(1).normal(size=(16, 6)).astype(np.float32))


def test_a_curve_records_the_objective_every_k_rounds_and_stops_at_its_target():
  app = _app()
  curve = _schmp_runs.run_curve(app, require_devices(2), 2, rounds=6, every=1)
  assert curve.rounds == (0, 1, 2, 3, 4, 5, 6) and not curve.diverged
  best = float(((app.x - app.x.mean(0)) ** 2).sum())
  assert curve.final == pytest.approx(best, rel=1e-5)
  assert all(a <= b + 1e-4 for a, b in zip(curve.objective[1:], curve.objective, strict=False))
  assert list(curve.seconds) == sorted(curve.seconds)
  rounds, seconds = _schmp_runs.reach(curve, best * (1 + 1e-4))
  assert rounds == 3 and seconds == curve.seconds[3]  # 6 blocks, 2 a round
  assert _schmp_runs.reach(curve, best / 2) == (None, None)
  stopped = _schmp_runs.run_curve(app, require_devices(2), 2, rounds=6, every=1,
                                  stop_below=best * (1 + 1e-4))
  assert stopped.rounds[-1] == 3


def test_common_target_is_the_worst_best_of_the_curves_that_did_not_diverge():
  c = _schmp_runs.Curve
  good = c((0, 5), (10.0, 2.0), (0.0, 1.0), False)
  slow = c((0, 5), (10.0, 3.0), (0.0, 1.0), False)
  gone = c((0, 5), (10.0, math.nan), (0.0, 1.0), True)
  assert _schmp_runs.common_target([good, slow, gone], slack=0.0) == 3.0
  assert math.isnan(_schmp_runs.common_target([gone]))


def test_the_report_reads_and_plots_an_objective(tmp_path):
  rows = [{'step': 1, 'loss': None, 'time_s': 0.5, 'returned_s': 0.1},
          {'step': 2, 'loss': 4.0, 'time_s': 0.5, 'returned_s': 0.2},
          {'step': 3, 'loss': 1.0, 'time_s': 0.9, 'returned_s': 0.3}]
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
  curve = report.load_objective(tmp_path)
  assert curve.rounds.tolist() == [2, 3] and curve.seconds.tolist() == [0.2, 0.3]
  assert curve.first_reaching(2.0) == (3, 0.3) and curve.diverged_by is None
  assert report.plot_objective(curve, tmp_path / 'o.png').stat().st_size > 1000
  # The last round always evaluates: null there is an objective that stopped being finite.
  rows.append({'step': 4, 'loss': None, 'time_s': 1.0, 'returned_s': 0.4})
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
  assert report.load_objective(tmp_path).diverged_by == 4
  assert report.plot_objective(curve, tmp_path / 'o.png').stat().st_size > 1000
  (tmp_path / 'metrics.jsonl').write_text('{"step": 1}\n')
  with pytest.raises(ConfigError, match=r'metrics\.jsonl:1: not a metrics line'):
    report.load_objective(tmp_path)
  with pytest.raises(ConfigError, match=r'no metrics\.jsonl in'):
    report.load_objective(tmp_path / 'nowhere')
