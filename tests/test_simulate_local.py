"""The local SGD (DiLoCo) virtual clock: rounds of H inner steps, one exchange a round, cutoff."""

from __future__ import annotations

import doctest
import time

import numpy as np
import pytest

from hetjax import balance
from hetjax._errors import ConfigError
from hetjax.core import ShareRules
from hetjax.emulation import MarkovTrace, StaticTrace, parse_trace
from hetjax.simulation import ClockCosts, LocalRun, _local, simulate_local, simulate_shares


def _policy(name: str, global_batch: int, workers: int):
  return balance.make_policy(name, ShareRules(global_batch, workers))


def test_doctests():
  assert doctest.testmod(_local, raise_on_error=True).attempted > 0


@pytest.mark.parametrize('name', ['uniform', 'lbbsp'])
@pytest.mark.parametrize(('transfer_s', 'noise_cv'), [((), 0.0), ((0.01, 0.0, 0.02, 0.005), 0.3)])
def test_one_inner_step_a_round_is_simulate_shares(name, transfer_s, noise_cv):
  cost = ClockCosts(per_sample_s=1e-3, fixed_s=2e-3, alpha_s=1e-4, beta_bytes_per_s=1e8,
                    grad_bytes=10**6, host_s=1e-3, transfer_s=transfer_s)
  trace = StaticTrace((1, 1, 1, 3))
  policy = _policy(name, 400, 4)
  bsp = simulate_shares(policy, trace, cost, 400, steps=12, noise_cv=noise_cv, seed=5)
  local = simulate_local(policy, trace, cost, 400, rounds=12, steps_per_round=1,
                         noise_cv=noise_cv, seed=5)
  np.testing.assert_allclose(local.round_s, bsp.iter_s, rtol=1e-12, atol=0)
  np.testing.assert_array_equal(local.shares, bsp.shares)
  np.testing.assert_array_equal(local.rows, bsp.shares)
  np.testing.assert_array_equal(local.busy_s, bsp.compute_s)
  np.testing.assert_allclose(local.balanced_limit_s, bsp.balanced_limit_s, rtol=1e-12)
  assert local.history == bsp.history  # the policy learns the same stats, so decides the same
  if name == 'lbbsp':
    assert len({tuple(s) for s in local.shares.tolist()}) > 1  # it did move the shares


def test_equal_hosts_round_is_h_steps_plus_one_exchange():
  h, rounds = 8, 5
  cost = ClockCosts(per_sample_s=1e-3, fixed_s=2e-3, alpha_s=1e-4, beta_bytes_per_s=1e8,
                    grad_bytes=10**6, transfer_s=(0.004,) * 4)
  run = simulate_local(_policy('uniform', 400, 4), StaticTrace((1.0,) * 4), cost, 400, rounds, h)
  assert isinstance(run, LocalRun)
  step = 2e-3 + 100 * 1e-3                         # fixed + 100 rows of 1 ms
  sync = 2 * 3 * 1e-4 + 2 * 3 / 4 * 10**6 / 1e8    # ring all-reduce of 1 MB over 4: 15.6 ms
  assert cost.sync_s(4) == pytest.approx(sync, rel=1e-12)
  np.testing.assert_allclose(run.round_s, h * step + 0.004 + sync, rtol=1e-12)  # transfer once
  np.testing.assert_allclose(run.balanced_limit_s, run.round_s, rtol=1e-12)     # balanced
  np.testing.assert_allclose(run.busy_s, h * step, rtol=1e-12)
  assert run.rows.tolist() == [[h * 100] * 4] * rounds
  assert run.samples() == rounds * h * 400
  assert run.time_s() == pytest.approx(rounds * (h * step + 0.004 + sync), rel=1e-12)
  assert run.samples_per_s() == pytest.approx(h * 400 / (h * step + 0.004 + sync), rel=1e-12)
  assert run.bytes_per_worker_per_step == pytest.approx(1.5e6 / h, rel=1e-12)
  assert run.steps_per_round == h
  assert [s.step for s in run.history] == [h - 1 + r * h for r in range(rounds)]
  first = run.history[0]
  assert first.rows == (100,) * 4 and first.load == (1.0,) * 4
  np.testing.assert_allclose(first.compute_s, step, rtol=1e-12)
  assert first.sync_s == pytest.approx((0.004 + sync) / h, rel=1e-12)
  assert first.iter_s == pytest.approx(run.round_s[0] / h, rel=1e-12)
  with pytest.raises(ValueError, match='read-only'):
    run.round_s[0] = 0.0


def test_one_slow_host_uniform_vs_lbbsp():
  h = 10
  cost = ClockCosts(per_sample_s=1e-3, alpha_s=1e-4)
  sync = 2 * 3 * 1e-4
  trace = StaticTrace((1, 1, 1, 3))
  uniform = simulate_local(_policy('uniform', 400, 4), trace, cost, 400, 6, h)
  # Every round waits for the slow host: 3 × the fast ones' 100 ms a step, over H steps.
  np.testing.assert_allclose(uniform.round_s, 3 * h * 0.1 + sync, rtol=1e-12)
  # The bound: 400 rows at 1 + 1 + 1 + 1/3 rows per ms are 120 ms a step.
  np.testing.assert_allclose(uniform.balanced_limit_s, h * 0.12 + sync, rtol=1e-12)
  lbbsp = simulate_local(_policy('lbbsp', 400, 4), trace, cost, 400, 6, h)
  assert (lbbsp.round_s >= lbbsp.balanced_limit_s * (1 - 1e-12)).all()
  assert (lbbsp.round_s[3:] <= 1.1 * lbbsp.balanced_limit_s[3:]).all()
  assert lbbsp.shares[-1, 3] < lbbsp.shares[-1, :3].min() / 2  # the slow host got less
  assert lbbsp.mean_round_s(skip=3) < 0.45 * uniform.mean_round_s()


