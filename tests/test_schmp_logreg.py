"""SchMP L1 logistic regression: a round is the numpy proximal coordinate steps, runs reach
scikit-learn's optimum on breast_cancer and on a synthetic design, devices and padding change
nothing, bad input is one line."""

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.schmp import Schedule, SchmpProgram, make_app
from hetjax.schmp._cyclic import Cyclic
from hetjax.schmp._dynamic import DynamicScheduler
from hetjax.schmp._logreg import LogReg
from hetjax.schmp._shotgun import Shotgun
from tests.conftest import require_devices
from tests.schmp_coordinate import SIZE, Programs, Replay, U, check_rounds_against_numpy, run

_SHARED = Programs('logreg')
_app, _program, _run = _SHARED.app, _SHARED.program, run


def _sigmoid(t):
  return 0.5 * (1 + np.tanh(0.5 * t))


def _numpy_round(app, beta, m, schedule):
  """Δβ per picked slot, β and the margins after ``schedule`` from ``(β, m)``, in float64, and
  the float32 error bound of each Δβⱼ."""
  x, y, lam = app.design.x.astype(np.float64), app.design.y.astype(np.float64), app.lam
  j = schedule.picked
  xj = x[:, j]
  w = -y * _sigmoid(-y * m)
  g, h = xj.T @ w, 0.25 * (xj * xj).sum(0)
  a = beta[j] * h - g
  delta = np.sign(a) * np.maximum(np.abs(a) - lam, 0.0) / h - beta[j]
  new = beta.copy()
  new[j] += delta
  # The device sums n float32 terms over its rows and P ≤ 4 partial sums, each within
  # (n + P) u Σ|terms| of the exact sum (Higham, Accuracy and Stability, (3.5)); σ in float32
  # is within a few ulps; S is 1-Lipschitz, so Δβⱼ is within that over hⱼ, plus a few ulps.
  n = x.shape[0]
  bound = (n + 16) * U * (np.abs(xj).T @ np.abs(w) + np.abs(beta[j]) * h) / h
  bound += 8 * U * (np.abs(delta) + np.abs(beta[j]))
  return delta, new, m + xj @ delta, bound


@pytest.mark.parametrize('devices', [1, 2, 4])
def test_a_round_is_the_numpy_proximal_coordinate_steps(devices):
  app, program = _program(devices)
  check_rounds_against_numpy(app, program, _numpy_round, 'margin', seed=devices)


@pytest.mark.parametrize('data', ['synthetic', 'breast_cancer'])
def test_the_reference_is_optimal_for_this_objective(data):
  # KKT of Σ log(1 + exp(−y xᵀβ)) + λ‖β‖₁ at scikit-learn's β (C = 1/λ): the loss's gradient
  # g has |gⱼ| ≤ λ, and gⱼ = −λ sign(βⱼ) where βⱼ ≠ 0 (liblinear at tol 1e-8: to ~3e-7 of λ).
  app = _app(data)
  beta = app.reference_coefficients()
  x, y = app.design.x.astype(np.float64), app.design.y.astype(np.float64)
  g = x.T @ (-y * _sigmoid(-y * (x @ beta)))
  nonzero = beta != 0
  assert 0 < nonzero.sum() < app.blocks
  np.testing.assert_allclose(g[nonzero], -app.lam * np.sign(beta[nonzero]), rtol=1e-5)
  assert np.all(np.abs(g[~nonzero]) <= app.lam * (1 + 1e-5))
  # λ_max = ½‖Xᵀy‖_∞ is where β = 0 becomes optimal: the default λ is a tenth of it.
  assert app.lam == pytest.approx(0.5 * np.abs(x.T @ y).max() / 10)


def test_cyclic_descent_reaches_scikit_learns_optimum_on_breast_cancer():
  app, program = _program(1, 'breast_cancer')
  assert make_app('logreg', scheduler='cyclic', data='breast_cancer').default_schedule_size(2) == 1
  reference = app.reference_objective()
  # The ¼Σx² curvature bounds the loss's along each coordinate: every step descends. It is
  # slower than Newton's here (_logreg's docstring): 1e-3 relative after 1410 rounds, 7e-4 at
  # 1800, the objective's slow tail.
  losses, beta = _run(program, Cyclic(app.blocks, program.schedule_size), 1800)
  assert np.all(np.diff(losses) <= 1e-6 * reference)          # monotone, to float32
  assert losses[-1] == pytest.approx(reference, rel=1e-3)
  assert app.objective_at(beta) == pytest.approx(reference, rel=1e-3)


