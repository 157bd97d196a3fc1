"""SchMP-Lasso: a round is the numpy coordinate updates, cyclic descent reaches scikit-learn's
optimum, the dynamic schedule converges where Shotgun diverges, devices and padding change
nothing, bad input is one line."""

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import Work
from hetjax.schmp import Schedule, SchmpProgram, make_app
from hetjax.schmp._cyclic import Cyclic
from hetjax.schmp._dynamic import DynamicScheduler
from hetjax.schmp._shotgun import Shotgun
from tests.conftest import require_devices
from tests.schmp_coordinate import (
  DESIGN,
  SIZE,
  Programs,
  Replay,
  U,
  check_rounds_against_numpy,
  run,
)

_SHARED = Programs('lasso')
_app, _program, _run = _SHARED.app, _SHARED.program, run


def _numpy_round(app, beta, r, schedule):
  """Δβ per slot, β and the residual after ``schedule`` from ``(β, r)``, in float64, and the
  float32 error bound of each Δβⱼ."""
  x, lam = app.design.x.astype(np.float64), app.lam
  j = schedule.picked
  xj = x[:, j]
  xr, sq = xj.T @ r, (xj * xj).sum(0)
  a = xr + beta[j] * sq
  delta = np.sign(a) * np.maximum(np.abs(a) - lam, 0.0) / sq - beta[j]
  new = beta.copy()
  new[j] += delta
  # The device sums n float32 products over its rows and P ≤ 4 partial sums: each sum is within
  # (n + P) u Σ|terms| of the exact one (Higham, Accuracy and Stability, (3.5)); S is
  # 1-Lipschitz, so Δβⱼ is within that of xᵀr + β Σx² over Σx², plus a few ulps of the result.
  n = x.shape[0]
  bound = (n + 8) * U * (np.abs(xj).T @ np.abs(r) + np.abs(beta[j]) * sq) / sq
  bound += 8 * U * (np.abs(delta) + np.abs(beta[j]))
  return delta, new, r - xj @ delta, bound


@pytest.mark.parametrize('devices', [1, 2, 4])
def test_a_round_is_the_numpy_coordinate_updates(devices):
  app, program = _program(devices)
  check_rounds_against_numpy(app, program, _numpy_round, 'residual', seed=devices)


def test_a_round_reports_every_coordinates_current_priority():
  """``priority='current'`` (the default): after its update, a round reports for every
  coordinate |Δβⱼ| of the step it would take from the new β — numpy's, from the device's own β
  and residual, to float32 summation."""
  app, program = _program(2)
  assert app.reports_priority and app.options.priority == 'current'
  x = app.design.x.astype(np.float64)
  state = program.init_state()
  for step, picked in enumerate(([0, 5, 40], [1, 2, 3, 33, 60])):
    state, stats = program.step(state, Work(step, {}), Schedule.of(picked, SIZE))
    beta = np.asarray(state.params['beta'], np.float64)
    r = np.asarray(state.params['residual'], np.float64)
    sq = (x * x).sum(0)
    a = x.T @ r + beta * sq
    would = np.abs(np.sign(a) * np.maximum(np.abs(a) - app.lam, 0.0) / sq - beta)
    bound = (x.shape[0] + 8) * U * (np.abs(x).T @ np.abs(r) + np.abs(beta) * sq) / sq
    bound += 8 * U * (would + np.abs(beta))
    got = stats.local.priority
    assert got.shape == (app.blocks,) and np.all(np.abs(got - would) <= bound)
    assert np.count_nonzero(would > 1e-3) > len(picked)
  assert make_app('lasso', priority='abs', **DESIGN).reports_priority is False
  assert make_app('lasso', scheduler='shotgun', **DESIGN).reports_priority is False