def test_cutoff_stops_a_host_that_turns_slow():
  # Worker 3 turns 4x slow at round 3 (inner step 30). The budget is the median busy time of
  # the round before, 10 steps of 100 ms = 1 s; cutoff 1.5 lets a step end by 1.5 s, so the slow
  # worker runs 3 of its 400 ms steps (1.2 s) and skips the other 7.
  h, cutoff = 10, 1.5
  cost = ClockCosts(per_sample_s=1e-3, alpha_s=1e-4)
  sync = 2 * 3 * 1e-4
  trace = parse_trace(f'step:{3 * h}:1:1,1,1,4', 4)
  uniform = _policy('uniform', 400, 4)
  cut = simulate_local(uniform, trace, cost, 400, 7, h, cutoff=cutoff)
  full = simulate_local(uniform, trace, cost, 400, 7, h)
  np.testing.assert_array_equal(cut.rows[:3], full.rows[:3])
  assert cut.rows[:, :3].tolist() == [[1000] * 3] * 7
  assert cut.rows[3:, 3].tolist() == [300] * 4
  assert (cut.rows[3:, 3] < full.rows[3:, 3]).all()
  np.testing.assert_allclose(cut.round_s[3:], 1.2 + sync, rtol=1e-12)
  np.testing.assert_allclose(full.round_s[3:], 4.0 + sync, rtol=1e-12)
  budget = np.median(cut.busy_s[2:-1], axis=1)  # each round's budget, from the round before
  np.testing.assert_allclose(budget, 1.0, rtol=1e-12)
  assert (cut.round_s[3:] <= cutoff * budget + 0.4 + sync).all()  # + one slow step, + exchange
  assert cut.samples() == full.samples() - 4 * 700
  # The policy sees mean rows and seconds per inner step, skipped steps counted as 0 of each.
  seen = cut.history[3]
  assert (seen.step, seen.rows, seen.load) == (39, (100, 100, 100, 30), (1.0, 1.0, 1.0, 4.0))
  np.testing.assert_allclose(seen.compute_s, (0.1, 0.1, 0.1, 0.12), rtol=1e-12)
  assert seen.sync_s == pytest.approx(sync / h, rel=1e-12)
  assert seen.iter_s == pytest.approx((1.2 + sync) / h, rel=1e-12)
  # Round 0 has no budget: a worker slow from the start is not cut in its first round.
  slow = simulate_local(uniform, StaticTrace((1, 1, 1, 4)), cost, 400, 2, h, cutoff=cutoff)
  assert slow.rows[:, 3].tolist() == [1000, 300]


def test_a_thousand_workers_is_fast():
  cost = ClockCosts(per_sample_s=1e-3, fixed_s=2e-3, alpha_s=1e-5, beta_bytes_per_s=1e9,
                    grad_bytes=10**7)
  trace = MarkovTrace(1024, slow=3.0, stay=0.9, seed=1)
  # CPU seconds of this process, not wall time: a loaded machine must not fail it.
  start = time.process_time()
  run = simulate_local(_policy('lbbsp', 8192, 1024), trace, cost, 8192, rounds=20,
                       steps_per_round=10, cutoff=1.5, noise_cv=0.1)
  assert time.process_time() - start < 5.0
  assert run.shares.shape == run.rows.shape == run.busy_s.shape == (20, 1024)
  assert run.round_s.shape == run.balanced_limit_s.shape == (20,) and len(run.history) == 20
  for a in (run.busy_s, run.round_s, run.balanced_limit_s):
    assert np.isfinite(a).all() and (a > 0).all()
  assert (run.shares.sum(axis=1) == 8192).all()
  assert (run.rows <= 10 * run.shares).all() and run.samples() <= 20 * 10 * 8192
  assert run.bytes_per_worker_per_step == pytest.approx(2 * 1023 / 1024 * 10**7 / 10, rel=1e-12)


class _Fixed:
  name = 'fixed'

  def __init__(self, shares):
    self._shares = shares

  def init(self):
    return ()

  def update(self, state, stats):
    return self._shares, state


def test_bad_arguments_name_the_field():
  cost, trace, policy = ClockCosts(1e-3), StaticTrace((1, 2)), _policy('uniform', 8, 2)
  for kwargs, needle in [({'rounds': 0}, 'rounds must be an integer >= 1, got 0'),
                         ({'steps_per_round': 0}, 'steps_per_round must be an integer >= 1'),
                         ({'steps_per_round': 2.0}, 'steps_per_round must be an integer'),
                         ({'cutoff': -1.0}, 'cutoff must be a finite number >= 0, got -1.0'),
                         ({'noise_cv': -0.1}, 'noise_cv must be a finite number >= 0'),
                         ({'workers': 3}, "trace 'static 1,2' has 2 workers, not 3")]:
    args = {'rounds': 2, 'steps_per_round': 3} | kwargs
    with pytest.raises(ConfigError, match=needle):
      simulate_local(policy, trace, cost, 8, **args)
  with pytest.raises(ConfigError, match=r'share policy _Fixed at step 0 returned shares with min '
                                        r'-1 and sum 8'):
    simulate_local(_Fixed((9, -1)), trace, cost, 8, rounds=2, steps_per_round=3)
  run = simulate_local(policy, trace, cost, 8, rounds=2, steps_per_round=3)
  with pytest.raises(ConfigError, match='skip 2 must leave at least one of 2 rounds'):
    run.mean_round_s(skip=2)
