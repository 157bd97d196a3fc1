"""Speed predictors on synthetic series: exactness, smoothing, AR recovery, NARX learning."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.balance._narx import NARX
from hetjax.balance._predictors import AR, EWMA, LastValue, SpeedPredictor, clip_to_recent
from hetjax.core import decode_state, encode_state

PREDICTORS = {'last': LastValue, 'ewma': EWMA, 'ar': AR, 'narx': NARX}


def _errors(predictor, speeds: np.ndarray, load: np.ndarray | None = None,
            skip: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Predictions made after each step and their errors against the next step's speeds."""
  preds, state = [], predictor.init(speeds.shape[1])
  for t in range(len(speeds) - 1):
    state = predictor.update(state, speeds[t], None if load is None else load[t])
    preds.append(predictor.predict(state))
  preds = np.array(preds)
  return preds, (preds - speeds[1:])[skip:]


def _feed(predictor, state, values):
  """``state`` after one update per row of ``values`` (no load)."""
  for v in values:
    state = predictor.update(state, np.atleast_1d(np.asarray(v, dtype=np.float64)), None)
  return state


@pytest.mark.parametrize('name', list(PREDICTORS))
def test_constant_series_is_predicted_exactly(name):
  p = PREDICTORS[name]()
  assert isinstance(p, SpeedPredictor) and p.name == name
  speeds = np.tile([1000.0, 400.0, 123.25], (40, 1))
  preds, _ = _errors(p, speeds, load=np.ones_like(speeds))
  np.testing.assert_allclose(preds, speeds[1:], rtol=1e-12)


@pytest.mark.parametrize('name', list(PREDICTORS))
def test_predict_before_update_and_wrong_width_are_config_errors(name):
  p = PREDICTORS[name]()
  state = p.init(3)
  with pytest.raises(ConfigError):
    p.predict(state)
  state = p.update(state, np.ones(3), None)
  with pytest.raises(ConfigError):
    p.update(state, np.ones(4), None)
  with pytest.raises(ConfigError):
    p.update(p.init(3), np.ones(4), None)  # the width is the state's from init on
  with pytest.raises(ConfigError):
    p.init(0)


def test_ewma_smooths_jitter_and_restarts_on_a_level_shift():
  rng = np.random.default_rng(0)
  true = np.full((400, 4), 100.0)
  noisy = true * (1 + rng.uniform(-0.1, 0.1, true.shape))
  _, last_err = _errors(LastValue(), noisy, skip=10)
  _, ewma_err = _errors(EWMA(alpha=0.5), noisy, skip=10)
  last_mse = np.mean((last_err + noisy[11:] - true[11:]) ** 2)  # error against the true level
  ewma_mse = np.mean((ewma_err + noisy[11:] - true[11:]) ** 2)
  assert ewma_mse < 0.5 * last_mse  # α = 0.5 keeps a third of the noise variance
  p = EWMA(alpha=0.5)
  state = _feed(p, p.init(1), (100.0, 100.0, 300.0))  # a 3x speed-up is a new regime, not noise
  assert p.predict(state)[0] == 300.0
  smoothed = EWMA(alpha=0.5, reset=None)
  assert smoothed.predict(_feed(smoothed, smoothed.init(1), (100.0, 100.0, 300.0)))[0] == 200.0


def test_ar_recovers_an_ar1_process_better_than_last_value():
  rng = np.random.default_rng(1)
  phi, steps, workers = 0.3, 600, 4
  v = np.ones((steps, workers))
  for t in range(1, steps):
    v[t] = 1 + phi * (v[t - 1] - 1) + 0.05 * rng.standard_normal(workers)
  _, last_err = _errors(LastValue(), v, skip=50)
  _, ar_err = _errors(AR(p=2, window=32), v, skip=50)
  last_mse, ar_mse = np.mean(last_err**2), np.mean(ar_err**2)
  print(f'AR(1) phi={phi}: MSE last value {last_mse:.5f}, AR(2) {ar_mse:.5f}')
  assert ar_mse < 0.85 * last_mse
  assert ar_mse < 1.25 * 0.05**2  # close to the innovation variance, the best possible


