"""The designs of the sparse models: shapes, standardisation, correlation by group, the sparse
truth, the bundled sets (offline), bad input."""

import socket

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.data import _sparse_design
from hetjax.data._sparse_design import Response, bundled_design, correlated_design

N = 4096  # rows: a sample correlation's sd is ≤ 1/√N = 1/64


def _corr(x):
  x = x.astype(np.float64)
  return x.T @ x / x.shape[0]                      # columns have mean 0, variance 1


def test_shapes_dtypes_and_standardised_columns():
  design = correlated_design(300, 50, groups=2, group_size=10, rho=0.5, seed=1)
  assert design.name == 'synthetic' and (design.rows, design.features) == (300, 50)
  assert design.x.dtype == np.float32 and design.y.dtype == np.float32
  assert design.truth.dtype == np.float64 and design.truth.shape == (50,)
  x = design.x.astype(np.float64)
  np.testing.assert_allclose(x.mean(0), 0, atol=1e-6)
  np.testing.assert_allclose((x * x).sum(0), 300, rtol=1e-5)      # Σᵢ xᵢⱼ² = n
  assert abs(float(design.y.mean())) < 1e-5                       # the response is centred


def test_columns_of_a_group_correlate_rho_and_groups_are_independent():
  rho, groups, size = 0.7, 3, 8
  design = correlated_design(N, 40, groups=groups, group_size=size, rho=rho, seed=2)
  corr = _corr(design.x)
  group = np.full(40, -1)
  group[:groups * size] = np.arange(groups * size) // size
  i, j = np.triu_indices(40, 1)
  same = (group[i] == group[j]) & (group[i] >= 0)
  # A sample correlation at ρ has sd ≈ (1 − ρ²) / √N = 0.008 (at 0: 1/64 ≈ 0.016); each bound is
  # 6 sd, over 84 same-group and 696 other pairs.
  assert np.all(np.abs(corr[i[same], j[same]] - rho) < 6 * (1 - rho**2) / np.sqrt(N))
  assert np.all(np.abs(corr[i[~same], j[~same]]) < 6 / np.sqrt(N))
  assert abs(corr[i[same], j[same]].mean() - rho) < 0.01


def test_a_group_across_generation_blocks_is_still_one_group(monkeypatch):
  monkeypatch.setattr(_sparse_design, '_BLOCK', 5)  # columns made 5 at a time
  design = correlated_design(N, 24, groups=2, group_size=8, rho=0.8, seed=3)
  corr = _corr(design.x)
  assert abs(corr[3, 7] - 0.8) < 0.05 and abs(corr[8, 15] - 0.8) < 0.05  # blocks 0|1, 1|2|3
  assert abs(corr[7, 8]) < 0.1 and abs(corr[15, 16]) < 0.1
  np.testing.assert_allclose(design.x.astype(np.float64).std(0), 1, rtol=1e-5)


def test_the_truth_is_sparse_and_makes_the_response():
  design = correlated_design(N, 64, groups=1, group_size=16, nonzeros=5, noise=0.5, seed=4)
  support = np.flatnonzero(design.truth)
  assert support.size == 5 and set(np.abs(design.truth[support])) == {1.0}
  # y = Xβ* + noise, centred: the residual is the noise (sd 0.5).
  residual = design.y - design.x.astype(np.float64) @ design.truth
  assert abs(residual.std() - 0.5) < 0.05
  labels = correlated_design(N, 64, nonzeros=5, group_size=16, response='logistic', seed=4)
  assert set(labels.y.tolist()) == {-1.0, 1.0}
  np.testing.assert_array_equal(labels.x, design.x)            # the same seed, the same X
  # P(y = +1) = σ(xᵀβ*): y agrees in sign with the signal far more often than not.
  signal = labels.x.astype(np.float64) @ labels.truth
  assert np.mean(np.sign(signal) == labels.y) > 0.7
  assert correlated_design(64, 8, group_size=4, nonzeros=0).truth.sum() == 0


def test_the_seed_decides_everything():
  a, b = (correlated_design(100, 20, group_size=5, seed=7) for _ in range(2))
  np.testing.assert_array_equal(a.x, b.x)
  np.testing.assert_array_equal(a.y, b.y)
  c = correlated_design(100, 20, group_size=5, seed=8)
  assert not np.array_equal(a.x, c.x)


def test_bundled_designs_load_offline(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError('a bundled design opened a socket')

  monkeypatch.setattr(socket, 'socket', refuse)
  monkeypatch.setattr(socket, 'create_connection', refuse)
  diabetes = bundled_design('diabetes')
  assert diabetes.x.shape == (442, 10) and diabetes.truth is None
  y = diabetes.y.astype(np.float64)
  assert abs(y.mean()) < 1e-6 and abs(y.std() - 1) < 1e-6
  cancer = bundled_design('breast_cancer')
  assert cancer.x.shape == (569, 30) and set(cancer.y.tolist()) == {-1.0, 1.0}
  assert int((cancer.y == 1).sum()) == 357                       # benign
  for design in (diabetes, cancer):
    x = design.x.astype(np.float64)
    np.testing.assert_allclose(x.mean(0), 0, atol=1e-6)
    np.testing.assert_allclose(x.std(0), 1, rtol=1e-5)


def test_a_constant_column_standardises_to_zeros():
  x = np.array([[1.0, 5.0], [3.0, 5.0], [2.0, 5.0]], np.float32)
  _sparse_design._standardise(x)
  np.testing.assert_allclose(x[:, 0], [-np.sqrt(1.5), np.sqrt(1.5), 0.0], rtol=1e-6)
  assert not x[:, 1].any()


@pytest.mark.parametrize('kwargs, message', [
    ({'rows': 1}, 'a design needs rows >= 2 and features >= 1, got 1 x 8'),
    ({'features': 0, 'group_size': 1, 'nonzeros': 0}, 'rows >= 2 and features >= 1'),
    ({'groups': 3, 'group_size': 4}, '3 groups of 4 columns do not fit in 8 features'),
    ({'group_size': 0}, 'groups of 0 columns do not fit'),
    ({'groups': -1}, 'do not fit'),
    ({'rho': 1.0}, r'rho must be in \[0, 1\), got 1.0'),
    ({'rho': -0.1}, r'rho must be in \[0, 1\)'),
    ({'nonzeros': 9}, r'nonzeros must be in \[0, 8\], got 9'),
    ({'noise': -1.0}, 'noise must be >= 0, got -1.0'),
    ({'response': 'poisson'}, "unknown response 'poisson'; choose one of: linear, logistic"),
])
def test_bad_arguments_are_one_line(kwargs, message):
  args = {'rows': 16, 'features': 8, 'group_size': 4, 'nonzeros': 2} | kwargs
  with pytest.raises(ConfigError, match=message) as e:
    correlated_design(**args)
  assert '\n' not in str(e.value)


def test_an_unknown_bundled_design_is_one_line():
  with pytest.raises(ConfigError, match="unknown bundled design 'iris'; choose one of: "
                     'diabetes, breast_cancer'):
    bundled_design('iris')
  assert Response('logistic') is Response.LOGISTIC
