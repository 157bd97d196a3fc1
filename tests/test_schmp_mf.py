"""SchMP matrix factorisation: the rotation's rounds are the plain block updates, an epoch is a
single device's sequential SGD, the baseline averages H and reaches a target RMSE later, unequal
row shares, bad input in one line."""

import dataclasses
import doctest
import itertools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import ShareRules, Work
from hetjax.schmp import App, Schedule, SchmpProgram, _mf_layout, make_app
from hetjax.schmp._mf_sgd import sgd_pass
from hetjax.train import training_steps
from tests.conftest import require_devices

USERS, ITEMS, RATINGS = 200, 100, 3000
_PROGRAMS = {}


def _app(devices, scheduler='schmp', row_shares=None):
  return make_app('mf', scheduler=scheduler, devices=devices, users=USERS, items=ITEMS,
                  ratings=RATINGS, row_shares=row_shares)


def _program(devices, scheduler='schmp', row_shares=None):
  """One app and compiled program per (scheduler, devices, shares), shared by the tests."""
  key = (devices, scheduler, row_shares)
  if key not in _PROGRAMS:
    app = _app(devices, scheduler, row_shares)
    _PROGRAMS[key] = app, SchmpProgram(app, devices, require_devices(devices), staleness=0)
  return _PROGRAMS[key]


@dataclasses.dataclass(frozen=True)
class _Round:
  """What a round left, copied to the host before the next round donates its state."""

  offset: int
  loss: float
  w: np.ndarray     # W in user order
  h: np.ndarray     # H in item order
  held: np.ndarray  # the raw H parameter: each device's block(s), in device order
  turn: int


def _run(app, program, rounds):
  """``(start factors, a _Round per round)`` of ``rounds`` rounds from the initial state."""
  devices = program.mesh.size
  state = program.init_state()
  start = app.factors(state.params)
  done = []
  for info in training_steps(program, state, rounds, policy=app.policy(devices, 0)):
    params = info.state.params
    done.append(_Round(info.decision.offset, float(info.stats.loss),
                       *app.factors(params), np.asarray(params['h']),
                       int(params.get('turn', 0))))
  return start, done


def _rotation_blocks(app, devices):
  """blocks[s][p]: the rating ids of block (p, (p + s) mod P), in the epoch order."""
  layout, order, r = app.layout, app.order(), app.ratings
  row = np.searchsorted(layout.row_starts, r.user[order], side='right') - 1
  col = np.searchsorted(layout.col_starts, r.item[order], side='right') - 1
  return [[order[(row == p) & (col == (p + s) % devices)] for p in range(devices)]
          for s in range(devices)]


def _numpy_sgd(app, w, h, ids):
  """Plain numpy float32 SGD over the ratings ``ids`` in order (the `_mf_sgd` update)."""
  r, w, h = app.ratings, w.copy(), h.copy()
  per_user, per_item = np.bincount(r.user, minlength=USERS), np.bincount(r.item, minlength=ITEMS)
  lr, lam = np.float32(app.lr), np.float32(app.lam)
  for k in ids:
    u, i = r.user[k], r.item[k]
    wu, hi = w[u].copy(), h[i].copy()
    e = r.value[k] - np.dot(wu, hi)
    w[u] += lr * (e * hi - lam * np.float32(1 / per_user[u]) * wu)
    h[i] += lr * (e * wu - lam * np.float32(1 / per_item[i]) * hi)
  return w, h


def _sequential(app, w, h, ids, epochs):
  """One device's SGD (`sgd_pass`, jitted alone) over ``ids`` in order, ``epochs`` times."""
  r = app.ratings
  per_user, per_item = np.bincount(r.user, minlength=USERS), np.bincount(r.item, minlength=ITEMS)
  ratings = {'user': r.user[ids], 'item': r.item[ids], 'value': r.value[ids],
             'user_reg': (1 / per_user[r.user[ids]]).astype(np.float32),
             'item_reg': (1 / per_item[r.item[ids]]).astype(np.float32)}
  epoch = jax.jit(lambda w, h, ratings: sgd_pass(w, h, ratings, len(ids), app.lr, app.lam))
  w, h = jnp.asarray(w), jnp.asarray(h)
  for _ in range(epochs):
    w, h = epoch(w, h, ratings)
  return np.asarray(w), np.asarray(h)


