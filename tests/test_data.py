"""Deterministic global batches and slicing them by shares."""

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.data import ArraySource, DataSource, digits, share_offsets, slice_batch, split_batch


def _source(n=10):
  return ArraySource({'x': np.arange(n, dtype=np.float32), 'y': np.arange(n)})


def test_batch_is_a_function_of_seed_and_step():
  a, b = _source(), _source()
  np.testing.assert_array_equal(a.global_batch(1, 5, 4)['y'], b.global_batch(1, 5, 4)['y'])
  assert not np.array_equal(a.global_batch(1, 5, 4)['y'], a.global_batch(2, 5, 4)['y'])
  assert isinstance(a, DataSource)


def test_each_epoch_is_a_permutation_and_batches_straddle_epochs():
  src = _source(10)
  rows = np.concatenate([src.global_batch(0, s, 4)['y'] for s in range(5)])  # 20 rows = 2 epochs
  assert sorted(rows[:10]) == list(range(10)) and sorted(rows[10:]) == list(range(10))
  assert not np.array_equal(rows[:10], rows[10:])
  np.testing.assert_array_equal(src.global_batch(0, 2, 4)['x'], src.global_batch(0, 2, 4)['y'])


def test_array_source_rejects_ragged_arrays():
  with pytest.raises(ValueError, match='different lengths'):
    ArraySource({'x': np.zeros(3), 'y': np.zeros(4)})


def test_digits_is_offline_and_normalised():
  src = digits()
  batch = src.global_batch(0, 0, 32)
  assert batch['x'].shape == (32, 64) and batch['x'].dtype == np.float32
  assert batch['x'].min() >= 0.0 and batch['x'].max() <= 1.0
  assert src.num_examples == 1797 and set(np.unique(src.arrays['y'])) == set(range(10))


def test_slices_concatenate_to_the_global_batch():
  batch = _source(12).global_batch(0, 0, 12)
  parts = split_batch(batch, (5, 0, 4, 3))
  assert [len(p['x']) for p in parts] == [5, 0, 4, 3]
  np.testing.assert_array_equal(np.concatenate([p['y'] for p in parts]), batch['y'])
  np.testing.assert_array_equal(slice_batch(batch, (5, 0, 4, 3), 2)['y'], batch['y'][5:9])


@pytest.mark.parametrize('shares, message', [
    ((5, 5), 'sum to 10, not the global batch 12'),
    ((13, -1), 'share 1 is -1'),
    ((6.5, 5.5), 'share 0 is 6.5'),
])
def test_bad_shares_are_rejected(shares, message):
  with pytest.raises(ConfigError, match=message):
    share_offsets(shares, 12)
