"""SchMP CD-MF (CCD++ in SGD-MF's rotation): the rounds are a numpy CCD++ on one device or
four, the loss falls sweep by sweep, it reaches SGD-MF's loss on the same data, it reuses
SGD-MF's layout, bad input in one line."""

import itertools

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import Work
from hetjax.schmp import App, Schedule, SchmpProgram, make_app
from hetjax.schmp._cdmf import CoordinateMF
from hetjax.train import training_steps
from tests.conftest import at_default_xla, require_devices

SMALL = {'users': 200, 'items': 100, 'ratings': 3000}
_PROGRAMS = {}


def _program(devices, **kwargs):
  """One app and compiled program (staleness 0, the objective every round) per arguments."""
  key = (devices, tuple(sorted(kwargs.items())))
  if key not in _PROGRAMS:
    app = make_app('cdmf', devices=devices, **(SMALL | kwargs))
    _PROGRAMS[key] = app, SchmpProgram(app, devices, require_devices(devices), staleness=0)
  return _PROGRAMS[key]


def _sweeps(app, program, sweeps):
  """The loss and the factors (user and item order) after each sweep (P rounds)."""
  devices, done = program.mesh.size, []
  for info in training_steps(program, program.init_state(), sweeps * devices,
                             policy=app.policy(devices, 0)):
    if info.step % devices == 0:
      done.append((float(info.stats.loss), *app.factors(info.state.params)))
  return done


def _ccdpp(app, sweeps):
  """Numpy CCD++ (float64) from the app's starting factors: per rank t, ``inner`` times the
  closed-form update of W's column t then H's, on R̂ = R − Σ_{k≠t} w_k h_kᵀ; the factors after
  each update (a sweep)."""
  r = app.ratings
  u, i, v = r.user, r.item, r.value.astype(np.float64)
  w, h = (np.asarray(a, np.float64) for a in app.initial_factors())
  residual = v - np.einsum('nk,nk->n', w[u], h[i])
  done = []
  for sweep in range(0, sweeps, 2):
    t = sweep // (2 * app.inner) % app.rank
    if sweep % (2 * app.inner) == 0:
      rhat = residual + w[u, t] * h[i, t]
    w[:, t] = (np.bincount(u, rhat * h[i, t], r.users)
               / (app.lam + np.bincount(u, h[i, t] ** 2, r.users)))
    done.append((w.copy(), h.copy()))
    h[:, t] = (np.bincount(i, rhat * w[u, t], r.items)
               / (app.lam + np.bincount(i, w[u, t] ** 2, r.items)))
    done.append((w.copy(), h.copy()))
    residual = rhat - w[u, t] * h[i, t]
  return done[:sweeps]


@pytest.mark.parametrize('devices, inner', [(1, 1), (4, 1), (4, 2)])
def test_each_sweep_is_a_numpy_ccdpp_update_and_the_loss_falls(devices, inner):
  app, program = _program(devices, inner=inner)
  sweeps = 2 * inner * app.rank + 4                # every rank, then two ranks' switches again
  got, expected = _sweeps(app, program, sweeps), _ccdpp(app, sweeps)
  for (loss, w, h), (w64, h64) in zip(got, expected, strict=True):
    # float32 sums of a row's ratings (about 30 here, ≤ 200) against float64, carried through
    # the sweeps: the largest difference measured is 1.9e-6 (factors of order 1).
    np.testing.assert_allclose(w, w64, rtol=0, atol=1e-5)
    np.testing.assert_allclose(h, h64, rtol=0, atol=1e-5)
    assert loss == pytest.approx(app.loss(w64, h64), rel=1e-5)
  losses = [loss for loss, _, _ in got]
  # Each sweep minimises the loss exactly in one column of W or H: it never rises (to float32).
  assert all(b <= a * (1 + 1e-6) for a, b in itertools.pairwise(losses)), losses
  assert losses[-1] < 0.3 * losses[0]


def test_devices_change_nothing_but_float32_summation_order():
  app1, one = _program(1)
  app4, four = _program(4)
  a, b = _sweeps(app1, one, 20), _sweeps(app4, four, 20)
  for (loss1, w1, h1), (loss4, w4, h4) in zip(a, b, strict=True):
    np.testing.assert_allclose(w4, w1, rtol=0, atol=1e-5)
    np.testing.assert_allclose(h4, h1, rtol=0, atol=1e-5)
    assert loss4 == pytest.approx(loss1, rel=1e-5)