def _rmse(app, w, h):
  """The training RMSE of global ``(W, H)`` in float64."""
  r, w, h = app.ratings, np.asarray(w, np.float64), np.asarray(h, np.float64)
  return float(np.sqrt(np.mean((r.value - np.einsum('nk,nk->n', w[r.user], h[r.item])) ** 2)))


@pytest.mark.parametrize('devices', [1, 2, 4])
def test_each_round_is_the_numpy_block_updates_and_h_rotates_home(devices):
  app, program = _program(devices)
  (w, h), infos = _run(app, program, devices)
  blocks = _rotation_blocks(app, devices)
  layout = app.layout
  # The rotation: in each round the P devices hold P different column blocks, and over P
  # rounds every (row block, column block) pair comes up exactly once.
  pairs = [(p, (p + info.offset) % devices) for info in infos for p in range(devices)]
  for s in range(devices):
    assert sorted(c for _, c in pairs[s * devices:(s + 1) * devices]) == list(range(devices))
  assert sorted(pairs) == [(p, c) for p in range(devices) for c in range(devices)]
  assert sum(len(b) for s in blocks for b in s) == RATINGS
  for s, info in enumerate(infos):
    # Round s is plain SGD over blocks (p, p + s) — disjoint users and items, so in any order.
    # XLA's float32 (fused multiply-adds, its dot's summation order) and numpy's differ by an
    # ulp or so per step; the factors are below 1 (an ulp is 6e-8 at 0.5) and the largest
    # difference over these rounds is 1.2e-7, so 1e-6 bounds it with room for other CPUs.
    w, h = _numpy_sgd(app, w, h, np.concatenate(blocks[s]))
    np.testing.assert_allclose(info.w, w, atol=1e-6, rtol=0)
    np.testing.assert_allclose(info.h, h, atol=1e-6, rtol=0)
    # After round s device q holds H block (q + s + 1) mod P: the ring moved it one device on.
    held = info.held.reshape(devices, layout.col_pad, -1)
    for q in range(devices):
      j = (q + s + 1) % devices
      lo, n = layout.col_starts[j], layout.col_counts[j]
      np.testing.assert_array_equal(held[q, :n], info.h[lo:lo + n])
    assert info.turn == (s + 1) % devices
    # The objective finds each rating's H row wherever its block is now.
    assert info.loss == pytest.approx(_rmse(app, info.w, info.h), rel=1e-6)
  # After P rounds every H block is home: device j holds block j.
  assert infos[-1].turn == 0


def test_rmse_falls_and_equals_one_device_sequential_sgd_exactly():
  app, program = _program(4)
  epochs = 4
  start, infos = _run(app, program, 4 * epochs)
  rmse = [i.loss for i in infos[3::4]]
  assert all(a > b for a, b in itertools.pairwise(rmse)), rmse
  order = np.concatenate([b for s in _rotation_blocks(app, 4) for b in s])
  w, h = _sequential(app, *start, order, epochs)
  # The same float32 operations in the same order: the factors are bit-identical.
  np.testing.assert_array_equal(infos[-1].w, w)
  np.testing.assert_array_equal(infos[-1].h, h)
  assert rmse[-1] == pytest.approx(_rmse(app, w, h), rel=1e-5)
  assert rmse[-1] < 0.6 * rmse[0]
  # It descends the regularised loss it documents, epoch by epoch.
  losses = [app.loss(i.w, i.h) for i in infos[3::4]]
  assert all(a > b for a, b in itertools.pairwise(losses)), losses


def test_a_round_compiles_once():
  app = _app(2)
  assert isinstance(app, App) and app.blocks == 2 and app.config['devices'] == 2
  program = SchmpProgram(app, 2, require_devices(2), staleness=0)
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger('jax')
  logger.addHandler(handler)
  try:
    with jax.log_compiles():
      _run(app, program, 6)
  finally:
    logger.removeHandler(handler)
  compiles = [r for r in records if r.getMessage().startswith('Compiling jit(round_)')]
  assert len(compiles) == 1


