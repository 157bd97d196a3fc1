"""Byte-level text from the running interpreter's own standard library, offline."""

from __future__ import annotations

import functools
import os
import sysconfig

import numpy as np

from hetjax._errors import ConfigError
from hetjax.data._source import Batch, step_rng

_SKIP_DIRS = frozenset({'site-packages', 'test', 'tests', 'idlelib'})


@functools.lru_cache(maxsize=2)
def _read_corpus(max_bytes: int) -> np.ndarray:
  """The first ``max_bytes`` bytes of the stdlib's ``.py`` files, walked in sorted order.

  Sorting the walk makes the corpus the same on every worker running the same interpreter, so a
  window's start position names the same bytes everywhere.
  """
  root = sysconfig.get_paths()['stdlib']
  chunks: list[bytes] = []
  total = 0
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    for name in sorted(filenames):
      if not name.endswith('.py'):
        continue
      with open(os.path.join(dirpath, name), 'rb') as f:
        chunk = f.read(max_bytes - total)
      chunks.append(chunk)
      total += len(chunk)
      if total >= max_bytes:
        break
    if total >= max_bytes:
      break
  corpus = np.frombuffer(b''.join(chunks), dtype=np.uint8)
  corpus.flags.writeable = False  # shared by every cached source
  return corpus


class StdlibText:
  """Random windows of the standard library's source bytes, for byte-level language models.

  The corpus is read once from the interpreter's library directory (nothing is downloaded). Each
  batch row is a window of ``seq_len + 1`` consecutive bytes whose start comes from
  `step_rng(seed, step)` alone: inputs are ``tokens[:, :-1]``, next-byte targets
  ``tokens[:, 1:]``.

  Example::

    >>> src = stdlib_text(seq_len=16)
    >>> src.global_batch(seed=0, step=3, size=4)['tokens'].shape
    (4, 17)

  Attributes:
    seq_len: model context length; rows hold ``seq_len + 1`` bytes.
    corpus: read-only ``uint8[num_bytes]`` array of the concatenated files.
    num_bytes: length of ``corpus``.
  """

  def __init__(self, corpus: np.ndarray, seq_len: int):
    if seq_len < 1:
      raise ConfigError(f'seq_len must be at least 1, got {seq_len}')
    if len(corpus) < seq_len + 1:
      raise ConfigError(
          f'the stdlib corpus has {len(corpus)} bytes, fewer than seq_len + 1 = {seq_len + 1}')
    self.corpus = corpus
    self.num_bytes = len(corpus)
    self.seq_len = seq_len

  def global_batch(self, seed: int, step: int, size: int) -> Batch:
    """Returns ``{'tokens': int32[size, seq_len + 1]}``, byte values in ``[0, 256)``."""
    return self.read_rows(seed, step, size, 0, size)

  def read_rows(self, seed: int, step: int, size: int, lo: int, hi: int) -> Batch:
    """Rows ``lo:hi`` of `global_batch`, reading only their windows (`RowSource`)."""
    starts = step_rng(seed, step).integers(0, self.num_bytes - self.seq_len, size=size)[lo:hi]
    windows = self.corpus[starts[:, None] + np.arange(self.seq_len + 1)]
    return {'tokens': windows.astype(np.int32)}


@functools.lru_cache(maxsize=8)
def stdlib_text(seq_len: int = 64, max_bytes: int = 4_000_000) -> StdlibText:
  """The stdlib byte corpus (at most ``max_bytes``) cut into windows of ``seq_len + 1``.

  Raises:
    ConfigError: if ``seq_len < 1`` or the corpus is shorter than ``seq_len + 1`` bytes.
  """
  if seq_len < 1:
    raise ConfigError(f'seq_len must be at least 1, got {seq_len}')
  if max_bytes < 1:
    raise ConfigError(f'max_bytes must be at least 1, got {max_bytes}')
  return StdlibText(_read_corpus(max_bytes), seq_len)
