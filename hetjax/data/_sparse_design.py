"""Designs (X, y) for the sparse (L1) models: a seeded synthetic one with correlated column
groups and a known sparse truth, and scikit-learn's bundled diabetes and breast-cancer data.

Coordinate descent is only interesting where columns are correlated: two correlated
coordinates updated at once from the same β both correct the same part of the residual and
overshoot it together (Shotgun's divergence past P* ≈ d / ρ(XᵀX)), which is what SchMP's
dependency check prevents. The synthetic design makes that correlation a dial. Column j of
group g is ``x_j = √ρ · z_g + √(1 − ρ) · e_j`` with z_g, e_j independent standard normal
rows, so two columns of one group correlate ρ and columns of different groups (or columns in
no group) do not; the first ``groups × group_size`` columns form the groups, the rest stand
alone. ``XᵀX / n`` then has one eigenvalue 1 + (group_size − 1)·ρ per group, so a group of 512
at ρ = 0.9 puts P* near 2 whatever the other columns are.

Every design is standardised the way scikit-learn's ``StandardScaler`` does it: each column has
mean 0 and variance 1 over the rows (Σᵢ xᵢⱼ² = n), so XᵀX / n is the columns' correlation
matrix and coefficients are on the scale of one standard deviation of their feature (a
constant column becomes all zeros). The regression response is centred, so no intercept is
needed; classification labels are ±1 and the models fit no intercept.

Sizes: X is float32, n × d × 4 bytes: the default 1024 × 1024 takes 4 MB, 1024 × 10⁵ features
410 MB (generated a block of columns at a time, never as float64). An executor holds a second
copy on its devices, and a scikit-learn reference solve a float64 one.

Example::

  >>> design = correlated_design(rows=4096, features=64, groups=2, group_size=8, rho=0.8)
  >>> design.x.shape, design.y.shape, int((design.truth != 0).sum())
  ((4096, 64), (4096,), 16)
  >>> corr = design.x.T @ design.x / 4096         # unit-variance columns
  >>> [round(abs(float(corr[0, k])), 1) for k in (1, 9, 40)]   # same group, next group, none
  [0.8, 0.0, 0.0]
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from hetjax._errors import ConfigError, parse_choice

_BLOCK = 4096  # columns generated at a time (bounds the float32 temporaries)


class Response(enum.Enum):
  """What y is: ``LINEAR`` y = Xβ* + noise (Lasso); ``LOGISTIC`` y = ±1 with P(y = +1) =
  σ(xᵢᵀβ*) (L1 logistic regression)."""

  LINEAR = 'linear'
  LOGISTIC = 'logistic'


@dataclasses.dataclass(frozen=True, eq=False)
class SparseDesign:
  """A standardised design and its response.

  Attributes:
    name: ``'synthetic'``, ``'diabetes'`` or ``'breast_cancer'``.
    x: float32[n, d], columns of mean 0 and variance 1 (module docstring).
    y: float32[n], the centred response (``LINEAR``) or labels ±1 (``LOGISTIC``).
    truth: float64[d], the sparse β* that made y, or None for real data.
  """

  name: str
  x: np.ndarray
  y: np.ndarray
  truth: np.ndarray | None = None

  @property
  def rows(self) -> int:
    return int(self.x.shape[0])

  @property
  def features(self) -> int:
    return int(self.x.shape[1])


def correlated_design(rows: int = 1024, features: int = 1024, *, groups: int = 1,
                      group_size: int = 512, rho: float = 0.9, nonzeros: int = 16,
                      noise: float = 1.0, response: Response | str = Response.LINEAR,
                      seed: int = 0) -> SparseDesign:
  """A seeded design with correlated column groups and a known sparse truth.

  Args:
    rows, features: n and d.
    groups, group_size: the first ``groups × group_size`` columns form groups of correlated
      columns; the others are independent.
    rho: the correlation of two columns of one group, in [0, 1).
    nonzeros: how many coordinates of β* are nonzero (chosen at random, each ±1: a change of
      one standard deviation in the feature moves y by one).
    noise: the standard deviation of the Gaussian noise added to Xβ* (``LINEAR`` only).
    response: ``'linear'`` or ``'logistic'`` (`Response`).
    seed: everything random derives from it.

  Raises:
    ConfigError: sizes below 1, groups that do not fit, ρ outside [0, 1), nonzeros outside
      [0, d], negative noise.
  """
  response = parse_choice(Response, response, 'response')
  if rows < 2 or features < 1:
    raise ConfigError(f'a design needs rows >= 2 and features >= 1, got {rows} x {features}')
  if groups < 0 or group_size < 1 or groups * group_size > features:
    raise ConfigError(f'{groups} groups of {group_size} columns do not fit in {features} '
                      'features')
  if not 0.0 <= rho < 1.0:
    raise ConfigError(f'rho must be in [0, 1), got {rho}')
  if not 0 <= nonzeros <= features:
    raise ConfigError(f'nonzeros must be in [0, {features}], got {nonzeros}')
  if noise < 0:
    raise ConfigError(f'noise must be >= 0, got {noise}')
  rng = np.random.default_rng([seed, 0x1A550])
  factors = rng.standard_normal((rows, max(groups, 1)), dtype=np.float32)
  x = np.empty((rows, features), np.float32)
  grouped = groups * group_size
  for start in range(0, features, _BLOCK):
    cols = np.arange(start, min(start + _BLOCK, features))
    block = rng.standard_normal((rows, cols.size), dtype=np.float32)
    inside = cols < grouped
    if inside.any():
      shared = factors[:, cols[inside] // group_size]
      block[:, inside] = np.sqrt(rho) * shared + np.sqrt(1 - rho) * block[:, inside]
    x[:, cols] = block
  _standardise(x)
  truth = np.zeros(features)
  picked = rng.choice(features, nonzeros, replace=False)
  truth[picked] = rng.choice([-1.0, 1.0], nonzeros)
  signal = x[:, picked].astype(np.float64) @ truth[picked]
  if response is Response.LINEAR:
    y = signal + noise * rng.standard_normal(rows)
    y -= y.mean()
  else:
    y = np.where(rng.random(rows) < 1 / (1 + np.exp(-signal)), 1.0, -1.0)
  return SparseDesign('synthetic', x, y.astype(np.float32), truth)


def bundled_design(name: str) -> SparseDesign:
  """scikit-learn's ``'diabetes'`` (442 × 10, regression: y the disease score, centred and
  scaled to variance 1) or ``'breast_cancer'`` (569 × 30, labels +1 benign / −1 malignant),
  read from the wheel (no download) and standardised (module docstring).

  Raises:
    ConfigError: another name.
  """
  from sklearn import datasets  # bundled with the wheel: no download

  if name == 'diabetes':
    data = datasets.load_diabetes(scaled=False)
    y = data.target - data.target.mean()
    y = y / y.std()
  elif name == 'breast_cancer':
    data = datasets.load_breast_cancer()
    y = np.where(data.target == 1, 1.0, -1.0)
  else:
    raise ConfigError(f'unknown bundled design {name!r}; choose one of: diabetes, '
                      'breast_cancer')
  x = np.asarray(data.data, np.float32)
  _standardise(x)
  return SparseDesign(name, x, y.astype(np.float32))


def _standardise(x: np.ndarray) -> None:
  """Columns of ``x`` (in place) to mean 0, variance 1; constant columns to 0."""
  for start in range(0, x.shape[1], _BLOCK):
    block = x[:, start:start + _BLOCK].astype(np.float64)
    block -= block.mean(0)
    std = block.std(0)
    x[:, start:start + _BLOCK] = np.where(std > 0, block / np.where(std > 0, std, 1), 0.0)
