"""The virtual clock: modelled costs, balanced limit, uniform shares and simulated BSP runs."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.balance import Uniform
from hetjax.core import Policy, ShareRules, StepStats
from hetjax.emulation import KnownSpeedHost, MarkovTrace, StaticTrace, parse_trace
from hetjax.simulation._shares import ClockCosts, VirtualRun, simulate_shares


def _uniform(global_batch: int, workers: int) -> Uniform:
  return Uniform(ShareRules(global_batch, workers))


def test_uniform_bsp_with_one_slow_worker_is_2_5x_the_limit():
  cost = ClockCosts(per_sample_s=1e-3)
  run = simulate_shares(_uniform(400, 4), StaticTrace((1, 1, 1, 3)), cost, 400, steps=5)
  assert isinstance(run, VirtualRun)
  assert run.shares.tolist() == [[100] * 4] * 5
  np.testing.assert_allclose(run.iter_s, 3 * 100 * 1e-3, rtol=1e-12)
  np.testing.assert_allclose(run.balanced_limit_s, 400e-3 / (3 + 1 / 3), rtol=1e-12)
  assert run.mean_iter_s() == pytest.approx(0.3, rel=1e-12)
  assert run.mean_balanced_limit_s(skip=2) == pytest.approx(0.12, rel=1e-12)
  assert run.ratio_to_limit() == pytest.approx(2.5, rel=1e-12)
  np.testing.assert_allclose(run.idle_fraction, [[2 / 3, 2 / 3, 2 / 3, 0.0]] * 5, rtol=1e-12)
  assert (run.comm_s == 0).all()


def test_history_is_what_the_policy_sees():
  seen = []

  class Recorder:
    name = 'recorder'

    def init(self):
      return 0  # steps learned from

    def update(self, state, stats):
      seen.append(None if stats is None else (stats.step, stats.rows))
      if stats is None:
        return (2, 2), state
      return (3, 1) if stats.compute_s[1] > stats.compute_s[0] else (2, 2), state + 1

  cost = ClockCosts(per_sample_s=0.01, fixed_s=0.005, alpha_s=0.002, grad_bytes=1000,
                    beta_bytes_per_s=1e6)
  run = simulate_shares(Recorder(), parse_trace('step:1:1:1,2', 2), cost, 4, steps=3)
  assert isinstance(Recorder(), Policy)
  # Asked once without stats, then after every step (the last answer is the state's to keep).
  assert seen == [None, (0, (2, 2)), (1, (2, 2)), (2, (3, 1))]
  assert run.shares.tolist() == [[2, 2], [2, 2], [3, 1]]
  assert run.policy_state == 3
  comm = 2 * 0.002 + 1000 / 1e6
  assert run.history[1] == StepStats(1, rows=(2, 2), compute_s=(0.025, 0.05), sync_s=comm,
                                     iter_s=0.05 + comm, load=(1.0, 2.0))
  for stats, row in zip(run.history, run.iter_s, strict=True):
    assert stats.iter_s == row
  np.testing.assert_array_equal(run.iter_s, run.compute_s.max(axis=1) + run.comm_s)
  np.testing.assert_allclose(run.idle_fraction[1], [0.025 / (0.05 + comm), 0.0])


def test_compute_is_what_an_emulated_host_takes():
  # A host of known speed pads a step of x rows to f·(fixed + x·per_row): the modelled time.
  cost = ClockCosts(per_sample_s=2e-3, fixed_s=1e-3)
  shares, factors = np.array([0, 10, 50]), np.array([1.0, 2.5, 4.0])
  trace = StaticTrace(tuple(factors.tolist()))
  hosts = [KnownSpeedHost(trace, i, row_s=2e-3, fixed_s=1e-3) for i in range(3)]
  emulated = [h.target_s(0, int(x)) for h, x in zip(hosts, shares, strict=True)]
  np.testing.assert_allclose(cost.compute_s(shares, factors), emulated, rtol=1e-12)
  assert cost.compute_s(shares, factors)[0] == pytest.approx(1e-3)  # share 0 pays fixed_s


def test_allreduce_formula():
  cost = ClockCosts(per_sample_s=1.0, alpha_s=1e-5, beta_bytes_per_s=1e9, grad_bytes=4_000_000)
  assert cost.allreduce_s(1) == 0.0
  assert cost.allreduce_s(8) == pytest.approx(2 * 7 * 1e-5 + 2 * 7 / 8 * 4e6 / 1e9, rel=1e-12)
  assert ClockCosts(per_sample_s=1.0, alpha_s=1e-5, grad_bytes=10**9).allreduce_s(4) == (
      pytest.approx(6e-5))  # infinite bandwidth: latency only
  with pytest.raises(ConfigError, match='workers must be an integer >= 1'):
    cost.allreduce_s(0)


def _bisect_limit(cost: ClockCosts, x: int, factors: np.ndarray) -> float:
  """T with Σ max(0, (T/f − fixed)/per_sample) = x, by bisection: the brute-force oracle."""
  def covered(t):
    return np.maximum(0, (t / factors - cost.fixed_s) / cost.per_sample_s).sum()

  lo, hi = 0.0, factors.max() * (cost.fixed_s + x * cost.per_sample_s)  # one worker does it all
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if covered(mid) < x else (lo, mid)
  return hi + cost.allreduce_s(len(factors))


@pytest.mark.parametrize('fixed_s', [0.0, 1e-4, 5e-3, 0.05, 1.0])
@pytest.mark.parametrize('seed', range(4))
def test_balanced_limit_matches_bisection(fixed_s, seed):
  rng = np.random.default_rng(seed)
  factors = rng.uniform(1.0, 6.0, size=int(rng.integers(1, 40)))
  factors[: len(factors) // 3] = factors[0]  # ties between breakpoints
  cost = ClockCosts(per_sample_s=1e-3, fixed_s=fixed_s, alpha_s=1e-4, grad_bytes=10**6,
                   beta_bytes_per_s=1e9)
  for x in (1, 7, 256, 10_000):
    assert cost.balanced_limit_s(x, factors) == pytest.approx(
        _bisect_limit(cost, x, factors), rel=1e-9)


def test_balanced_limit_closed_forms_and_bound():
  f = np.array([1.0, 2.0, 4.0])
  assert ClockCosts(per_sample_s=1e-3).balanced_limit_s(70, f) == pytest.approx(
      70e-3 / (1 + 1 / 2 + 1 / 4))
  # fixed_s = 1 s: worker 2's overhead alone is 4 s, so at T = 2.67 s it sits out.
  cost = ClockCosts(per_sample_s=0.1, fixed_s=1.0)
  assert cost.balanced_limit_s(20, f) == pytest.approx((20 * 0.1 + 2 * 1.0) / 1.5)
  # No integer shares beat the bound (all 3-way splits of 12 examples, all workers pay fixed_s).
  cost = ClockCosts(per_sample_s=1e-3, fixed_s=2e-3)
  best = min(cost.compute_s(np.array(s), f).max()
             for s in itertools.product(range(13), repeat=3) if sum(s) == 12)
  assert cost.balanced_limit_s(12, f) <= best


def test_uniform_shares():
  def first(policy):
    return policy.update(policy.init(), None)[0].values

  assert first(_uniform(10, 4)) == (3, 3, 2, 2)
  assert first(_uniform(8, 8)) == (1,) * 8
  # The same split as the old X // n each, remainder to the first workers, for every small case.
  for x, n in itertools.product(range(1, 40), range(1, 12)):
    if x >= n:
      base, extra = divmod(x, n)
      assert first(_uniform(x, n)) == (base + 1,) * extra + (base,) * (n - extra), (x, n)
  with pytest.raises(ConfigError, match=r'global batch 3 is smaller than the minimum shares need '
                                        r'\(4 workers x at least 1: 4\)'):
    _uniform(3, 4)
  with pytest.raises(ConfigError, match=r'workers \(0\) and bucket \(1\) must be positive'):
    _uniform(3, 0)


def test_many_workers_is_fast():
  cost = ClockCosts(per_sample_s=1e-3, fixed_s=2e-3, alpha_s=1e-5, beta_bytes_per_s=1e9,
                   grad_bytes=10**7)
  # A guard against a blow-up in scale, in CPU seconds of this process (not wall time: a
  # loaded machine must not fail it).
  start = time.process_time()
  run = simulate_shares(_uniform(8192, 1024), MarkovTrace(1024, slow=3.0, stay=0.9, seed=1), cost,
                 8192, steps=100)
  assert time.process_time() - start < 2.0
  assert run.shares.shape == run.compute_s.shape == run.idle_fraction.shape == (100, 1024)
  assert len(run.history) == 100 and run.ratio_to_limit(skip=10) > 1.0
  assert (run.idle_fraction >= 0).all() and (run.idle_fraction < 1).all()
  np.testing.assert_array_equal(run.idle_fraction.min(axis=1), 0.0)
  assert (run.iter_s >= run.balanced_limit_s).all()
  with pytest.raises(ValueError, match='read-only'):
    run.iter_s[0] = 0.0


class _Fixed:
  name = 'fixed'

  def __init__(self, shares):
    self._shares = shares

  def init(self):
    return ()

  def update(self, state, stats):
    return self._shares, state


@pytest.mark.parametrize(('shares', 'needle'), [
    ((4, 4, 4), r'returned \(3,\) int64; expected 4 integers'),
    ((4.0, 4.0, 4.0, 4.0), r'returned \(4,\) float64; expected 4 integers'),
    ((True, True, True, True), 'bool'),
    ((10, 10, -4, 0), 'min -4 and sum 16; they must be >= 0 and sum to the global batch 16'),
    ((4, 4, 4, 5), 'sum 17'),
])
def test_bad_shares_name_the_policy(shares, needle):
  with pytest.raises(ConfigError, match='share policy _Fixed at step 0 ') as info:
    simulate_shares(_Fixed(shares), StaticTrace((1,) * 4), ClockCosts(1e-3), 16, steps=2)
  assert info.match(needle)


def test_bad_inputs():
  cost, trace = ClockCosts(1e-3), StaticTrace((1, 2))
  with pytest.raises(ConfigError, match="trace 'static 1,2' has 2 workers, not 3"):
    simulate_shares(_uniform(8, 3), trace, cost, 8, steps=1, workers=3)
  with pytest.raises(ConfigError, match='steps must be an integer >= 1'):
    simulate_shares(_uniform(8, 2), trace, cost, 8, steps=0)
  with pytest.raises(ConfigError, match='start 2 leaves no step to run before steps 2'):
    simulate_shares(_uniform(8, 2), trace, cost, 8, steps=2, start=2)
  with pytest.raises(ConfigError, match='start must be an integer >= 0'):
    simulate_shares(_uniform(8, 2), trace, cost, 8, steps=2, start=-1)
  run = simulate_shares(_uniform(8, 2), trace, cost, 8, steps=2)
  with pytest.raises(ConfigError, match='skip 2 must leave at least one of 2 steps'):
    run.mean_iter_s(skip=2)
  for kwargs, needle in [({'per_sample_s': 0.0}, 'per_sample_s'),
                         ({'per_sample_s': 1.0, 'fixed_s': -1.0}, 'fixed_s'),
                         ({'per_sample_s': 1.0, 'alpha_s': math.nan}, 'alpha_s'),
                         ({'per_sample_s': 1.0, 'beta_bytes_per_s': 0.0}, 'beta_bytes_per_s'),
                         ({'per_sample_s': 1.0, 'grad_bytes': -1}, 'grad_bytes')]:
    with pytest.raises(ConfigError, match=needle):
      ClockCosts(**kwargs)


def test_per_worker_base_costs():
  # Worker 1 is twice as slow per sample even without a slowdown factor: T = X / Σ 1/cᵢ.
  cost = ClockCosts(per_sample_s=(1e-3, 2e-3))
  assert cost.balanced_limit_s(300, np.array([1.0, 1.0])) == pytest.approx(0.2)
  np.testing.assert_allclose(cost.compute_s(np.array([100, 100]), np.array([1.0, 3.0])), [0.1, 0.6])
  with pytest.raises(ConfigError, match='per_sample_s must be finite and > 0'):
    ClockCosts(per_sample_s=(1e-3, -1.0))


def test_compute_noise_is_seeded_and_unbiased():
  cost = ClockCosts(per_sample_s=1e-3)
  trace = StaticTrace((1.0, 1.0))
  a = simulate_shares(_uniform(200, 2), trace, cost, 200, steps=2000, noise_cv=0.4, seed=3)
  b = simulate_shares(_uniform(200, 2), trace, cost, 200, steps=2000, noise_cv=0.4, seed=3)
  np.testing.assert_array_equal(a.compute_s, b.compute_s)
  later = simulate_shares(_uniform(200, 2), trace, cost, 200, steps=2000, noise_cv=0.4, seed=3,
                   start=1500)  # a resumed run sees the noise the uninterrupted one saw
  np.testing.assert_array_equal(later.compute_s, a.compute_s[1500:])
  assert a.compute_s.mean() == pytest.approx(0.1, rel=0.03)
  assert (a.compute_s.std() / a.compute_s.mean()) == pytest.approx(0.4, rel=0.1)


def test_transient_delays_are_modelled_as_an_emulated_host_pads_them():
  # (factor + delay) × nominal, as `KnownSpeedHost.target_s`; the load the policy sees is the
  # factor alone, as a real emulated host reports it.
  trace = parse_trace('static:1,2*transient:1:0.5:seed=2', 2)
  cost = ClockCosts(per_sample_s=1e-3, fixed_s=2e-3)
  run = simulate_shares(_uniform(100, 2), trace, cost, 100, steps=6)
  for t, stats in enumerate(run.history):
    hosts = [KnownSpeedHost(trace, i, row_s=1e-3, fixed_s=2e-3) for i in range(2)]
    np.testing.assert_allclose(stats.compute_s, [h.target_s(t, 50) for h in hosts], rtol=1e-12)
    assert stats.load == tuple(trace.factors(t).tolist())
    assert run.balanced_limit_s[t] == pytest.approx(
        cost.balanced_limit_s(100, trace.factors(t) + trace.delays(t)), rel=1e-12)
  assert np.ptp([trace.delays(t).sum() for t in range(6)]) > 0  # some steps are hit, some not
