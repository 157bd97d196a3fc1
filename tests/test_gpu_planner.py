"""The GPU check's planner part (`experiments._gpu_planner`) on one CPU device, at its quick sizes:
rows of the promised shape, positive finite times, predicted and measured kept apart."""

from __future__ import annotations

import math

import pytest

from experiments import _gpu_planner as gp


@pytest.fixture(scope='module')
def rows():
  return gp.run(quick=True)


def _finite(x) -> bool:
  return isinstance(x, float) and math.isfinite(x) and x > 0


def test_a_row_per_model_with_profiles_plan_and_times(rows):
  assert [r['model'] for r in rows] == ['gpt', 'wide_deep']
  for row in rows:
    assert row['part'] == 'planner'
    assert row['device'].startswith('cpu')
    for field in ('predicted_step_s', 'measured_step_s', 'ratio', 'device_flops_per_s'):
      assert _finite(row[field]), (row['model'], field, row[field])
    assert row['ratio'] == pytest.approx(row['predicted_step_s'] / row['measured_step_s'])
    assert row['met'] == (abs(row['ratio'] - 1) <= gp.GOAL)
    names = [s['name'] for s in row['submodels']]
    assert names and len(set(names)) == len(names)
    assert row['plan'] == ', '.join(f'{s["name"]} {s["layout"]}' for s in row['submodels'])
    for s in row['submodels']:
      for field in ('flops_per_step', 'measured_s', 'flops_per_s', 'predicted_s'):
        assert _finite(s[field]), (row['model'], s['name'], field, s[field])
      assert s['layout'] == 'dp1'  # one device: nothing to split
  assert [s['name'] for s in rows[0]['submodels']] == ['embed', 'block_0', 'head']


def test_every_number_is_labelled_measured_modelled_or_analysed_and_never_two(rows):
  for row in rows:
    labels = row['measured'] + row['modelled'] + row['analysed']
    assert len(labels) == len(set(labels))
    assert 'measured_step_s' in row['measured'] and 'predicted_step_s' in row['modelled']
    assert 'submodels[].measured_s' in row['measured']
    assert 'submodels[].predicted_s' in row['modelled']
    for label in labels:  # each names a field the row (or each sub-model) has
      if label.startswith('submodels[].'):
        assert all(label.removeprefix('submodels[].') in s for s in row['submodels']), label
      else:
        assert label in row, label


def test_markdown_has_both_tables_and_the_goal_line(rows):
  lines = gp.markdown(rows)
  assert lines[0] == '### The planner on the device'
  sub_rows = [line for line in lines if line.startswith(('| gpt | ', '| wide_deep | '))]
  assert len(sub_rows) == sum(len(r['submodels']) for r in rows) + len(rows)
  goal = [line for line in lines if line.startswith('goal: predicted within 25% of measured: ')]
  assert len(goal) == 1
  met = all(r['met'] for r in rows)
  assert goal[0].split(': ')[2].startswith('met' if met else 'not met')
