"""The stdlib byte corpus: offline, deterministic by (seed, step, size)."""

from __future__ import annotations

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.data import DataSource
from hetjax.data._stdlib_text import StdlibText, stdlib_text


def test_is_a_data_source_with_a_real_corpus():
  src = stdlib_text(seq_len=16)
  assert isinstance(src, DataSource)
  assert src.corpus.dtype == np.uint8
  assert src.num_bytes == len(src.corpus) == 4_000_000
  assert b'def ' in src.corpus[:100_000].tobytes()


def test_cached():
  assert stdlib_text(seq_len=16) is stdlib_text(seq_len=16)


def test_batch_shape_dtype_and_values():
  tokens = stdlib_text(seq_len=16).global_batch(seed=0, step=0, size=5)['tokens']
  assert tokens.shape == (5, 17)
  assert tokens.dtype == np.int32
  assert tokens.min() >= 0 and tokens.max() < 256


def test_rows_are_windows_of_the_corpus():
  src = stdlib_text(seq_len=16)
  row = src.global_batch(seed=1, step=2, size=1)['tokens'][0].astype(np.uint8).tobytes()
  assert row in src.corpus.tobytes()


def test_batch_is_a_pure_function_of_seed_step_size():
  src = stdlib_text(seq_len=16)
  a = src.global_batch(seed=0, step=3, size=8)['tokens']
  np.testing.assert_array_equal(a, src.global_batch(seed=0, step=3, size=8)['tokens'])
  # a fresh source over the same corpus agrees: nothing hidden is carried between calls
  fresh = StdlibText(src.corpus, seq_len=16)
  np.testing.assert_array_equal(a, fresh.global_batch(seed=0, step=3, size=8)['tokens'])
  assert not np.array_equal(a, src.global_batch(seed=0, step=4, size=8)['tokens'])
  assert not np.array_equal(a, src.global_batch(seed=1, step=3, size=8)['tokens'])


def test_max_bytes_truncates():
  assert stdlib_text(seq_len=8, max_bytes=1000).num_bytes == 1000


@pytest.mark.parametrize('kwargs', [
    {'seq_len': 0},
    {'seq_len': 16, 'max_bytes': 16},
])
def test_bad_config(kwargs):
  with pytest.raises(ConfigError):
    stdlib_text(**kwargs)
