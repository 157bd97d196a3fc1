"""bench_eager_rate's rows and summary (`experiments._eager_rate`), on a few global batches."""

from __future__ import annotations

import pytest

from experiments import _eager_rate as er


def test_rows_set_the_target_by_bsp_and_time_eager_against_it(monkeypatch):
  monkeypatch.setattr(er, 'STEPS', 6)
  monkeypatch.setattr(er, 'EAGER_STEPS', 12)
  rows = er.seed_rows('straggler', 0, rates=(1.0,))
  assert [r['rule'] for r in rows] == ['bsp', 'eager-stale-lr', 'eager-1']
  bsp = rows[0]
  assert bsp['iterations_to_target'] <= 4 and bsp['time_to_target_vs_bsp'] == 1.0
  assert len({r['target_loss'] for r in rows}) == 1
  for r in rows[1:]:   # eager iterates in about a third of bsp's time here (a 3x straggler)
    if r['iterations_to_target'] is not None:
      assert 0 < r['time_to_target_vs_bsp'] < r['iterations_to_target'] / bsp[
          'iterations_to_target']


def test_a_seed_that_never_reaches_the_target_counts_beyond_the_others():
  rows = [{'scenario': 'equal', 'rule': 'eager-1', 'seed': s, 'iterations_to_target': it,
           'time_to_target_vs_bsp': t, 'target_loss': 1.0}
          for s, (it, t) in enumerate([(50, 0.6), (70, 0.9), (None, None)])]
  (summary,) = er.summary(rows)
  assert summary['median_iterations_to_target'] == 70
  assert summary['median_time_to_target_vs_bsp'] == pytest.approx(0.9)
  assert (summary['within_bsp_steps'], summary['reached'], summary['seeds']) == (1, 2, 3)
  rows[1] |= {'iterations_to_target': None, 'time_to_target_vs_bsp': None}
  (summary,) = er.summary(rows)
  assert summary['median_iterations_to_target'] is None
  assert 'never' in er.table([summary])