def test_ar_falls_back_to_last_value_until_it_has_data_and_after_a_shift():
  p = AR(p=2, window=32)
  state = p.init(1)
  for v in (1.0, 1.1, 0.95):
    state = _feed(p, state, [v])
    assert p.predict(state)[0] == v
  state = _feed(p, state, (1.0, 1.05) * 10 + (3.0,))  # a 3x jump restarts the fit
  assert p.predict(state)[0] == 3.0


def test_clip_to_recent_bounds_extrapolation():
  recent = np.array([[1.0, 10.0], [2.0, 10.0]])
  out = clip_to_recent(np.array([100.0, np.nan]), recent)
  np.testing.assert_array_equal(out, [10.0, 10.0])  # 5 × max 2; NaN → last value


def _spells(steps: int, workers: int, seed: int) -> np.ndarray:
  """Slowdown factors: slow (3x) spells of exactly 3 steps, fast spells of random length.

  Markov-ish, but the slow→fast switch is predictable from the last few steps, which last
  value cannot use and a recurrent model can.
  """
  rng = np.random.default_rng(seed)
  factors = np.ones((steps, workers))
  for w in range(workers):
    t = int(rng.integers(0, 5))
    while t < steps:
      factors[t:t + 3, w] = 3.0
      t += 4 + int(rng.geometric(0.25))
  return factors


def test_narx_learns_a_spell_pattern_and_is_deterministic():
  factors = _spells(400, 4, seed=0)
  speeds = 1000.0 / factors
  _, last_err = _errors(LastValue(), np.log(speeds))  # log-space errors: the log of the ratio
  last_msle = np.mean(last_err[100:] ** 2)
  runs = []
  for _ in range(2):
    preds, _ = _errors(NARX(), speeds, load=factors)
    runs.append(preds)
  np.testing.assert_array_equal(runs[0], runs[1])
  narx_msle = np.mean(np.log(runs[0][100:] / speeds[101:]) ** 2)
  print(f'spells: MSLE last value {last_msle:.4f}, NARX {narx_msle:.4f}')
  assert narx_msle <= 0.8 * last_msle


def test_narx_without_load_is_last_value_until_window_plus_two_points():
  p = NARX(window=4)
  speeds = np.array([[1.0, 2.0], [1.5, 2.0], [1.0, 2.5], [2.0, 2.0], [1.0, 1.0]])
  state = p.init(2)
  for v in speeds:
    state = p.update(state, v, None)
    np.testing.assert_array_equal(p.predict(state), v)
  state = p.update(state, np.array([1.0, 1.0]), None)
  assert np.all(np.isfinite(p.predict(state))) and np.all(p.predict(state) > 0)


def _leaf_shapes(state) -> list[tuple[tuple[int, ...], str]]:
  return [(np.shape(x), np.asarray(x).dtype.str) for x in jax.tree.leaves(state)]


@pytest.mark.parametrize('name', list(PREDICTORS))
def test_state_is_a_fixed_shape_value_that_survives_json(name):
  # NARX with a short window, so that the resume happens after its training has started.
  p = NARX(window=4, examples=8) if name == 'narx' else PREDICTORS[name]()
  factors = _spells(40, 3, seed=1)
  speeds, load = 1000.0 / factors, factors
  fresh = p.init(3)
  state, states, preds = fresh, [], []
  for t in range(40):
    state = p.update(state, speeds[t], load[t])
    states.append(state)
    preds.append(p.predict(state))
  for s in states:  # the structure, shapes and dtypes are init's from the first step on
    assert jax.tree.structure(s) == jax.tree.structure(fresh)
    assert _leaf_shapes(s) == _leaf_shapes(fresh)
  for saved_at in (0, 3, 20):
    state = decode_state(p.init(3), json.loads(json.dumps(encode_state(states[saved_at]))))
    for t in range(saved_at + 1, 40):  # the resumed predictor predicts exactly the same
      state = p.update(state, speeds[t], load[t])
      np.testing.assert_array_equal(p.predict(state), preds[t])


@pytest.mark.parametrize('name', list(PREDICTORS))
def test_update_leaves_its_input_state_alone(name):
  p = PREDICTORS[name]()
  state = _feed(p, p.init(2), [(1.0, 2.0), (1.5, 2.5), (3.0, 2.0)])
  before = encode_state(state)
  p.update(state, np.array([9.0, 9.0]), np.array([2.0, 2.0]))
  assert encode_state(state) == before
