"""scikit-learn's bundled handwritten digits (1797 images of 8×8), offline."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import pathlib

import numpy as np

from hetjax.data._source import ArraySource


@functools.lru_cache(maxsize=1)
def digits() -> ArraySource:
  """Digits as ``{'x': float32[N, 64] in [0, 1], 'y': int32[N]}``, read from sklearn's wheel.

  The file `sklearn.datasets.load_digits` reads, read the same way (`np.loadtxt` of
  ``digits.csv.gz``: 64 pixel columns, then the label) without importing scikit-learn, whose
  import would cost every worker process a noticeable amount of CPU at start-up.
  """
  spec = importlib.util.find_spec('sklearn')  # locates the package without importing it
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError('the digits data set needs scikit-learn installed')
  path = pathlib.Path(spec.submodule_search_locations[0]) / 'datasets' / 'data' / 'digits.csv.gz'
  with gzip.open(path, 'rt') as f:
    data = np.loadtxt(f, delimiter=',')
  return ArraySource({
      'x': (data[:, :-1] / 16.0).astype(np.float32),
      'y': data[:, -1].astype(np.int32),
  })
