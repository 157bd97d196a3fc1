"""The problem the communication schemes train on the virtual clock: noisy least squares.

A fixed data set of ``rows`` rows x ~ N(0, Σ), Σ = diag(λ) with λ spread geometrically from 1
down to 1 / ``condition``, and targets y = x·w₀ + ``noise``·ε. The objective is the mean squared
error over the whole data set; it is quadratic, so with H = xᵀx / rows its excess over the
least-squares optimum w* is exactly ½ (w − w*)ᵀ H (w − w*): O(d²) after every update, even at
1024 workers.

Step ``k``'s global batch is ``global_batch`` row indices drawn with replacement by a generator
seeded by (seed, k): it depends on the step only, never on how many workers share it. With n
workers, worker i takes the i-th of n equal slices (`worker_rows`); a synchronous step's mean of
the n workers' mean gradients is then the gradient of the whole batch (`gradient` over all its
rows), which is how the simulation computes it. An asynchronous worker's k-th gradient uses its
slice of batch k.

Example::

  >>> problem = LeastSquares(features=8, global_batch=64, rows=1024)
  >>> w = problem.start()
  >>> round(problem.loss(w), 3), problem.loss(problem.optimum)
  (1.28, 0.0)
  >>> g = problem.gradient(w, 0, problem.worker_rows(1, 4))   # worker 1 of 4: rows 16…31
  >>> g.shape
  (8,)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol

import numpy as np

from hetjax._errors import ConfigError


class CommProblem(Protocol):
  """What `simulate_comm` needs of a problem: its start, gradients of batch rows and a loss."""

  global_batch: int

  def start(self) -> np.ndarray: ...

  def worker_rows(self, worker: int, workers: int) -> slice:
    """Worker ``worker``'s slice of a global batch split ``workers`` ways."""

  def gradient(self, params: np.ndarray, step: int, rows: slice) -> np.ndarray:
    """The mean gradient over ``rows`` of step ``step``'s global batch, at ``params``."""

  def worker_gradients(self, params: np.ndarray, step: int) -> np.ndarray:
    """(n, d): row i is worker i's gradient on its slice of batch ``step`` at ``params[i]``."""

  def loss(self, params: np.ndarray) -> float: ...


@dataclasses.dataclass(frozen=True)
class LeastSquares:
  """Noisy least squares on ``rows`` fixed rows (module docstring); B = ``global_batch`` a step."""

  features: int = 32
  global_batch: int = 1024
  rows: int = 16384
  condition: float = 10.0
  noise: float = 0.5
  seed: int = 0

  def __post_init__(self):
    if min(self.features, self.global_batch, self.rows) < 1:
      raise ConfigError(f'least squares needs features, global_batch and rows >= 1, got '
                        f'{self.features}, {self.global_batch} and {self.rows}')
    if not self.condition >= 1 or not self.noise >= 0:
      raise ConfigError(f'condition must be >= 1 and noise >= 0, got {self.condition} and '
                        f'{self.noise}')

  @functools.cached_property
  def data(self) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): the data set, read-only."""
    rng = np.random.default_rng([self.seed, 0xDA7A])
    scale = np.sqrt(np.geomspace(1.0, 1.0 / self.condition, self.features))
    x = rng.standard_normal((self.rows, self.features)) * scale
    y = x @ rng.standard_normal(self.features) + self.noise * rng.standard_normal(self.rows)
    for a in (x, y):
      a.setflags(write=False)
    return x, y

  @functools.cached_property
  def hessian(self) -> np.ndarray:
    """H = xᵀx / rows: the objective's curvature, eigenvalues ≈ 1 … 1 / condition."""
    x, _ = self.data
    return x.T @ x / self.rows

  @functools.cached_property
  def optimum(self) -> np.ndarray:
    """w*, the least-squares solution on the whole data set."""
    x, y = self.data
    return np.linalg.solve(self.hessian, x.T @ y / self.rows)

  def start(self) -> np.ndarray:
    return np.zeros(self.features)

  def loss(self, params: np.ndarray) -> float:
    """The full-data excess loss ½ (w − w*)ᵀ H (w − w*) = f(w) − f(w*), O(d²)."""
    error = params - self.optimum
    return 0.5 * float(error @ self.hessian @ error)

  def worker_rows(self, worker: int, workers: int) -> slice:
    return equal_rows(self.global_batch, worker, workers)

  def gradient(self, params: np.ndarray, step: int, rows: slice) -> np.ndarray:
    x, y = self.data
    pick = _batch(self, step)[rows]
    x, y = x[pick], y[pick]
    return x.T @ (x @ params - y) / len(y)

  def worker_gradients(self, params: np.ndarray, step: int) -> np.ndarray:
    n = len(params)
    self.worker_rows(0, n)
    x, y = self.data
    pick = _batch(self, step).reshape(n, -1)
    x, y = x[pick], y[pick]
    residual = np.einsum('nmd,nd->nm', x, params) - y
    return np.einsum('nmd,nm->nd', x, residual) / pick.shape[1]


def equal_rows(global_batch: int, worker: int, workers: int) -> slice:
  """Worker ``worker``'s slice of a global batch split ``workers`` ways (they must divide it)."""
  if global_batch % workers:
    raise ConfigError(f'{workers} workers do not divide the global batch of {global_batch} rows')
  share = global_batch // workers
  return slice(worker * share, (worker + 1) * share)


@functools.lru_cache(maxsize=256)
def _batch(problem: LeastSquares, step: int) -> np.ndarray:
  """Step ``step``'s global batch: row indices drawn with replacement, seeded by (seed, step)."""
  pick = np.random.default_rng([problem.seed, step]).integers(0, problem.rows, problem.global_batch)
  pick.setflags(write=False)
  return pick
