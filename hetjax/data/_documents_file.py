"""A corpus for topic models read from the user's own file, as `Documents`.

The formats (`read_data_file` reads them):

* ``.npy``: a document-term count matrix, documents × words, of whole numbers >= 0;
* ``.csv``: the same matrix, one document a line; a header line, if any, names the words;
* ``.npz`` with ``counts`` (that matrix), or with ``tokens`` and ``offsets`` — `Documents`'
  own form: every document's word ids in reading order, one after another, and where each
  document starts (``offsets[0] = 0``, ``offsets[-1] = len(tokens)``) — and optionally
  ``vocabulary``, the words (strings), one per column or word id.

A count matrix becomes documents whose tokens come in word order (a bag of words has no other).
Words are then renumbered most frequent first (ties in their given order), as `Documents`
numbers them: LDA deals word ids out to its vocabulary shards like cards, which balances the
shards' tokens only on that numbering. The vocabulary follows the words: a file's own words, or
else each word's column (or id) in the file as a string, so ``vocabulary[w]`` names word w's
original column. Every column is a word, rated or not (the likelihood counts the vocabulary);
documents with no tokens are kept (they add nothing).

Example::

  np.save('counts.npy', counts)           # int[documents, words]
  docs = read_documents('counts.npy')
  docs.num_documents, len(docs.vocabulary) == counts.shape
"""

from __future__ import annotations

import os

import numpy as np

from hetjax._errors import ConfigError
from hetjax.data._data_file import DataFile, read_data_file
from hetjax.data._docstrings import Documents


def read_documents(path: str | os.PathLike) -> Documents:
  """The corpus in the file at ``path`` (module docstring).

  Raises:
    ConfigError: a file that is missing or does not read, arrays of the wrong shape or dtype,
      counts or word ids that are not whole numbers >= 0, offsets that do not cut the tokens,
      a vocabulary of the wrong length, no token at all (one line each).
  """
  file = read_data_file(path)
  names: tuple[str, ...] | None = None
  if file.suffix == '.npz':
    if file.has('vocabulary'):
      words = file.array('vocabulary')
      if words.ndim != 1 or not np.issubdtype(words.dtype, np.str_):
        raise ConfigError(f'data file {file.path!r}: vocabulary must be a 1-D array of strings, '
                          f'got {words.dtype} of shape {words.shape}')
      names = tuple(str(w) for w in words)
    if file.has('counts') or not file.has('tokens'):
      tokens, offsets, width = _from_counts(file, file.array('counts'))
    else:
      tokens, offsets, width = _from_tokens(file, names)
  else:
    tokens, offsets, width = _from_counts(file, file.table())
    names = file.header or None
  if names is not None and len(names) != width:
    raise ConfigError(f'data file {file.path!r}: {len(names)} words for a vocabulary of '
                      f'{width}')
  if tokens.size == 0:
    raise ConfigError(f'data file {file.path!r} has no tokens (every count is 0)')
  names = names or tuple(str(w) for w in range(width))
  order = np.argsort(-np.bincount(tokens, minlength=width), kind='stable')
  rank = np.empty(width, np.int64)
  rank[order] = np.arange(width)
  tokens, offsets = rank[tokens].astype(np.int32), offsets.astype(np.int64)
  tokens.flags.writeable = offsets.flags.writeable = False
  return Documents(tokens, offsets, tuple(names[w] for w in order),
                   tuple(f'{file.name}:{d}' for d in range(offsets.size - 1)))


def _from_counts(file: DataFile, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
  """Tokens, offsets and vocabulary size of a documents × words count matrix."""
  if counts.ndim != 2:
    raise ConfigError(f'data file {file.path!r}: the counts must be a 2-D documents × words '
                      f'matrix, got shape {counts.shape}')
  counts = file.integers(counts, 'counts')
  width = counts.shape[1]
  tokens = np.repeat(np.tile(np.arange(width), counts.shape[0]), counts.reshape(-1))
  offsets = np.concatenate([[0], np.cumsum(counts.sum(1))])
  return tokens, offsets, width


def _from_tokens(file: DataFile, names: tuple[str, ...] | None
                 ) -> tuple[np.ndarray, np.ndarray, int]:
  """Tokens, offsets and vocabulary size of `Documents`' own form."""
  tokens, offsets = file.array('tokens'), file.array('offsets')
  if tokens.ndim != 1 or offsets.ndim != 1 or offsets.size < 2:
    raise ConfigError(f'data file {file.path!r}: tokens and offsets must be 1-D (offsets one '
                      f'longer than the documents), got shapes {tokens.shape}, {offsets.shape}')
  tokens, offsets = file.integers(tokens, 'tokens'), file.integers(offsets, 'offsets')
  if offsets[0] != 0 or offsets[-1] != tokens.size or np.any(np.diff(offsets) < 0):
    raise ConfigError(f'data file {file.path!r}: offsets must rise from 0 to the {tokens.size} '
                      f'tokens, got {offsets[0]} … {offsets[-1]}')
  width = int(tokens.max()) + 1 if names is None else len(names)
  if tokens.max() >= width:
    raise ConfigError(f'data file {file.path!r}: word id {tokens.max()} is beyond the '
                      f'{width} words of the vocabulary')
  return tokens, offsets, width