def test_a_schedule_out_of_step_with_the_rotation_changes_nothing():
  app, program = _program(2)
  state = program.init_state()
  before = app.factors(state.params)
  state, stats = program.step(state, Work(0, {}), Schedule.of([0, 1], 2, offset=1))
  assert np.isnan(stats.local.delta).all()
  after = app.factors(state.params)
  np.testing.assert_array_equal(after[0], before[0])
  np.testing.assert_array_equal(after[1], before[1])
  assert int(state.params['turn']) == 0


def test_the_unscheduled_baseline_averages_h_and_logs_its_objective():
  app, program = _program(2, 'unscheduled')
  layout = app.layout
  (w, h), infos = _run(app, program, 4)
  # Round 0: each device runs SGD over its first chunk (every column) from the same H; the
  # copies of H are then averaged.
  first_w, first_h = infos[0].w, infos[0].h
  r, order = app.ratings, app.order()
  row = np.searchsorted(layout.row_starts, r.user[order], side='right') - 1
  copies = []
  for p in range(2):
    mine = order[row == p]
    chunk = mine[:layout.counts[p, 0]]
    assert len(mine) == layout.counts[p].sum()
    wp, hp = _sequential(app, w, h, chunk, 1)
    users = slice(layout.row_starts[p], layout.row_starts[p] + layout.row_counts[p])
    np.testing.assert_array_equal(first_w[users], wp[users])
    copies.append(hp)
  # A psum of two copies halved is their exact mean: a + b = b + a, and / 2 is exact.
  np.testing.assert_array_equal(first_h, (copies[0] + copies[1]) / 2)
  for info in infos:
    assert info.loss == pytest.approx(_rmse(app, info.w, info.h), rel=1e-6)
  assert infos[-1].loss < infos[1].loss


def test_the_rotation_reaches_a_target_rmse_in_fewer_rounds_than_the_baseline():
  # The default data (1000 x 500, 20,000 ratings) and step size (lr 0.1) on 4 devices, four
  # rounds an epoch for both. Measured over 20 epochs: the rotation reaches RMSE 0.5, 0.3, 0.2,
  # 0.15, 0.12, 0.11 in rounds 7, 11, 15, 21, 29, 36, the baseline in 13, 21, 30, 41, 56, 65, and
  # 0.1 only the rotation (round 47): averaging divides an item's step by up to P. Here 8 epochs.
  curves = {}
  for scheduler in ('schmp', 'unscheduled'):
    app = make_app('mf', scheduler=scheduler, devices=4)
    program = SchmpProgram(app, 4, require_devices(4), staleness=0)
    curves[scheduler] = np.array([float(i.stats.loss) for i in training_steps(
        program, program.init_state(), 32, policy=app.policy(4, 0))])
  rotation, baseline = curves['schmp'], curves['unscheduled']
  assert (rotation <= baseline).all()  # round for round, so epoch for epoch
  first = {k: int(np.argmax(c <= 0.2)) + 1 for k, c in curves.items()}
  assert first == {'schmp': 15, 'unscheduled': 30}


def test_unequal_row_shares_follow_speeds_and_are_the_same_sgd():
  speeds = [1.0, 1.0, 2.0, 4.0]
  shares = ShareRules(global_batch=USERS, workers=4).from_weights(speeds).values
  assert shares == (25, 25, 50, 100)
  app, program = _program(4, row_shares=shares)
  layout = app.layout
  assert layout.row_counts.tolist() == list(shares) and layout.row_pad == 100
  # Each device's work: the ratings of its users, once an epoch, P equal-shaped slots.
  work = app.round_ratings().sum(0)
  block = np.searchsorted(layout.row_starts, app.ratings.user, side='right') - 1
  np.testing.assert_array_equal(work, np.bincount(block, minlength=4))
  # The work follows the shares: the generator scatters the hot users over the ids, so a row
  # block's fraction of the ratings is about its fraction of the users (here within 20 %; the
  # data is fixed by its seed), and the device 4x as fast does 4x the slowest's work.
  fraction = work / RATINGS
  np.testing.assert_allclose(fraction, np.asarray(shares) / USERS, rtol=0.2)
  assert work[3] > 3 * work[:2].max()
  # Round by round too: a round lasts as long as its slowest device (ratings / speed), at most
  # 1.20x the devices' mean in every round here, from ~190 ratings a block; the column blocks
  # are cut to equal ratings (within 5 %), not equal items (25, 28, 20, 27 of them).
  per_speed = app.round_ratings() / np.asarray(speeds)
  assert (per_speed.max(1) < 1.25 * per_speed.mean(1)).all()
  by_column = layout.counts.sum(0)
  assert by_column.max() < 1.05 * by_column.min()
  assert layout.col_counts.tolist() == [25, 28, 20, 27]
  # Equal shares given explicitly lay out exactly as the default.
  equal, default = _app(4, row_shares=(50,) * 4).layout, _app(4).layout
  for k, v in default.data.items():
    np.testing.assert_array_equal(equal.data[k], v)
  # Training on the unequal blocks is one device's SGD over their epoch order, bit for bit.
  start, infos = _run(app, program, 8)
  order = np.concatenate([b for s in _rotation_blocks(app, 4) for b in s])
  w, h = _sequential(app, *start, order, 2)
  np.testing.assert_array_equal(infos[-1].w, w)
  np.testing.assert_array_equal(infos[-1].h, h)
  assert infos[-1].loss < infos[3].loss