def test_the_dynamic_schedule_reaches_scikit_learns_optimum_on_a_synthetic_design():
  app, program = _program(1)
  policy = app.policy(SIZE, seed=0)
  assert isinstance(policy, DynamicScheduler)
  losses, beta = _run(program, policy, 600)
  reference = app.reference_objective()
  assert losses[-1] == pytest.approx(reference, rel=1e-3)
  assert app.objective_at(beta) == pytest.approx(reference, rel=1e-3)


def test_devices_change_nothing_but_float32_summation_order():
  app, one = _program(1)
  schedules = [Schedule.of(Shotgun(app.blocks, 4, seed=s).update({'round': 0}, None)[0].picked,
                           SIZE) for s in range(40)]
  losses1, reference = _run(one, Replay(schedules), 40)
  assert np.isfinite(losses1).all() and losses1[-1] < losses1[0]
  for devices in (2, 4):
    losses, beta = _run(_program(devices)[1], Replay(schedules), 40)
    np.testing.assert_allclose(beta, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, losses1, rtol=1e-6)


def test_padded_rows_change_no_update_and_no_objective():
  app, four = _program(4, 'breast_cancer')                     # 569 rows: 3 padding rows
  data = app.host_data(4)
  assert data['x'].shape == (572, 30) and not data['y'][569:].any()
  schedules = [Cyclic(app.blocks, app.blocks).update({'round': t}, None)[0] for t in range(40)]
  losses4, beta4 = _run(four, Replay(schedules), 40)
  losses1, beta1 = _run(_program(1, 'breast_cancer')[1], Replay(schedules), 40)
  np.testing.assert_allclose(beta4, beta1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(losses4, losses1, rtol=1e-6)   # a padding row would add log 2
  assert losses4[-1] == pytest.approx(app.objective_at(beta4), rel=1e-6)
  with pytest.raises(ConfigError, match="app 'logreg': 569 rows do not divide over 2 devices"):
    SchmpProgram(make_app('logreg', data='breast_cancer'), 1, require_devices(2))


def test_the_docstring_example_and_the_config():
  app = make_app('logreg', scheduler='cyclic', data='breast_cancer')
  assert isinstance(app, LogReg) and app.name == 'logreg'
  assert (app.blocks, app.default_schedule_size(2), round(app.lam, 1)) == (30, 1, 21.8)
  assert app.config['scheduler'] == 'cyclic' and app.config['data'] == 'breast_cancer'
  assert set(app.design.y.tolist()) == {-1.0, 1.0}
  synthetic = _app()
  assert synthetic.config['rho'] == 0.9 and 'noise' not in synthetic.config
  assert set(synthetic.design.y.tolist()) == {-1.0, 1.0}


@pytest.mark.parametrize('kwargs, message', [
    ({'lam': 0}, "app 'logreg': lam must be > 0, got 0"),
    ({'lam': -0.5}, "app 'logreg': lam must be > 0, got -0.5"),
    ({'scheduler': 'nope'}, "unknown scheduler 'nope'; choose one of: schmp, shotgun, cyclic"),
    ({'data': 'diabetes'}, "unknown data 'diabetes'; choose one of: synthetic, breast_cancer"),
    ({'data': 'breast_cancer', 'rows': 10}, "data 'breast_cancer' is bundled: rows apply to"),
    ({'noise': 1.0}, "app 'logreg': got an unexpected keyword argument 'noise'"),
    ({'warmup': -1}, 'warmup, epsilon and eta must be >= 0'),
])
def test_bad_arguments_are_one_line(kwargs, message):
  with pytest.raises(ConfigError, match=message) as e:
    make_app('logreg', **kwargs)
  assert '\n' not in str(e.value)
