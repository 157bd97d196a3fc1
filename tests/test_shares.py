"""ShareRules and Shares: what every policy's output must satisfy, checked before training."""

import math

import pytest

from hetjax import ConfigError, core
from hetjax.core import ShareRules, Shares


def test_balance_names_the_core_types():
  assert ShareRules is core.ShareRules and Shares is core.Shares


def test_uniform_and_weighted_splits_are_bucketed_and_exact():
  rules = ShareRules(global_batch=4096, workers=4, bucket=64)
  assert rules.uniform().values == (1024,) * 4
  split = rules.from_weights([1, 1, 1, 1 / 3])
  assert sum(split) == 4096 and all(s % 64 == 0 for s in split)
  # Leftover buckets go where they finish soonest: makespan 20 units, not 21.
  assert max(s / 64 / w for s, w in zip(split, [1, 1, 1, 1 / 3], strict=True)) == 20


def test_bounds_are_water_filled():
  rules = ShareRules(4096, 4, 64, maximum=(1024, 1024, 1024, 4096))
  assert rules.from_weights([10, 10, 10, 1]).values == (1024, 1024, 1024, 1024)
  floor = ShareRules(4096, 4, 64, minimum=(64, 64, 64, 512))
  assert floor.from_weights([1, 1, 1, 0]).values[3] == 512


def test_bad_weights_fall_back_to_valid_shares():
  rules = ShareRules(256, 4, 16)
  assert sum(rules.from_weights([math.nan, -1, math.inf, 0])) == 256
  assert rules.from_weights([0, 0, 0, 0]) == rules.uniform()


@pytest.mark.parametrize('kwargs, message', [
    ({'global_batch': 128, 'workers': 4, 'bucket': 64},
     r'global batch 128 is smaller than the minimum shares need \(4 workers x at least 64: 256\)'),
    ({'global_batch': 100, 'workers': 4, 'bucket': 32}, 'not a multiple of the bucket 32'),
    ({'global_batch': 4096, 'workers': 2, 'bucket': 64, 'maximum': (1024, 1024)},
     r'memory caps \(1024, 1024\) hold 2048 rows, less than the global batch 4096'),
    ({'global_batch': 256, 'workers': 2, 'bucket': 64, 'maximum': (100, 256)},
     'not made of multiples of the bucket 64'),
])
def test_impossible_rules_fail_before_training(kwargs, message):
  with pytest.raises(ConfigError, match=message):
    ShareRules(**kwargs)


def test_shares_check_themselves():
  rules = ShareRules(256, 2, 64)
  with pytest.raises(ConfigError, match='summing to 256'):
    Shares((64, 64), rules)
  with pytest.raises(ConfigError, match='share 32 of worker 0 is not a multiple of 64'):
    Shares((32, 224), rules)
  assert list(Shares((128, 128), rules)) == [128, 128] and len(Shares((64, 192), rules)) == 2


def test_uniform_shares_of_workers_of_different_device_counts_are_equal_per_device():
  rules = ShareRules(64, 3, 4, devices=(2, 1, 1))
  assert rules.uniform().values == (32, 16, 16)
  assert rules.from_weights([0, 0, 0]) == rules.uniform()  # nothing to go by: uniform
  assert rules.from_weights([1, 1, 1]).values in {(24, 20, 20), (20, 24, 20), (20, 20, 24)}
  assert ShareRules(64, 2, 4, devices=(3, 3)).uniform() == ShareRules(64, 2, 4).uniform()
  with pytest.raises(ConfigError, match=r'devices \(2, 1\) must be 3 positive integers'):
    ShareRules(64, 3, 4, devices=(2, 1))
  with pytest.raises(ConfigError, match=r'devices \(2, 0\) must be 2 positive integers'):
    ShareRules(64, 2, 4, devices=(2, 0))
