"""Pipeline schedules and stage splits, pure Python (no devices).

The schedules must run every pass once without deadlock, GPipe's bubble must match the textbook
(S − 1)/(M + S − 1), and 1F1B must take as long while holding fewer activations. `split_stages`
must find the least bottleneck any cut positions give, checked against brute force.
"""

import dataclasses
import itertools
import random
from fractions import Fraction

import pytest

from hetjax import ConfigError
from hetjax.pipeline import Action, Schedule, gpipe, one_f_one_b, split_stages, time_schedule

SIZES = [(s, m) for s in range(1, 6) for m in range(1, 10)]
BUILDERS = [gpipe, one_f_one_b]


def _replace_stage(schedule, s, actions):
  per_stage = list(schedule.per_stage)
  per_stage[s] = tuple(actions)
  return dataclasses.replace(schedule, per_stage=tuple(per_stage))


# --- schedules ------------------------------------------------------------------------------


@pytest.mark.parametrize('build', BUILDERS)
@pytest.mark.parametrize(('stages', 'micro'), SIZES)
def test_schedules_validate(build, stages, micro):
  schedule = build(stages, micro)
  schedule.validate()
  assert (schedule.stages, schedule.micro_batches) == (stages, micro)
  assert all(len(actions) == 2 * micro for actions in schedule.per_stage)


@pytest.mark.parametrize(('forward', 'backward'), [(1.0, 1.0), (1.0, 2.0), (0.7, 1.3)])
@pytest.mark.parametrize(('stages', 'micro'), SIZES)
def test_gpipe_bubble_and_1f1b_makespan(stages, micro, forward, backward):
  g = time_schedule(gpipe(stages, micro), forward, backward)
  f = time_schedule(one_f_one_b(stages, micro), forward, backward)
  assert g.makespan_s == pytest.approx((micro + stages - 1) * (forward + backward))
  assert g.bubble_fraction == pytest.approx((stages - 1) / (micro + stages - 1))
  assert f.makespan_s == pytest.approx(g.makespan_s)
  assert f.bubble_fraction == pytest.approx(g.bubble_fraction)
  assert g.peak_in_flight == (micro,) * stages
  assert f.peak_in_flight == tuple(min(stages - s, micro) for s in range(stages))


def test_one_micro_batch_runs_every_pass_in_turn():
  forward, backward = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
  for build in BUILDERS:
    result = time_schedule(build(3, 1), forward, backward)
    assert result.makespan_s == pytest.approx(21.0)
    assert result.bubble_fraction == pytest.approx(1 - 21.0 / (3 * 21.0))


def test_slowest_stage_sets_the_pace():
  # With many micro-batches the makespan grows by the slowest stage's f + b per micro-batch.
  forward, backward = [1.0, 3.0, 1.0], [2.0, 6.0, 2.0]
  for build in BUILDERS:
    a = time_schedule(build(3, 10), forward, backward).makespan_s
    b = time_schedule(build(3, 11), forward, backward).makespan_s
    assert b - a == pytest.approx(9.0)


def test_one_stage_has_no_bubble():
  assert time_schedule(one_f_one_b(1, 4)).bubble_fraction == pytest.approx(0.0)


def test_validate_rejects_missing_action():
  schedule = one_f_one_b(3, 4)
  bad = _replace_stage(schedule, 1, schedule.per_stage[1][:-1])
  with pytest.raises(ConfigError, match=r"'1f1b' never runs backward\(stage 1, micro 3\)"):
    bad.validate()


def test_validate_rejects_duplicated_action():
  schedule = gpipe(2, 3)
  bad = _replace_stage(schedule, 0, (*schedule.per_stage[0], Action('forward', 0, 1)))
  with pytest.raises(ConfigError, match=r'runs forward\(stage 0, micro 1\) twice'):
    bad.validate()


def test_validate_rejects_action_in_wrong_stage():
  schedule = gpipe(2, 2)
  actions = list(schedule.per_stage[0])
  actions[1] = Action('forward', 1, 1)
  bad = _replace_stage(schedule, 0, actions)
  with pytest.raises(ConfigError, match=r'lists forward\(stage 1, micro 1\) under stage 0'):
    bad.validate()


def test_validate_rejects_backward_before_its_forward():
  schedule = gpipe(2, 2)
  actions = list(schedule.per_stage[1])
  actions[0], actions[2] = actions[2], actions[0]  # backward(1, 0) first
  bad = _replace_stage(schedule, 1, actions)
  waiting = r'stage 1 waits at backward\(stage 1, micro 0\) for forward\(stage 1, micro 0\)'
  with pytest.raises(ConfigError, match=waiting):
    bad.validate()
  with pytest.raises(ConfigError, match='deadlocks'):
    time_schedule(bad)


