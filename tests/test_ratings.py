"""Synthetic Zipf ratings: distinct cells, skewed users and items, a low-rank truth plus the
noise asked for, the held-out split, bad input in one line, the docstrings' examples."""

import doctest

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.data import _ratings
from hetjax.data._ratings import Ratings, zipf_ratings


def test_the_docstring_examples_run():
  assert doctest.testmod(_ratings, extraglobs={'np': np}).failed == 0


def test_cells_are_distinct_seeded_and_in_range():
  r = zipf_ratings()
  assert isinstance(r, Ratings) and r.count == 20_000
  assert len(np.unique(r.user.astype(np.int64) * r.items + r.item)) == r.count
  assert r.user.min() >= 0 and r.user.max() < r.users and r.item.max() < r.items
  again, other = zipf_ratings(), zipf_ratings(seed=1)
  for name in ('user', 'item', 'value'):
    np.testing.assert_array_equal(getattr(again, name), getattr(r, name))
  assert not np.array_equal(other.user, r.user)
  assert not r.value.flags.writeable


def _slope(ids, n):
  """The slope of log count against log rank at ranks 10-100 (Zipf's law: -exponent)."""
  counts = np.sort(np.bincount(ids, minlength=n))[::-1][9:100]
  return np.polyfit(np.log(np.arange(10, 101)), np.log(counts), 1)[0]


def test_users_and_items_are_skewed_and_hot_ids_scattered():
  r = zipf_ratings(users=2000, items=2000, ratings=20_000)
  # Distinct cells keep fewer of a hot user's draws, so the fall-off is gentler than k^-1
  # (-0.80 and -0.81 here; seeds 1, 2 give -0.79 to -0.83); exponent 0.5 gives -0.48.
  for ids in (r.user, r.item):
    assert -0.9 < _slope(ids, 2000) < -0.7
  assert _slope(zipf_ratings(users=2000, items=2000, ratings=20_000, exponent=0.5).user,
                2000) > -0.6
  # The hot users are spread over the ids: the hottest 200 users have 59 % of the ratings,
  # but any 200 consecutive ids at most 19 % (the tenth that holds the hottest user, 940).
  counts = np.bincount(r.user, minlength=2000)
  assert np.sort(counts)[-200:].sum() > 0.5 * r.count
  assert counts.reshape(10, 200).sum(1).max() < 0.2 * r.count


def test_values_are_a_low_rank_truth_plus_the_noise_asked_for():
  # Every cell of a 20 x 10 matrix (a near-uniform law fills it), without noise: rank 3.
  full = zipf_ratings(users=20, items=10, ratings=200, rank=3, noise=0.0, exponent=0.1)
  matrix = np.zeros((20, 10))
  matrix[full.user, full.item] = full.value
  assert np.linalg.matrix_rank(matrix, tol=1e-4) == 3
  # The noise is drawn last, so the same seed without it gives the same cells and truth; the
  # difference is N(0, 0.1²): its standard deviation over 20,000 ratings is within 0.5 % of
  # 0.1 one time in three, within 2 % (4 σ) all but once in 15,000.
  clean, noisy = zipf_ratings(noise=0.0), zipf_ratings(noise=0.1)
  np.testing.assert_array_equal(clean.user, noisy.user)
  assert np.std(noisy.value - clean.value) == pytest.approx(0.1, rel=0.02)
  # The truth has variance about 1 (entries of variance rank^-½): 0.97 here, 0.97-1.13 over
  # seeds 0-4 (the hot users and items weigh heavily).
  assert 0.8 < np.var(clean.value) < 1.25


def test_the_split_partitions_the_ratings():
  r = zipf_ratings()
  train, test = r.split(0.1, seed=4)
  assert (train.count, test.count) == (18_000, 2_000)
  cells = [set(zip(x.user.tolist(), x.item.tolist(), strict=True)) for x in (train, test, r)]
  assert not cells[0] & cells[1] and cells[0] | cells[1] == cells[2]
  with pytest.raises(ConfigError, match=r'held-out fraction must be in \(0, 1\), got 1.0'):
    r.split(1.0)


@pytest.mark.parametrize('kwargs, message', [
    ({'users': 0}, 'zipf_ratings needs users >= 1'),
    ({'rank': 1.5}, r'zipf_ratings needs rank >= 1 \(an integer\), got 1.5'),
    ({'users': 10, 'items': 10, 'ratings': 101}, '101 ratings do not fit 10 x 10 cells'),
    ({'noise': -0.1}, 'zipf_ratings needs noise >= 0, got -0.1'),
    ({'exponent': 0.0}, 'zipf_ratings needs exponent > 0, got 0.0'),
    ({'users': 100, 'items': 50, 'ratings': 4900, 'exponent': 3.0},
     'only .* of 4900 distinct cells after 64 rounds; lower the exponent'),
])
def test_bad_arguments_are_one_line(kwargs, message):
  with pytest.raises(ConfigError, match=message) as e:
    zipf_ratings(**kwargs)
  assert '\n' not in str(e.value)
