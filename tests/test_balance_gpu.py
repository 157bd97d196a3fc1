"""LB-BSP's GPU mode: time curves, their fit, water-filling under memory caps, and the policy."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.balance._gpu import LBBSPGpu, TimeModel, finish_time_shares, fit_time_model
from hetjax.balance._policy import BalancePolicy
from hetjax.balance._simple import Uniform
from hetjax.core import ShareRules, Shares, StepStats, decode_state, encode_state
from hetjax.emulation import StaticTrace, StepChangeTrace
from hetjax.simulation._shares import ClockCosts, simulate_shares

GPU_LIKE = ClockCosts(per_sample_s=1e-3, fixed_s=0.05)  # a large fixed cost: flat-ish at small x
RULES = ShareRules(global_batch=4096, workers=4, bucket=64)


def _fraction_of_ideal(run):
  """(uniform iter / policy iter) / (uniform iter / balanced limit), per step."""
  return run.balanced_limit_s / run.iter_s


def _stats(step: int, shares, t: np.ndarray) -> StepStats:
  return StepStats(step, rows=tuple(int(x) for x in shares), compute_s=tuple(t.tolist()),
                   iter_s=float(t.max()))


def _drive(policy, true: TimeModel, steps: int):
  """A BSP loop whose workers take exactly ``true.time(share)``: shares and times per step."""
  history, shares = [], []
  s, state = policy.update(policy.init(), None)
  for step in range(steps):
    t = true.time(np.array(s.values, dtype=np.float64))
    history.append(_stats(step, s.values, t))
    shares.append(s.values)
    s, state = policy.update(state, history[-1])
  return np.array(shares), np.array([h.iter_s for h in history])


class _Alternating:
  """Worker 3 is 3x slow on even steps only: whatever the last step showed is wrong next step."""

  workers = 4

  def factors(self, step: int) -> np.ndarray:
    return np.array([1.0, 1.0, 1.0, 3.0 if step % 2 == 0 else 1.0])

  def factor(self, worker: int, step: int) -> float:
    return float(self.factors(step)[worker])

  def delays(self, step: int) -> np.ndarray:
    return np.zeros(self.workers)

  def delay(self, worker: int, step: int) -> float:
    return 0.0

  def describe(self) -> str:
    return 'alternating'


def test_time_model_time_and_inverse_round_trip():
  m = TimeModel(floor_s=0.1, intercept_s=0.02, slope_s=1e-3)
  x = np.array([80.0, 100.0, 333.0, 4096.0])  # the knee is at 80
  np.testing.assert_allclose(m.inverse(m.time(x)), x, rtol=1e-12)
  assert m.time(10) == pytest.approx(0.1) and m.inverse(0.1) == pytest.approx(80)  # floor: free
  assert m.inverse(0.05) == 0.0  # nothing is done faster than the floor
  assert TimeModel(0.2, 0.1, 0.0).inverse(0.2) == np.inf  # a flat curve takes any share
  assert TimeModel(0.2, 0.1, 0.0).inverse(0.15) == 0.0
  arrays = TimeModel(np.array([0.0, 0.5]), np.array([0.0, 0.1]), np.array([1e-3, 2e-3]))
  np.testing.assert_allclose(arrays.inverse(0.5), [500.0, 200.0])


def test_fit_recovers_floor_and_line_from_noiseless_points():
  x = np.array([16.0, 32, 64, 128, 256, 512])
  floored = fit_time_model(x, np.maximum(0.1, 0.02 + 1e-3 * x))
  assert (floored.floor_s, floored.intercept_s, floored.slope_s) == pytest.approx((0.1, 0.02, 1e-3))
  line = fit_time_model(x, 0.05 + 1e-3 * x)  # no floor in the data: none is invented
  assert (line.floor_s, line.intercept_s, line.slope_s) == pytest.approx((0.0, 0.05, 1e-3))


def test_fit_recovers_floor_and_line_from_noisy_points():
  rng = np.random.default_rng(0)
  x = np.repeat([32.0, 64, 128, 256, 384, 512], 3)
  t = np.maximum(0.1, 0.02 + 1e-3 * x) * (1 + 0.02 * rng.standard_normal(x.size))
  m = fit_time_model(x, t)
  assert m.floor_s == pytest.approx(0.1, rel=0.03)
  assert m.slope_s == pytest.approx(1e-3, rel=0.05)
  assert m.intercept_s == pytest.approx(0.02, abs=0.01)


def test_fit_with_one_share_is_a_line_through_the_origin_and_skips_bad_times():
  m = fit_time_model([100, 100, 200, 300], [0.5, 0.5, np.nan, -1.0])
  assert (m.floor_s, m.intercept_s, m.slope_s) == pytest.approx((0.0, 0.0, 0.005))
  with pytest.raises(ConfigError, match='no usable'):
    fit_time_model([100, 200], [0.0, np.inf])
  with pytest.raises(ConfigError, match='2 shares but 1 times'):
    fit_time_model([100, 200], [0.1])


def test_water_filling_holds_a_capped_worker_at_its_cap_and_splits_the_rest():
  models = [TimeModel(slope_s=1e-3)] * 3 + [TimeModel(intercept_s=0.05, slope_s=3e-3)]
  t, x = finish_time_shares(models, 4096, [64] * 4, [1024, 4096, 4096, 4096])
  assert x[0] == 1024 and x.sum() == pytest.approx(4096)
  assert x[1] == pytest.approx(x[2])
  times = [m.time(v) for m, v in zip(models, x, strict=True)]
  assert times[1:] == pytest.approx([t] * 3) and times[0] < t
  with pytest.raises(ConfigError, match='bounds hold'):
    finish_time_shares(models, 4096, [64] * 4, [1000] * 4)


def test_water_filling_at_a_floor_edge_still_covers_the_batch():
  fast = TimeModel(floor_s=0.4, intercept_s=0.02, slope_s=0.5e-3)  # free up to 760 rows
  t, x = finish_time_shares([fast] * 3 + [TimeModel(0.1, 0.01, 2e-3)], 2048, [0] * 4, [1e9] * 4)
  assert t == pytest.approx(0.4) and x.sum() == pytest.approx(2048)
  assert x[3] == pytest.approx(195) and x[:3] == pytest.approx([617.667] * 3, rel=1e-4)


def test_memory_caps_that_cannot_hold_the_batch_are_refused():
  with pytest.raises(ConfigError, match='memory caps'):
    ShareRules(global_batch=4096, workers=4, bucket=64, maximum=(1024, 1024, 1024, 960))


def test_policy_is_a_balance_policy_and_validates_its_knobs():
  policy = LBBSPGpu(RULES)
  assert isinstance(policy, BalancePolicy) and policy.name == 'lbbsp-gpu'
  assert policy.update(policy.init(), None)[0].values == (1024,) * 4
  for bad in ({'window': 1}, {'step_fraction': 0}, {'dead_band_buckets': -1}, {'probe': -1},
              {'change_tolerance': 0}):
    with pytest.raises(ConfigError):
      LBBSPGpu(RULES, **bad)


def test_gpu_like_cluster_reaches_95_percent_of_ideal_within_8_steps_and_holds():
  trace = StaticTrace((1, 1, 1, 3))
  run = simulate_shares(LBBSPGpu(RULES), trace, GPU_LIKE, 4096, steps=30)
  uniform = simulate_shares(Uniform(ShareRules(4096, 4)), trace, GPU_LIKE, 4096, steps=1)
  assert uniform.iter_s[0] / run.balanced_limit_s[0] == pytest.approx(2.5, rel=1e-3)
  frac = _fraction_of_ideal(run)
  first = int(np.argmax(frac >= 0.95))
  assert frac[first] >= 0.95 and first <= 8 and (frac[first:] >= 0.95).all()
  assert np.abs(np.diff(run.shares[first:], axis=0)).max() <= 64  # no oscillation
  assert run.shares[-1].tolist() == [1280, 1216, 1216, 384]
  assert frac[-1] == pytest.approx(0.969, abs=1e-3)  # the best whole-bucket split


def test_memory_caps_are_respected_and_the_capped_optimum_is_found():
  caps = (1152, 1152, 1152, 4096)
  rules = ShareRules(4096, 4, bucket=64, maximum=caps)
  run = simulate_shares(LBBSPGpu(rules), StaticTrace((1, 1, 1, 3)), GPU_LIKE, 4096, steps=20)
  assert (run.shares <= np.array(caps)).all()
  assert run.shares[-1].tolist() == [1152, 1152, 1152, 640]


def test_halving_on_reversal_damps_a_forced_oscillation():
  runs = {h: simulate_shares(LBBSPGpu(RULES, halve_on_reversal=h), _Alternating(), GPU_LIKE, 4096, 40)
          for h in (True, False)}
  swing = {h: np.abs(np.diff(r.shares[20:, 3])).max() for h, r in runs.items()}
  assert swing[False] >= 3 * 64  # chasing a lagged signal: a lasting 3-bucket swing
  assert swing[True] == 0  # halved steps settle on one share
  assert runs[True].mean_iter_s(skip=20) < 0.95 * runs[False].mean_iter_s(skip=20)


def test_floor_curves_converge_to_the_optimum():
  true = TimeModel(np.array([0.4, 0.4, 0.4, 0.1]), np.array([0.02, 0.02, 0.02, 0.01]),
                   np.array([0.5e-3, 0.5e-3, 0.5e-3, 2e-3]))  # fast GPUs flat up to 760 rows
  rules = ShareRules(2048, 4, bucket=32)
  best, _ = finish_time_shares(true, 2048, rules.lower, rules.upper)
  shares, iters = _drive(LBBSPGpu(rules), true, steps=12)
  assert iters[0] / best > 2.5  # uniform: the slow worker is on its line
  assert (iters[3:] <= best * 1.001).all()
  assert (shares[3:] == shares[-1]).all()


def test_noisy_times_keep_the_best_split_without_jitter():
  true = TimeModel(0.0, np.array([0.05] * 3 + [0.15]), np.array([1e-3] * 3 + [3e-3]))
  rng, policy = np.random.default_rng(1), LBBSPGpu(RULES)
  decided, state = policy.update(policy.init(), None)
  shares = []
  for step in range(60):  # 5% timing noise; ideal is 4096 rows / Σ speeds = 1.2888 s
    s = np.array(decided.values)
    t = true.time(s) * (1 + 0.05 * rng.standard_normal(4))
    decided, state = policy.update(state, _stats(step, s, t))
    shares.append(s)
  noiseless = np.array([true.time(s).max() for s in shares])
  assert (1.2888 / noiseless[5:]).mean() >= 0.95
  assert np.abs(np.diff(shares[5:], axis=0)).max() <= 64


def test_probe_gives_homogeneous_workers_a_second_share_then_returns():
  policy = LBBSPGpu(RULES)
  run = simulate_shares(policy, StaticTrace((1, 1, 1, 1)), GPU_LIKE, 4096, steps=6)
  assert run.shares[1].tolist() == [1088, 960, 1088, 960]
  assert (run.shares[2:] == 1024).all()
  # The fixed cost is learned.
  np.testing.assert_allclose(run.policy_state.model.intercept_s, 0.05, rtol=1e-9)


def test_a_slowdown_mid_run_is_followed_within_a_few_steps():
  run = simulate_shares(LBBSPGpu(RULES), StepChangeTrace(10, (1, 1, 1, 1), (1, 1, 1, 3)), GPU_LIKE, 4096,
                 steps=20)
  frac = _fraction_of_ideal(run)
  assert (frac[2:10] == 1).all() and frac[10] < 0.5
  assert (frac[13:] >= 0.95).all()


def test_a_reused_policy_starts_over_at_step_0():
  policy = LBBSPGpu(RULES)
  a = simulate_shares(policy, StaticTrace((1, 1, 1, 3)), GPU_LIKE, 4096, steps=5).shares
  b = simulate_shares(policy, StaticTrace((1, 1, 1, 3)), GPU_LIKE, 4096, steps=5).shares
  np.testing.assert_array_equal(a, b)
  shares, _ = policy.update(policy.init(), _stats(0, (1024,) * 4, np.ones(4)))
  assert isinstance(shares, Shares)


def test_1024_workers_for_50_steps_take_under_3_seconds():
  n = 1024
  rules = ShareRules(n * 256, n, bucket=16)
  trace = StaticTrace(tuple(np.random.default_rng(0).uniform(1, 3, n)))
  # A guard against a blow-up in scale, in CPU seconds of this process (not wall time: a
  # loaded machine must not fail it).
  start = time.process_time()
  run = simulate_shares(LBBSPGpu(rules), trace, GPU_LIKE, n * 256, steps=50)
  assert time.process_time() - start < 3.0
  assert (_fraction_of_ideal(run)[3:] >= 0.95).all()
  assert (np.diff(run.shares[10:], axis=0) == 0).all()


def test_the_state_holds_the_fitted_curves_and_resumes_exactly():
  trace = StepChangeTrace(6, (1, 1, 1, 1), (1, 1, 1, 3))
  policy = LBBSPGpu(RULES)
  full = simulate_shares(policy, trace, GPU_LIKE, 4096, steps=12)
  first = simulate_shares(policy, trace, GPU_LIKE, 4096, steps=6)
  assert policy.init().model is None and first.policy_state.model is not None
  saved = decode_state(policy.init(), json.loads(json.dumps(encode_state(first.policy_state))))
  np.testing.assert_array_equal(saved.model.slope_s, first.policy_state.model.slope_s)
  rest = simulate_shares(policy, trace, GPU_LIKE, 4096, steps=12, start=6, policy_state=saved)
  np.testing.assert_array_equal(rest.shares, full.shares[6:])
  assert np.isfinite(rest.policy_state.finish_s)