def test_it_reaches_sgd_mfs_loss_on_the_same_data():
  # The default data (1000 × 500, 20,000 ratings), rank 8, λ 0.05, one device. SGD-MF (lr 0.1)
  # is at 144.34 after 20 epochs (on 4 devices, whose epoch order differs: 145.0 after 20,
  # 136.1 after 40, 130.1 after 100); CD-MF at 4757, 556, 207, 144.37, 143.45 after 1, 4, 15,
  # 41, 42 outer iterations (16 sweeps each, a column of W or H a sweep) and 132.1 after 60. The two descend the same loss from the same start; a CCD++ sweep
  # is vectorised (segment sums), an SGD epoch a loop of one step per rating.
  sgd = make_app('mf', devices=1, metric='loss')
  program = SchmpProgram(sgd, 1, require_devices(1), staleness=1, objective_every=20,
                         last_round=19)
  *_, last = training_steps(program, program.init_state(), 20, policy=sgd.policy(1, 0))
  target = float(last.stats.loss)
  assert target == pytest.approx(144.34, rel=1e-4)
  app = make_app('cdmf', devices=1)
  assert app.layout.counts.tolist() == sgd.layout.counts.tolist()   # the same blocks
  cd = SchmpProgram(app, 1, require_devices(1), staleness=1, objective_every=16)
  losses = [float(i.stats.loss) for i in training_steps(cd, cd.init_state(), 42 * 16,
                                                        policy=app.policy(1, 0))
            if i.step % 16 == 0]
  assert losses[40] > target >= losses[41]


def test_the_layout_and_the_objective_are_sgd_mfs(request):
  """The same start as SGD-MF's to the bit, as XLA compiles a user's programs
  (`tests.conftest.at_default_xla`)."""
  if not at_default_xla(request):
    return
  app, program = _program(4)
  assert isinstance(app, CoordinateMF) and isinstance(app, App) and app.name == 'cdmf'
  sgd = make_app('mf', devices=4, **SMALL)
  for k, v in sgd.layout.data.items():
    np.testing.assert_array_equal(app.layout.data[k], v)
  assert app.config['inner'] == 1 and app.config['metric'] == 'loss' and 'lr' not in app.config
  state = program.init_state()
  w, h = app.factors(state.params)
  # The same start as SGD-MF's (both drawn inside their jitted init).
  start_w, start_h = sgd.factors(SchmpProgram(sgd, 4, require_devices(4)).init_state().params)
  np.testing.assert_array_equal(w, start_w)
  np.testing.assert_array_equal(h, start_h)
  assert float(program.objective(state)) == pytest.approx(sgd.loss(w, h), rel=1e-5)
  rmse = make_app('cdmf', devices=4, metric='rmse', **SMALL)
  error = rmse.ratings.value - np.einsum('nk,nk->n', w[rmse.ratings.user], h[rmse.ratings.item])
  got = SchmpProgram(rmse, 4, require_devices(4), staleness=0).objective(state)
  assert float(got) == pytest.approx(np.sqrt(np.mean(error ** 2)), rel=1e-5)


def test_a_schedule_out_of_step_with_the_rotation_changes_nothing():
  app, program = _program(4)
  state = program.init_state()
  before = app.factors(state.params)
  state, stats = program.step(state, Work(0, {}), Schedule.of(range(4), 4, offset=1))
  assert np.isnan(stats.local.delta).all()
  after = app.factors(state.params)
  np.testing.assert_array_equal(after[0], before[0])
  np.testing.assert_array_equal(after[1], before[1])
  assert int(state.params['turn']) == 0 and int(state.params['sweep']) == 0


def test_the_users_ratings_file_runs(tmp_path):
  app, _ = _program(4)
  r = app.ratings
  np.savez(tmp_path / 'ratings.npz', rows=r.user, cols=r.item, values=r.value,
           shape=np.array([r.users, r.items]))
  mine = make_app('cdmf', devices=4, data=str(tmp_path / 'ratings.npz'))
  assert mine.config['data'] == str(tmp_path / 'ratings.npz')
  program = SchmpProgram(mine, 4, require_devices(4), staleness=0)
  got = [float(i.stats.loss) for i in training_steps(program, program.init_state(), 8,
                                                     policy=mine.policy(4, 0))]
  expected = [loss for loss, _, _ in _sweeps(app, _program(4)[1], 2)]
  assert got[3] == pytest.approx(expected[0], rel=1e-6)
  assert got[7] == pytest.approx(expected[1], rel=1e-6)


@pytest.mark.parametrize('kwargs, message', [
    ({'scheduler': 'unscheduled'}, "app 'cdmf': unknown scheduler 'unscheduled'; choose schmp"),
    ({'inner': 0}, r'CD-MF needs inner >= 1 \(an integer\), got 0'),
    ({'rank': 0}, 'MF needs rank >= 1'),
    ({'lam': -0.1}, 'MF needs λ >= 0, got lam=-0.1'),
    ({'metric': 'mae'}, "unknown MF metric 'mae'; choose one of: rmse, loss"),
    ({'lr': 0.1}, "app 'cdmf': got an unexpected keyword argument 'lr'"),
    ({'devices': 4, 'users': 3}, 'MF: 3 users cannot be split into row blocks over 4 devices'),
])
def test_bad_arguments_are_one_line(kwargs, message):
  with pytest.raises(ConfigError, match=message) as e:
    make_app('cdmf', **(SMALL | kwargs))
  assert '\n' not in str(e.value)