@pytest.mark.parametrize('kwargs, message', [
    ({'rank': 0}, 'MF needs rank >= 1'),
    ({'lam': -0.1}, 'MF needs λ >= 0, got lam=-0.1'),
    ({'lr': 0.0}, 'MF needs lr > 0'),
    ({'scheduler': 'dsgd'}, "unknown MF scheduler 'dsgd'; choose one of: schmp, unscheduled"),
    ({'row_shares': (100, 99)}, r'row shares \(100, 99\) must be positive and sum to the 200'),
    ({'row_shares': (200, 0)}, 'must be positive'),
    ({'row_shares': (100, 100), 'devices': 3}, 'MF: 2 row shares for 3 devices'),
    ({'users': 0}, r'MF needs users >= 1 \(an integer\), got 0'),
    ({'rank': 2.0}, r'MF needs rank >= 1 \(an integer\), got 2.0'),
    ({'row_shares': (100, 99.5)}, r'row shares \(100, 99.5\) must be integers, one per device'),
    ({'noise': -1.0}, 'zipf_ratings needs noise >= 0'),
])
def test_bad_arguments_are_one_line(kwargs, message):
  args = {'users': USERS, 'items': ITEMS, 'ratings': RATINGS} | kwargs
  with pytest.raises(ConfigError, match=message) as e:
    make_app('mf', **args)
  assert '\n' not in str(e.value)


def test_the_layout_docstring_examples_run():
  assert doctest.testmod(_mf_layout, extraglobs={'np': np}).failed == 0


def test_data_or_devices_that_do_not_fit_are_one_line():
  with pytest.raises(ConfigError, match='MF: 3 users cannot be split into row blocks over 4 '
                     'devices') as e:
    make_app('mf', devices=4, users=3, items=50, ratings=100)
  assert '\n' not in str(e.value)
  unequal = _app(None, row_shares=(150, 50))
  assert unequal.devices == 2
  with pytest.raises(ConfigError, match=r'app mf was made for 2 devices .* the job has 4; pass '
                     'devices=4') as e:
    SchmpProgram(unequal, 2, require_devices(4))
  assert '\n' not in str(e.value)
  with pytest.raises(ConfigError, match="rounds have 2 slots, one per device's block; got a "
                     'schedule size of 4'):
    unequal.policy(4, 0)


def test_round_work_is_each_devices_ratings_in_the_round():
  """What a host of known speed is timed by: over the P rounds of an epoch each device updates
  each of its ratings once; a device given more users has more ratings a round."""
  app = _app(devices=4, row_shares=(80, 40, 40, 40))
  work = np.array([app.round_work(s) for s in range(4)])
  np.testing.assert_array_equal(work, app.round_ratings())
  per_device = np.bincount(np.searchsorted(app.layout.row_starts, app.ratings.user,
                                           side='right') - 1, minlength=4)
  np.testing.assert_array_equal(work.sum(0), per_device)
  assert work.sum() == app.ratings.count and per_device[0] > per_device[1:].max()
  np.testing.assert_array_equal(app.round_work(5), work[1])
