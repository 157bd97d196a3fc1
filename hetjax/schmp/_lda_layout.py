"""Where LDA's tokens live on P devices: documents split by device, words by vocabulary shard.

Device p holds a contiguous run of documents (``doc_shares[p]`` of them) with their
document-topic counts and their tokens' topics. The vocabulary is split into P shards by
frequency rank, word w in shard ``w mod P`` at row ``w // P``: the corpus numbers words most
frequent first, so dealing them out like cards gives every shard about the same number of
tokens (a contiguous split would give shard 0 the common words and most of the work).

A device's tokens are grouped by shard — the tokens a round samples against shard j's
word-topic counts — in reading order (document, then position), and every group is padded to
the longest one with a mask, so each array has the same shape on every device and a round
compiles once.

Example: 3 documents ``[[0, 1], [2], [1, 1, 3]]`` on P = 2 devices, shares (2, 1): device 0 has
documents 0 and 1, its shard-0 group is words 0, 2 (rows 0, 1 of shard 0) and its shard-1
group is word 1 (row 0 of shard 1, padded); device 1's groups are ``[]`` and ``[1, 1, 3]``::

  >>> docs = Documents(np.array([0, 1, 2, 1, 1, 3], np.int32), np.array([0, 2, 3, 6]),
  ...                  ('a', 'b', 'c', 'd'), ('x.py', 'y.py', 'z.py'))
  >>> lay = layout(docs, (2, 1), topics=4, seed=0)
  >>> lay.row[0].tolist(), lay.mask[0].tolist()
  ([[0, 1, 0], [0, 0, 0]], [[True, True, False], [True, False, False]])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetjax.data import Documents


@dataclasses.dataclass(frozen=True, eq=False)
class TokenLayout:
  """Every token's place on P devices (module docstring); arrays lead with the device.

  Attributes:
    devices: P, also the number of vocabulary shards.
    rows: words per shard, ``ceil(V / P)`` (the last rows of some shards are padding).
    doc: int32[P, P, L], per device and shard, each token's document on that device.
    row: int32[P, P, L], each token's word's row in its shard (word = row · P + shard).
    mask: bool[P, P, L], which slots hold a token.
    topic: int32[P, P, L], the initial topics (uniform, drawn per token in corpus order from
      ``seed``, so the same whatever P is; 0 on padding).
    token: int64[P, P, L], each slot's index in ``Documents.tokens`` (-1 on padding).
    length: int32[P, D_max], the tokens of each document slot of a device (0 on padding).
    doc_id: int32[P, D_max], each document slot's document in the corpus (-1 on padding).
  """

  devices: int
  rows: int
  doc: np.ndarray
  row: np.ndarray
  mask: np.ndarray
  topic: np.ndarray
  token: np.ndarray
  length: np.ndarray
  doc_id: np.ndarray

  @property
  def slots(self) -> int:
    """L, the padded length of each (device, shard) group of tokens."""
    return self.doc.shape[2]


def layout(docs: Documents, doc_shares: Sequence[int], topics: int, seed: int) -> TokenLayout:
  """``docs`` laid out on ``len(doc_shares)`` devices, ``doc_shares[p]`` documents on device p
  (they sum to the document count; the caller checks)."""
  p_count = len(doc_shares)
  starts = np.concatenate([[0], np.cumsum(doc_shares)]).astype(np.int64)
  lengths = docs.lengths
  doc_of = np.repeat(np.arange(docs.num_documents), lengths)         # per token
  device = np.searchsorted(starts, doc_of, side='right') - 1
  local_doc = doc_of - starts[device]
  shard = docs.tokens.astype(np.int64) % p_count
  group = device * p_count + shard
  order = np.argsort(group, kind='stable')                            # reading order kept
  counts = np.bincount(group, minlength=p_count * p_count)
  slot = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
  size = max(1, int(counts.max(initial=0)))
  topic0 = np.random.default_rng(seed).integers(0, topics, docs.num_tokens, dtype=np.int32)

  def place(values, fill, dtype):
    out = np.full((p_count * p_count, size), fill, dtype)
    out[group[order], slot] = values[order]
    return out.reshape(p_count, p_count, size)

  d_max = max(1, int(max(doc_shares)))
  length = np.zeros((p_count, d_max), np.int32)
  doc_id = np.full((p_count, d_max), -1, np.int32)
  for p in range(p_count):
    n = doc_shares[p]
    length[p, :n] = lengths[starts[p]:starts[p] + n]
    doc_id[p, :n] = np.arange(starts[p], starts[p] + n)
  return TokenLayout(
      devices=p_count, rows=-(-len(docs.vocabulary) // p_count),
      doc=place(local_doc, 0, np.int32), row=place(docs.tokens // p_count, 0, np.int32),
      mask=place(np.ones(docs.num_tokens, bool), False, bool),
      topic=place(topic0, 0, np.int32), token=place(np.arange(docs.num_tokens), -1, np.int64),
      length=length, doc_id=doc_id)