def test_current_priorities_need_a_tenth_of_the_rounds_of_stale_ones():
  """STRADS's priority (each coordinate's last |Δβ|) against the current one, same slots, same
  θ check: the stale weights keep re-picking coordinates already minimised and miss those
  whose correlated partners moved (measured on this design: 540 rounds against 50)."""
  reference = _app().reference_objective()
  rounds = {}
  for priority in ('current', 'abs'):
    app = make_app('lasso', priority=priority, **DESIGN)
    program = SchmpProgram(app, SIZE, require_devices(1), staleness=1, objective_every=10)
    losses, _ = _run(program, app.policy(SIZE, seed=0), 1000)
    reached = np.flatnonzero(losses <= reference * (1 + 1e-3))
    assert reached.size, (priority, losses[-1] / reference - 1)
    rounds[priority] = 10 * (reached[0] + 1)
  assert rounds['current'] * 5 <= rounds['abs'], rounds


def test_the_reference_is_optimal_for_this_objective():
  # KKT of ½‖y − Xβ‖² + λ‖β‖₁ at scikit-learn's β: |xⱼᵀr| ≤ λ, = λ sign(βⱼ) where βⱼ ≠ 0. This
  # checks the α = λ / n scaling independently of any descent.
  app = _app()
  beta = app.reference_coefficients()
  x, y = app.design.x.astype(np.float64), app.design.y.astype(np.float64)
  corr = x.T @ (y - x @ beta)
  nonzero = beta != 0
  assert 0 < nonzero.sum() < app.blocks
  np.testing.assert_allclose(corr[nonzero], app.lam * np.sign(beta[nonzero]), rtol=1e-6)
  assert np.all(np.abs(corr[~nonzero]) <= app.lam * (1 + 1e-6))
  assert app.reference_objective() == pytest.approx(app.objective_at(beta))


def test_cyclic_descent_reaches_scikit_learns_optimum():
  app, program = _program(1, 'diabetes')
  assert make_app('lasso', scheduler='cyclic', data='diabetes').default_schedule_size(4) == 1
  policy = Cyclic(app.blocks, program.schedule_size)  # one coordinate, the other slots masked
  losses, beta = _run(program, policy, 400)
  reference = app.reference_objective()
  assert np.all(np.diff(losses) <= 1e-6 * reference)          # monotone, to float32
  assert losses[-1] == pytest.approx(reference, rel=1e-3)
  assert app.objective_at(beta) == pytest.approx(reference, rel=1e-6)
  # Strictly convex here (10 independent columns, 442 rows): β is the optimum to ~30 float32
  # ulps of its largest coefficient (0.3).
  np.testing.assert_allclose(beta, app.reference_coefficients(), rtol=0, atol=1e-5)


def test_the_dynamic_schedule_converges_where_shotgun_diverges():
  app, program = _program(1)
  reference = app.reference_objective()
  policy = app.policy(SIZE, seed=0)
  assert isinstance(policy, DynamicScheduler)
  losses, beta = _run(program, policy, 1000)
  assert losses[-1] == pytest.approx(reference, rel=1e-3)
  assert app.objective_at(beta) == pytest.approx(reference, rel=1e-3)
  # The same round with Shotgun's 32 uniform coordinates (P* ≈ 2.2): correlated coordinates
  # overshoot together and the objective leaves every bound within a few dozen rounds.
  shotgun = make_app('lasso', scheduler='shotgun', **DESIGN).policy(SIZE, seed=0)
  assert isinstance(shotgun, Shotgun)
  losses, _ = _run(program, shotgun, 60)
  start = app.objective_at(np.zeros(app.blocks))
  assert not np.isfinite(losses[-1]) or losses[-1] > 1e3 * start, losses


def test_devices_change_nothing_but_float32_summation_order():
  app, one = _program(1)
  schedules = [Shotgun(app.blocks, 4, seed=s).update({'round': 0}, None)[0] for s in range(40)]
  schedules = [Schedule.of(s.picked, SIZE) for s in schedules]
  _, reference = _run(one, Replay(schedules), 40)
  for devices in (2, 4):
    _, beta = _run(_program(devices)[1], Replay(schedules), 40)
    # 40 rounds of updates each within ~1e-6 relative (test above) of the one-device ones.
    np.testing.assert_allclose(beta, reference, rtol=1e-5, atol=1e-6)


