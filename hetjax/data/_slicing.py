"""Cutting a global batch into per-worker slices from integer shares."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.data._source import Batch, StepBatch, take_rows


def batch_size(batch: Batch | StepBatch) -> int:
  """The leading dimension shared by every array of ``batch`` (a `StepBatch`'s size, unread)."""
  if isinstance(batch, StepBatch):
    return batch.size
  sizes = {len(a) for a in batch.values()}
  if len(sizes) != 1:
    raise ValueError(f'batch arrays disagree on the batch size: { {k: len(a) for k, a in batch.items()} }')
  return sizes.pop()


def share_offsets(shares: Sequence[int], total: int) -> np.ndarray:
  """Start row of each worker's slice, plus ``total`` at the end.

  Raises:
    ConfigError: if a share is negative or not an integer, or the shares do not sum to ``total``.
  """
  for i, s in enumerate(shares):
    if int(s) != s or s < 0:
      raise ConfigError(f'share {i} is {s!r}; shares must be non-negative integers')
  if sum(shares) != total:
    raise ConfigError(f'shares {tuple(shares)} sum to {sum(shares)}, not the global batch {total}')
  return np.concatenate([[0], np.cumsum(np.asarray(shares, dtype=np.int64))])


def slice_batch(batch: Batch | StepBatch, shares: Sequence[int], index: int) -> Batch:
  """Rows ``[offset_i, offset_i + shares[i])`` of every array: worker ``index``'s slice (of a
  `StepBatch`, only those rows are read).

  Example::

    >>> b = {'x': np.arange(6)}
    >>> slice_batch(b, shares=(4, 2), index=1)['x']
    array([4, 5])
  """
  offsets = share_offsets(shares, batch_size(batch))
  return take_rows(batch, int(offsets[index]), int(offsets[index + 1]))


def split_batch(batch: Batch, shares: Sequence[int]) -> list[Batch]:
  """Every worker's slice, in worker order; their concatenation is ``batch``."""
  return [slice_batch(batch, shares, i) for i in range(len(shares))]
