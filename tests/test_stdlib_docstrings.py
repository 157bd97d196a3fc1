"""The stdlib docstring corpus: offline, seeded, stop words and rare words gone, ids by frequency."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.data import Documents, stdlib_docstrings
from hetjax.data._docstrings import _STOP_WORDS


def test_documents_are_word_ids_most_frequent_first():
  docs = stdlib_docstrings(documents=64, vocabulary=300)
  assert isinstance(docs, Documents)
  assert docs.num_documents == 64 == len(docs.sources)
  assert docs.offsets[0] == 0 and docs.offsets[-1] == docs.num_tokens
  assert docs.tokens.dtype == np.int32 and docs.tokens.min() >= 0
  assert docs.tokens.max() < len(docs.vocabulary) <= 300
  assert (docs.lengths <= 400).all() and docs.lengths.sum() == docs.num_tokens
  counts = np.bincount(docs.tokens, minlength=len(docs.vocabulary))
  assert (np.diff(counts) <= 0).all()                    # id 0 is the commonest word
  spread = np.zeros(len(docs.vocabulary), int)
  for i in range(docs.num_documents):
    spread[np.unique(docs.document(i))] += 1
  assert spread.min() >= 2                                # rare words dropped
  assert all(re.fullmatch('[a-z]{3,}', w) for w in docs.vocabulary)
  assert not set(docs.vocabulary) & _STOP_WORDS
  assert all(re.fullmatch(r'[\w/]+\.py(:\w+)?', s) for s in docs.sources)
  with pytest.raises(ValueError):
    docs.tokens[0] = 1                                    # shared by every cached caller


def test_seeded_and_deterministic():
  a = stdlib_docstrings(documents=64, vocabulary=300, seed=0)
  assert stdlib_docstrings(documents=64, vocabulary=300, seed=0) is a
  b = stdlib_docstrings.__wrapped__(documents=64, vocabulary=300, seed=0)   # read again
  assert b.vocabulary == a.vocabulary and b.sources == a.sources
  np.testing.assert_array_equal(b.tokens, a.tokens)
  other = stdlib_docstrings(documents=64, vocabulary=300, seed=1)
  assert other.sources != a.sources


def test_the_full_corpus_and_bad_sizes():
  full = stdlib_docstrings(documents=None, vocabulary=5000)
  assert full.num_documents > 1000 and len(full.vocabulary) == 5000
  with pytest.raises(ConfigError, match=f'has {full.num_documents} documents of at least 8 '
                     'words, fewer than the 1000000 asked for'):
    stdlib_docstrings(documents=1_000_000)
  with pytest.raises(ConfigError, match='documents >= 1'):
    stdlib_docstrings(documents=0)
  with pytest.raises(ConfigError, match='vocabulary, min_length, min_documents >= 1'):
    stdlib_docstrings(vocabulary=0)
