"""Tests of the synthetic Zipf click source."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.data import DataSource
from hetjax.data._zipf_clicks import ZipfClicks, zipf_clicks

ROWS = 1000


def _auc(score: np.ndarray, label: np.ndarray) -> float:
  """Mann-Whitney AUC (scores are continuous, so ties are negligible)."""
  ranks = np.empty(len(score))
  ranks[np.argsort(score)] = np.arange(1, len(score) + 1)
  pos = label == 1
  n_pos, n_neg = pos.sum(), (~pos).sum()
  return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@pytest.fixture(scope='module')
def source() -> ZipfClicks:
  return zipf_clicks(rows=ROWS, fields=4, dense=8)


def test_is_a_data_source(source):
  assert isinstance(source, DataSource)
  assert zipf_clicks(rows=ROWS, fields=4, dense=8) is source


def test_batch_is_a_pure_function_of_seed_step_size(source):
  a = source.global_batch(seed=3, step=5, size=64)
  fresh = ZipfClicks(rows=ROWS, fields=4, dense=8)  # a new object, as in another process
  b = fresh.global_batch(seed=3, step=5, size=64)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a['dense'], source.global_batch(seed=3, step=6, size=64)['dense'])
  assert not np.array_equal(a['dense'], source.global_batch(seed=4, step=5, size=64)['dense'])


def test_shapes_dtypes_and_range(source):
  batch = source.global_batch(seed=0, step=0, size=128)
  assert batch['ids'].shape == (128, 4) and batch['ids'].dtype == np.int32
  assert batch['dense'].shape == (128, 8) and batch['dense'].dtype == np.float32
  assert batch['label'].shape == (128,) and batch['label'].dtype == np.float32
  assert batch['ids'].min() >= 0 and batch['ids'].max() < ROWS
  assert set(np.unique(batch['label'])) <= {0.0, 1.0}


def test_ids_are_zipf_like_and_hot_ids_are_scattered(source):
  ids = source.global_batch(seed=0, step=0, size=8192)['ids'].ravel()
  counts = np.bincount(ids, minlength=ROWS)
  assert counts.max() > 50 * max(np.median(counts), 1)
  top10 = np.sort(counts)[-10:].sum() / counts.sum()
  assert top10 > 0.35  # ≈ 0.48 for exponent 1.1 over 1000 rows
  assert np.argmax(counts) == source.ids_by_rank[0]
  assert not np.array_equal(np.sort(source.ids_by_rank[:10]), np.arange(10))
  flat = zipf_clicks(rows=ROWS, fields=4, dense=8, exponent=0.5)
  flat_counts = np.bincount(flat.global_batch(0, 0, 8192)['ids'].ravel(), minlength=ROWS)
  assert np.sort(flat_counts)[-10:].sum() / flat_counts.sum() < top10 / 2


def test_labels_follow_the_hidden_model(source):
  batch = source.global_batch(seed=0, step=1, size=8192)
  label = batch['label']
  assert 0.2 < label.mean() < 0.8
  assert _auc(source.true_logit(batch['ids'], batch['dense']), label) > 0.7
  # A least-squares fit on the dense features of one batch ranks the next batch's labels.
  w, *_ = np.linalg.lstsq(batch['dense'], label - label.mean(), rcond=None)
  held_out = source.global_batch(seed=0, step=2, size=8192)
  assert _auc(held_out['dense'] @ w, held_out['label']) > 0.6


@pytest.mark.parametrize('kwargs', [{'rows': 0}, {'fields': 0}, {'exponent': 0.0},
                                    {'exponent': -1.0}, {'dense': -1}])
def test_bad_arguments_are_config_errors(kwargs):
  with pytest.raises(ConfigError):
    ZipfClicks(**kwargs)


def test_a_million_rows_is_quick():
  # A guard against a blow-up in scale, in CPU seconds of this process (not wall time: a
  # loaded machine must not fail it).
  start = time.process_time()
  source = ZipfClicks(rows=10**6)
  built = time.process_time() - start
  source.global_batch(seed=0, step=0, size=1024)
  start = time.process_time()
  batch = source.global_batch(seed=0, step=1, size=1024)
  batched = time.process_time() - start
  assert batch['ids'].max() < 10**6
  assert built < 2.0 and batched < 0.05  # ~0.2 s and ~1 ms here; loose for noisy machines