def test_padded_rows_are_exact_and_unpadded_ones_refused():
  app, four = _program(4, 'diabetes')                          # 442 rows: 2 padding rows
  data = app.host_data(4)
  assert data['x'].shape == (444, 10) and not data['x'][442:].any() and not data['y'][442:].any()
  assert app.host_data(2)['x'].shape == (442, 10)
  schedules = [Cyclic(app.blocks, app.blocks).update({'round': t}, None)[0] for t in range(30)]
  losses4, beta4 = _run(four, Replay(schedules), 30)
  losses1, beta1 = _run(_program(1, 'diabetes')[1], Replay(schedules), 30)
  np.testing.assert_allclose(beta4, beta1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(losses4, losses1, rtol=1e-6)
  unpadded = make_app('lasso', data='diabetes')
  with pytest.raises(ConfigError, match="app 'lasso': 442 rows do not divide over 4 devices; "
                     'pad_rows=True pads them') as e:
    SchmpProgram(unpadded, 1, require_devices(4))
  assert '\n' not in str(e.value)


def test_diabetes_runs_with_every_scheduler():
  app, program = _program(4, 'diabetes')
  reference = app.reference_objective()
  losses, _ = _run(program, app.policy(program.schedule_size, seed=0), 300)
  assert losses[-1] == pytest.approx(reference, rel=1e-3)
  assert make_app('lasso', data='diabetes').default_schedule_size(4) == 10
  for scheduler, kind in (('shotgun', Shotgun), ('cyclic', Cyclic)):
    policy = make_app('lasso', scheduler=scheduler, data='diabetes').policy(10, seed=0)
    assert isinstance(policy, kind)
    losses, _ = _run(program, policy, 20)
    assert len(losses) == 2


def test_the_config_is_recorded_and_defaults_resolved():
  app = _app()
  assert app.config['scheduler'] == 'schmp' and app.config['data'] == 'synthetic'
  assert app.config['features'] == 64 and app.config['nonzeros'] == 16
  assert app.config['data_seed'] == 0 and app.config['lam'] == app.lam
  x, y = app.design.x.astype(np.float64), app.design.y.astype(np.float64)
  assert app.lam == pytest.approx(np.abs(x.T @ y).max() / 10)
  assert make_app('lasso', data='diabetes', lam=2.5).config == {
      'scheduler': 'schmp', 'lam': 2.5, 'data': 'diabetes', 'pad_rows': False, 'theta': 0.1,
      'warmup': 0, 'candidates': None, 'epsilon': 1e-4, 'priority': 'current', 'eta': 0.0}
  assert make_app('lasso', data='diabetes', priority='abs').config['warmup'] == 10


@pytest.mark.parametrize('kwargs, message', [
    ({'lam': 0}, "app 'lasso': lam must be > 0, got 0"),
    ({'lam': -1}, "app 'lasso': lam must be > 0, got -1"),
    ({'lam': float('nan')}, 'lam must be > 0, got nan'),
    ({'scheduler': 'nope'}, "unknown scheduler 'nope'; choose one of: schmp, shotgun, cyclic"),
    ({'data': 'nope'}, "unknown data 'nope'; choose one of: synthetic, diabetes"),
    ({'data': 'breast_cancer'}, "unknown data 'breast_cancer'"),
    ({'data': 'diabetes', 'rho': 0.5}, "data 'diabetes' is bundled: rho apply to"),
    ({'rho': 1.0}, r'rho must be in \[0, 1\), got 1.0'),
    ({'theta': 0}, r'theta must be in \(0, 1\], got 0'),
    ({'priority': 'max'}, "unknown priority 'max'; choose one of: abs, squared"),
    ({'epsilon': 0, 'priority': 'abs'}, 'epsilon must be > 0 with priority abs'),
    ({'alpha': 1}, "app 'lasso': got an unexpected keyword argument 'alpha'"),
])
def test_bad_arguments_are_one_line(kwargs, message):
  with pytest.raises(ConfigError, match=message) as e:
    make_app('lasso', **kwargs)
  assert '\n' not in str(e.value)
