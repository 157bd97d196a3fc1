"""scikit-learn's bundled handwritten digits (1797 images of 8×8), offline."""

from __future__ import annotations

import functools

import numpy as np

from hetjax.data._source import ArraySource


@functools.lru_cache(maxsize=1)
def digits() -> ArraySource:
  """Digits as ``{'x': float32[N, 64] in [0, 1], 'y': int32[N]}``, read from sklearn's wheel."""
  from sklearn.datasets import load_digits  # bundled with the wheel: no download

  data = load_digits()
  return ArraySource({
      'x': (data.data / 16.0).astype(np.float32),
      'y': data.target.astype(np.int32),
  })
