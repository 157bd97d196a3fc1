"""The coordinate schedulers as policy values: the dynamic one (warm-up, dependency check,
priorities, unknown coordinates first, resumable draws), Shotgun and Cyclic."""

import json
import types

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import decode_state, encode_state
from hetjax.schmp import RoundInfo, Schedule
from hetjax.schmp._cyclic import Cyclic
from hetjax.schmp._dynamic import DynamicScheduler
from hetjax.schmp._shotgun import Shotgun


def _independent(blocks):
  return np.eye(blocks.size)


def _stats(step, schedule, delta):
  """What the loop hands a scheduler after round ``step``."""
  return types.SimpleNamespace(step=step, local=RoundInfo(step, schedule, np.asarray(delta)))


def _random_correlations(d, seed=0):
  """|corr| of a random 40-row design's columns, as `CoordinateApp.correlations` gives it."""
  x = np.random.default_rng(seed).standard_normal((40, d))
  x /= np.linalg.norm(x, axis=0)
  full = np.abs(x.T @ x)
  return full, lambda blocks: full[np.ix_(blocks, blocks)]


def test_warm_up_draws_are_uniform_whatever_the_weights():
  d, c, rounds = 20, 4, 2000
  policy = DynamicScheduler(d, 2, _independent, warmup=rounds, candidates=c)
  weights = np.zeros(d)
  weights[0] = 1e6                                 # would dominate a weighted draw
  counts = np.zeros(d)
  for t in range(rounds):
    counts[policy.ranked_candidates(t, weights)] += 1
  # Each coordinate is among the c candidates with probability c / d = 0.2; over 2000 rounds
  # its count has sd √(2000 · 0.2 · 0.8) ≈ 17.9: 5 sd is 90 either side of 400.
  assert np.all(np.abs(counts - rounds * c / d) < 90), counts


def test_the_dependency_check_never_pairs_correlated_coordinates():
  d, theta = 60, 0.2
  full, correlations = _random_correlations(d)
  assert (full[np.triu_indices(d, 1)] >= theta).mean() > 0.1     # plenty of conflicts
  policy = DynamicScheduler(d, 16, correlations, theta=theta, warmup=5)
  state = policy.init()
  schedule, state = policy.update(state, None)
  rng = np.random.default_rng(1)
  sizes = []
  for t in range(60):
    picked = schedule.picked
    assert len(set(picked.tolist())) == picked.size
    pairs = full[np.ix_(picked, picked)][np.triu_indices(picked.size, 1)]
    assert np.all(pairs < theta)
    # Greedy: every candidate left out conflicts with one kept before it, or the slots are full.
    order = policy.ranked_candidates(t, state['weights'])
    kept = list(picked)
    if len(kept) < policy.size:
      for j in np.setdiff1d(order, picked):
        before = [k for k in kept if np.where(order == k)[0][0] < np.where(order == j)[0][0]]
        assert np.any(full[j, before] >= theta)
    sizes.append(picked.size)
    schedule, state = policy.update(state, _stats(t, schedule, rng.normal(size=16)))
  assert min(sizes) >= 1 and max(sizes) > 1


def test_candidates_are_drawn_in_proportion_to_weight_plus_epsilon():
  d, eps, rounds = 100, 0.01, 4000
  policy = DynamicScheduler(d, 1, _independent, warmup=0, candidates=1, epsilon=eps)
  weights = np.zeros(d)
  weights[0], weights[1] = 1.0, 0.25
  first = np.array([policy.ranked_candidates(t, weights)[0] for t in range(rounds)])
  total = weights.sum() + d * eps                  # 2.25
  for j, p in ((0, 1.01 / total), (1, 0.26 / total), (2, eps / total)):
    # binomial: 5 sd of a count of 4000 draws
    sd = np.sqrt(rounds * p * (1 - p))
    assert abs(np.sum(first == j) - rounds * p) < 5 * sd, (j, np.sum(first == j), rounds * p)
  # The heavy coordinate is drawn ~100x as often as one at zero.
  assert np.sum(first == 0) > 40 * max(1, np.sum(first == 2))


