"""Data sources whose global batch is a function of (seed, step) only."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Protocol, runtime_checkable

import numpy as np

Batch = dict[str, np.ndarray]


def step_rng(seed: int, step: int, stream: int = 0) -> np.random.Generator:
  """A generator determined by ``(seed, step, stream)`` alone, independent across steps."""
  return np.random.default_rng([seed, step, stream])


@runtime_checkable
class DataSource(Protocol):
  """Produces the global batch of a step.

  The batch depends on ``(seed, step, size)`` only, never on how many workers there are or how
  the batch is split among them (Levanter's data-loader design): rebalancing changes who computes
  which rows, never which rows form the batch. Every array has the batch as its leading axis.
  """

  def global_batch(self, seed: int, step: int, size: int) -> Batch:
    ...


@runtime_checkable
class RowSource(DataSource, Protocol):
  """A `DataSource` that reads rows ``lo:hi`` of a global batch alone (a memory-mapped token
  dataset, the stdlib corpus, an in-memory array): what lets each worker read only its share.

  The method's name is one no other source attribute takes (a source's ``rows`` may be its
  table's size, as `ZipfClicks`'s): a runtime protocol is checked by name alone."""

  def read_rows(self, seed: int, step: int, size: int, lo: int, hi: int) -> Batch:
    """Rows ``lo:hi`` of ``global_batch(seed, step, size)``, without reading the others."""
    ...


class StepBatch(Mapping):
  """One step's global batch, read when and where it is asked for.

  A multi-worker program hands the loop a `StepBatch` instead of the batch itself:
  `slice_batch` and `take_rows` read only the rows asked for from a `RowSource` (a worker's
  share, a token), and anything that reads it as a mapping reads the whole batch once. The
  rows are those of ``source.global_batch(seed, step, size)`` either way.

  Example::

    >>> batch = StepBatch(ArraySource({'x': np.arange(10.0)}), seed=0, step=1, size=4)
    >>> take_rows(batch, 1, 3)['x'].shape
    (2,)
  """

  def __init__(self, source: DataSource, seed: int, step: int, size: int):
    self.source, self.seed, self.step, self.size = source, seed, step, size
    self._whole: Batch | None = None

  def rows(self, lo: int, hi: int) -> Batch:
    """Rows ``lo:hi``: read alone from a `RowSource`, else cut from the whole batch."""
    if self._whole is None and isinstance(self.source, RowSource):
      return self.source.read_rows(self.seed, self.step, self.size, lo, hi)
    return {k: a[lo:hi] for k, a in self.whole().items()}

  def whole(self) -> Batch:
    """The whole batch, read once."""
    if self._whole is None:
      self._whole = self.source.global_batch(self.seed, self.step, self.size)
    return self._whole

  def __getitem__(self, key: str) -> np.ndarray:
    return self.whole()[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self.whole())

  def __len__(self) -> int:
    return len(self.whole())


def take_rows(batch: Batch | StepBatch, lo: int, hi: int) -> Batch:
  """Rows ``lo:hi`` of every array of ``batch`` (of a `StepBatch`, reading only those)."""
  if isinstance(batch, StepBatch):
    return batch.rows(lo, hi)
  return {k: a[lo:hi] for k, a in batch.items()}


class ArraySource:
  """A finite in-memory dataset read in epochs, each epoch a fresh seeded permutation.

  Step ``s`` with batch size ``B`` takes positions ``[s·B, (s+1)·B)`` of the endless sequence
  formed by concatenating the permutations of epochs 0, 1, 2, …; a batch may straddle two epochs.

  Example::

    >>> src = ArraySource({'x': np.arange(10.0), 'y': np.arange(10)})
    >>> src.global_batch(seed=0, step=3, size=4)['y'].shape
    (4,)
  """

  def __init__(self, arrays: Mapping[str, np.ndarray]):
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) != 1:
      raise ValueError(f'arrays have different lengths: { {k: len(a) for k, a in arrays.items()} }')
    self.arrays = {k: np.asarray(a) for k, a in arrays.items()}
    self.num_examples = lengths.pop()
    self._permutation = functools.lru_cache(maxsize=4)(self._new_permutation)

  def _new_permutation(self, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(self.num_examples)

  def indices(self, seed: int, step: int, size: int) -> np.ndarray:
    """The dataset rows that form step ``step``'s batch."""
    positions = np.arange(step * size, (step + 1) * size)
    epochs, offsets = np.divmod(positions, self.num_examples)
    out = np.empty(size, dtype=np.int64)
    for epoch in np.unique(epochs):
      mask = epochs == epoch
      out[mask] = self._permutation(seed, int(epoch))[offsets[mask]]
    return out

  def global_batch(self, seed: int, step: int, size: int) -> Batch:
    idx = self.indices(seed, step, size)
    return {k: a[idx] for k, a in self.arrays.items()}

  def read_rows(self, seed: int, step: int, size: int, lo: int, hi: int) -> Batch:
    """Rows ``lo:hi`` of `global_batch` (`RowSource`)."""
    idx = self.indices(seed, step, size)[lo:hi]
    return {k: a[idx] for k, a in self.arrays.items()}