def test_validate_rejects_cross_stage_deadlock():
  # Stage 0 wants backward 0 before forward 1; stage 1 wants forward 1 before backward 0.
  f, b = 'forward', 'backward'
  per_stage = ((Action(f, 0, 0), Action(b, 0, 0), Action(f, 0, 1), Action(b, 0, 1)),
               (Action(f, 1, 0), Action(f, 1, 1), Action(b, 1, 0), Action(b, 1, 1)))
  bad = Schedule('mine', 2, 2, per_stage)
  waiting = r'stage 0 waits .* stage 1 waits at forward\(stage 1, micro 1\)'
  with pytest.raises(ConfigError, match=waiting):
    bad.validate()


def test_validate_rejects_wrong_shape():
  with pytest.raises(ConfigError, match='has 1 action lists for 2 stages'):
    Schedule('x', 2, 1, gpipe(1, 1).per_stage).validate()
  beyond = r'runs forward\(stage 0, micro 2\), but micro-batches are 0 … 1'
  with pytest.raises(ConfigError, match=beyond):
    Schedule('x', 1, 2, gpipe(1, 3).per_stage).validate()


@pytest.mark.parametrize('build', BUILDERS)
@pytest.mark.parametrize(('stages', 'micro', 'message'), [
    (0, 4, 'stages must be an integer >= 1, got 0'),
    (2, 0, 'micro_batches must be an integer >= 1, got 0'),
    (2.0, 4, 'stages must be an integer >= 1, got 2.0'),
    (2, True, 'micro_batches must be an integer >= 1, got True'),
])
def test_bad_sizes(build, stages, micro, message):
  with pytest.raises(ConfigError, match=message):
    build(stages, micro)


def test_bad_actions_and_costs():
  with pytest.raises(ConfigError, match="action kind must be one of forward, backward, got 'fwd'"):
    Action('fwd', 0, 0)
  with pytest.raises(ConfigError, match='action micro must be an integer >= 0, got -1'):
    Action('forward', 0, -1)
  with pytest.raises(ConfigError, match='backward_s of stage 0 must be a positive finite number'):
    time_schedule(gpipe(2, 2), 1.0, 0.0)
  with pytest.raises(ConfigError, match='forward_s has 3 values for 2 stages'):
    time_schedule(gpipe(2, 2), [1.0, 1.0, 1.0])


# --- split_stages ---------------------------------------------------------------------------


def _sizes(ranges):
  return [stop - start for start, stop in ranges]


def _brute_force(costs, stages):
  """The split of least (largest stage cost, sum of squared stage costs, cuts), exactly."""
  exact = [Fraction(c) for c in costs]
  best = None
  for cuts in itertools.combinations(range(1, len(costs)), stages - 1):
    edges = (0, *cuts, len(costs))
    sums = [sum(exact[a:b]) for a, b in itertools.pairwise(edges)]
    key = (max(sums), sum(s * s for s in sums), cuts)
    if best is None or key < best[0]:
      best = (key, tuple(itertools.pairwise(edges)))
  return best[1]


@pytest.mark.parametrize('n', range(1, 13))
def test_split_equal_costs_is_most_even(n):
  for stages in range(1, n + 1):
    ranges = split_stages([2.5] * n, stages)
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = _sizes(ranges)
    assert len(sizes) == stages and min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1


def test_split_known_uneven_cases():
  assert split_stages([5, 1, 1, 1, 1, 1], 2) == ((0, 1), (1, 6))
  assert split_stages([1, 1, 1, 1, 4], 2) == ((0, 4), (4, 5))
  assert _sizes(split_stages([1.0] * 5, 2)) == [2, 3]  # a tie goes to the earliest cut
  assert split_stages([3.0], 1) == ((0, 1),)


@pytest.mark.parametrize('seed', range(6))
def test_split_matches_brute_force(seed):
  rng = random.Random(seed)
  for _ in range(40):
    n = rng.randint(1, 8)
    costs = [rng.choice([rng.uniform(0.1, 3.0), float(rng.randint(1, 4))]) for _ in range(n)]
    stages = rng.randint(1, n)
    assert split_stages(costs, stages) == _brute_force(costs, stages), (costs, stages)


@pytest.mark.parametrize(('costs', 'stages', 'message'), [
    ([1, 2, 3], 4, 'cannot split 3 sub-models into 4 stages'),
    ([1, 2, 3], 0, 'stages must be an integer >= 1, got 0'),
    ([1, 2, 3], 1.5, 'stages must be an integer >= 1, got 1.5'),
    ([], 1, 'cannot split an empty chain'),
    ([1.0, 0.0, 2.0], 2, r'sub-model cost 1 is 0.0; costs must be positive and finite'),
    ([1.0, 2.0, -3.0], 2, r'sub-model cost 2 is -3.0; costs must be positive and finite'),
    ([1.0, float('inf')], 2, r'sub-model cost 1 is inf; costs must be positive and finite'),
    ([float('nan')], 1, r'sub-model cost 0 is nan; costs must be positive and finite'),
    ([1.0, '2'], 1, "sub-model cost 1 must be a number, got '2'"),
])
def test_split_errors(costs, stages, message):
  with pytest.raises(ConfigError, match=message):
    split_stages(costs, stages)