def test_candidates_are_considered_heaviest_first_with_small_weights_tied():
  d = 8
  policy = DynamicScheduler(d, 8, _independent, warmup=0, epsilon=1e-3)
  weights = np.array([0.5, 1e-9, 2.0, 0.0, 1e-5, 0.1, 0.0, 1e-8])
  order = policy.ranked_candidates(3, weights)
  assert order[:3].tolist() == [2, 0, 5]
  # The others are below ε: in their random draw order, which differs between rounds.
  orders = {tuple(policy.ranked_candidates(t, weights)[3:]) for t in range(20)}
  assert all(sorted(o) == [1, 3, 4, 6, 7] for o in orders) and len(orders) > 1


def test_unknown_coordinates_go_first_after_the_warm_up():
  d = 30
  policy = DynamicScheduler(d, 4, _independent, warmup=2)
  state = policy.init()
  assert np.isinf(state['weights']).all()
  schedule, state = policy.update(state, None)
  seen = set()
  for t in range(12):
    if t >= 2:  # the picks are coordinates never updated, while there are any
      unknown = set(schedule.picked.tolist()) - seen
      assert len(unknown) == min(4, d - len(seen))
    seen |= set(schedule.picked.tolist())
    schedule, state = policy.update(state, _stats(t, schedule, np.full(4, 1.0)))
  assert len(seen) == d                          # 2 warm-up rounds + 7 of unknowns cover 30
  assert np.isfinite(state['weights']).all()


def test_weights_are_the_last_change():
  policy = DynamicScheduler(6, 3, _independent, priority='squared', eta=0.5)
  schedule = Schedule.of([4, 1], 3)
  weights = policy.learn(np.full(6, np.inf), RoundInfo(0, schedule, np.array([-2.0, 0.5, 0.0])))
  assert weights[4] == 4.5 and weights[1] == 0.75 and np.isinf(weights[[0, 2, 3, 5]]).all()
  absolute = DynamicScheduler(6, 3, _independent)
  weights = absolute.learn(weights, RoundInfo(1, schedule, np.array([0.25, -3.0, 7.0])))
  assert weights[4] == 0.25 and weights[1] == 3.0        # the masked slot's 7 is ignored


def test_draws_are_a_function_of_seed_and_round_so_a_resume_repeats_them():
  _, correlations = _random_correlations(50)
  policy = DynamicScheduler(50, 8, correlations, seed=3, warmup=3)
  rng = np.random.default_rng(0)
  state = policy.init()
  schedule, state = policy.update(state, None)
  decided, saved = [], None
  for t in range(10):
    if t == 6:
      saved = decode_state(policy.init(), json.loads(json.dumps(encode_state(state))))
    decided.append(schedule.picked.tolist())
    schedule, state = policy.update(state, _stats(t, schedule, rng.normal(size=8)))
  # A resumed run: the saved state decides round 6 again, exactly as before.
  again, _ = policy.update(saved, None)
  assert again.picked.tolist() == decided[6]
  # Another seed draws otherwise.
  other = DynamicScheduler(50, 8, correlations, seed=4, warmup=3)
  assert other.update(other.init(), None)[0].picked.tolist() != decided[0]


@pytest.mark.parametrize('kwargs, message', [
    ({'blocks': 0}, 'a dynamic schedule needs blocks and size >= 1, got 0 and 4'),
    ({'size': 0}, 'needs blocks and size >= 1'),
    ({'theta': 0.0}, r'theta must be in \(0, 1\], got 0.0'),
    ({'theta': 1.5}, r'theta must be in \(0, 1\]'),
    ({'warmup': -1}, 'warmup, epsilon and eta must be >= 0'),
    ({'eta': -0.1}, 'warmup, epsilon and eta must be >= 0'),
    ({'candidates': 2}, '2 candidates cannot fill 4 slots'),
    ({'epsilon': 0.0}, 'epsilon must be > 0 with priority abs'),
    ({'epsilon': 0.0, 'priority': 'squared'}, 'epsilon must be > 0 with priority squared and eta 0'),
    ({'priority': 'max'}, "unknown priority 'max'; choose one of: abs, squared"),
])
def test_bad_dynamic_settings_are_one_line(kwargs, message):
  args = {'blocks': 10, 'size': 4, 'correlations': _independent} | kwargs
  with pytest.raises(ConfigError, match=message) as e:
    DynamicScheduler(**args)
  assert '\n' not in str(e.value)
  # With η > 0 the squared priority keeps every weight positive: ε may be 0.
  DynamicScheduler(10, 4, _independent, epsilon=0.0, priority='squared', eta=0.1)


