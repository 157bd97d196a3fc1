"""Seeded synthetic click logs with Zipf-distributed categorical ids, for recommender models."""

from __future__ import annotations

import functools

import numpy as np

from hetjax._errors import ConfigError
from hetjax.data._source import Batch, step_rng

_FACTORS = 4  # rank of the hidden pairwise (factorisation-machine) interaction


class ZipfClicks:
  """Click-through examples whose ids follow a bounded Zipf law, labelled by a hidden model.

  Real recommender traffic is skewed: a few items take most of the lookups, which is what makes
  embedding tables the interesting part to shard and balance. This source reproduces that skew
  offline and deterministically.

  Each example has ``fields`` categorical ids drawn independently from one shared table of
  ``rows`` ids. Zipf rank ``k`` (``k = 1 … rows``) is drawn with probability proportional to
  ``k ** -exponent`` by inverse-CDF sampling (the CDF is computed once, each draw is one
  ``np.searchsorted``), then mapped to a row id through a fixed seeded permutation, so the hot
  ids are scattered over the table and a row-sharded table receives a balanced share of them.
  ``dense`` continuous features are standard normal.

  The label is ``Bernoulli(sigmoid(logit))`` where ``logit`` is a ground-truth model fixed by the
  constructor's ``seed``: a per-row weight (normal · 0.5) summed over the fields, plus a linear
  function of the dense features, plus a small pairwise interaction between the fields (a
  rank-4 factorisation machine). So the task is learnable, and a wide & deep model can approach
  the Bayes loss. `true_logit` exposes that model for tests and baselines.

  Per-batch randomness comes from `step_rng(seed, step)` alone: the batch is a pure function of
  ``(seed, step, size)``, independent of how many workers read it.

  Example::

    >>> src = ZipfClicks(rows=1000, fields=4, dense=8)
    >>> batch = src.global_batch(seed=0, step=7, size=32)
    >>> batch['ids'].shape, batch['dense'].shape, batch['label'].shape
    ((32, 4), (32, 8), (32,))

  Attributes:
    rows, fields, dense, exponent, seed: the constructor's arguments.
    ids_by_rank: int32[rows], the row id of each Zipf rank, hottest first.
  """

  def __init__(
      self, rows: int = 100_000, fields: int = 4, dense: int = 8, exponent: float = 1.1,
      seed: int = 1234):
    if rows < 1:
      raise ConfigError(f'zipf_clicks needs rows >= 1, got {rows}')
    if fields < 1:
      raise ConfigError(f'zipf_clicks needs fields >= 1, got {fields}')
    if dense < 0:
      raise ConfigError(f'zipf_clicks needs dense >= 0, got {dense}')
    if not exponent > 0:
      raise ConfigError(f'zipf_clicks needs exponent > 0, got {exponent}')
    self.rows, self.fields, self.dense = rows, fields, dense
    self.exponent, self.seed = float(exponent), seed

    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -self.exponent)
    self._cdf = cdf / cdf[-1]
    rng = np.random.default_rng([seed, 0x21BF])
    self.ids_by_rank = rng.permutation(rows).astype(np.int32)
    self.ids_by_rank.flags.writeable = False
    self._row_weight = (rng.standard_normal(rows, dtype=np.float32) * 0.5)
    self._dense_weight = rng.standard_normal(dense, dtype=np.float32) / np.sqrt(max(dense, 1))
    self._factors = rng.standard_normal((rows, _FACTORS), dtype=np.float32) * 0.3

  def true_logit(self, ids: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """The hidden model's logit, float32[B], for ``ids`` int[B, fields] and ``dense`` [B, dense]."""
    v = self._factors[ids]  # [B, fields, factors]
    pairs = 0.5 * (np.square(v.sum(1)).sum(-1) - np.square(v).sum((1, 2)))  # Σ_{i<j} <v_i, v_j>
    return (self._row_weight[ids].sum(1) + dense @ self._dense_weight + pairs).astype(np.float32)

  def global_batch(self, seed: int, step: int, size: int) -> Batch:
    """``{'ids': int32[size, fields], 'dense': float32[size, dense], 'label': float32[size]}``."""
    rng = step_rng(seed, step)
    ranks = np.searchsorted(self._cdf, rng.random((size, self.fields)))
    ids = self.ids_by_rank[np.minimum(ranks, self.rows - 1)]  # the guard only matters for rounding
    dense = rng.standard_normal((size, self.dense), dtype=np.float32)
    prob = 1.0 / (1.0 + np.exp(-self.true_logit(ids, dense)))
    label = (rng.random(size, dtype=np.float32) < prob).astype(np.float32)
    return {'ids': ids, 'dense': dense, 'label': label}


@functools.lru_cache(maxsize=4)
def zipf_clicks(
    rows: int = 100_000, fields: int = 4, dense: int = 8, exponent: float = 1.1,
    seed: int = 1234) -> ZipfClicks:
  """The `ZipfClicks` source for these arguments, built once per process (tables are reused).

  Example::

    >>> zipf_clicks(rows=10**6) is zipf_clicks(rows=10**6)
    True

  Raises:
    ConfigError: if ``rows < 1``, ``fields < 1``, ``dense < 0`` or ``exponent <= 0``.
  """
  return ZipfClicks(rows, fields, dense, exponent, seed)