def test_shotgun_draws_distinct_uniform_coordinates_per_seed_and_round():
  d, size, rounds = 40, 8, 2000
  policy = Shotgun(d, size, seed=5)
  state = policy.init()
  counts = np.zeros(d)
  schedule, state = policy.update(state, None)
  for t in range(rounds):
    assert schedule.mask.all() and len(set(schedule.picked.tolist())) == size
    counts[schedule.picked] += 1
    if t == 100:
      assert policy.update({'round': 100}, None)[0].picked.tolist() == schedule.picked.tolist()
    schedule, state = policy.update(state, types.SimpleNamespace(step=t, local=None))
  # P(j picked) = 8 / 40 = 0.2: a count of sd √(2000 · 0.2 · 0.8) ≈ 17.9, 5 sd either side.
  assert np.all(np.abs(counts - rounds * size / d) < 90), counts
  assert Shotgun(d, size, seed=6).update({'round': 0}, None)[0].picked.tolist() != \
      Shotgun(d, size, seed=5).update({'round': 0}, None)[0].picked.tolist()
  small, _ = Shotgun(3, 8).update({'round': 0}, None)     # more slots than coordinates
  assert sorted(small.picked.tolist()) == [0, 1, 2] and small.mask.sum() == 3
  with pytest.raises(ConfigError, match='shotgun needs blocks and size >= 1'):
    Shotgun(0, 4)


def test_cyclic_goes_in_order_with_the_extra_slots_masked():
  policy = Cyclic(blocks=3, size=4)
  state = policy.init()
  schedule, state = policy.update(state, None)
  picked = []
  for t in range(7):
    assert schedule.mask.tolist() == [True, False, False, False]
    picked.append(int(schedule.picked[0]))
    schedule, state = policy.update(state, types.SimpleNamespace(step=t, local=None))
  assert picked == [0, 1, 2, 0, 1, 2, 0] and state == {'round': 7}
  assert policy.update({'round': 5}, None)[0].picked.tolist() == [2]   # a resume
  with pytest.raises(ConfigError, match='cyclic needs blocks and size >= 1, got 3 and 0'):
    Cyclic(3, 0)


def test_current_priority_takes_the_rounds_report_and_zeroes_the_rounds_in_flight():
  """``priority='current'``: the weights are the round's reported priorities (every
  coordinate), except those picked by rounds decided since, whose update is under way; no
  warm-up; a round without priorities is a one-line error."""
  policy = DynamicScheduler(6, 2, _independent, priority='current')
  assert policy.warmup == 0
  state = policy.init()
  first, state = policy.update(state, None)                      # round 0: unknown, random
  second, state = policy.update(state, types.SimpleNamespace(step=0, local=None))  # round 1
  report = RoundInfo(0, first, np.zeros(2), priority=np.array([0.5, -3.0, 0.0, 2.0, 1.0, 4.0]))
  third, state = policy.update(state, types.SimpleNamespace(step=1, local=report))
  expected = np.abs(report.priority)
  expected[second.picked] = 0.0                                  # round 1 still in flight
  np.testing.assert_array_equal(state['weights'], expected)
  assert state['picked_round'].tolist().count(2) == 1
  assert set(third.picked.tolist()) == set(np.argsort(-expected)[:2].tolist())  # heaviest first
  with pytest.raises(ConfigError, match='priority current needs rounds that report'):
    policy.update(state, types.SimpleNamespace(step=2, local=RoundInfo(1, second, np.zeros(2))))
