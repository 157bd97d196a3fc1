"""The regime predictor (`hetjax.balance.Regime`): it learns switching hosts, stays causal, resumes
exactly, and LB-BSP on it reaches the causal limit where smoothing predictors fall below
uniform."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.balance import LBBSP, Regime, expected_makespan, make_policy
from hetjax.bench import MarkovLimit
from hetjax.core import ShareRules, decode_state, encode_state
from hetjax.emulation import CsvTrace, MarkovTrace
from hetjax.simulation import ClockCosts, simulate_shares

RULES = ShareRules(global_batch=2048, workers=4, bucket=128)
COST = ClockCosts(per_sample_s=2e-4, fixed_s=0.02)


def _chain(steps: int, stay: float, seed: int, workers: int = 1) -> np.ndarray:
  """bool[steps, workers], True = slow: a two-state chain starting fast."""
  return np.stack([MarkovTrace(workers, 3.0, stay, seed=seed).factors(t) > 1 for t in range(steps)])


def _feed(predictor, speeds: np.ndarray):
  state = predictor.init(speeds.shape[1])
  for v in speeds:
    state = predictor.update(state, v, None)
  return state


def test_it_learns_a_two_state_chain_and_predicts_its_conditional_mean():
  # Speeds 100 (fast) and 25 (slow) with 5% log-normal noise, stay 0.8, on 4 workers for 300
  # steps. Each level is a running mean of >= 10 observations at 5% noise: within 3%. A worker's
  # own stay rate comes from ~50 effective transitions per regime (horizon 100): ±0.06 (1σ), so
  # 0.12 is 2σ. Pooled over the 4 workers (the chain is the same on each) with a long horizon,
  # ~1200 transitions: ±0.012, so E[v_{t+1} | s_t] is within ~2% (1σ on a slow worker's 40).
  slow = _chain(300, 0.8, seed=3, workers=4)
  rng = np.random.default_rng(0)
  speeds = np.where(slow, 25.0, 100.0) * np.exp(0.05 * rng.standard_normal(slow.shape))
  regime = Regime()
  levels, probs = regime.distribution(_feed(regime, speeds))
  for w in range(4):
    np.testing.assert_allclose(np.sort(levels[w][probs[w] > 0]), [25.0, 100.0], rtol=0.03)
    assert probs[w].max() == pytest.approx(0.8, abs=0.12)  # staying where it is
  pooled = Regime(horizon=1000, pooling=1000, decision='mean')
  state, errors = pooled.init(4), []
  for t, v in enumerate(speeds):
    state = pooled.update(state, v, None)
    truth = np.where(slow[t], 0.8 * 25 + 0.2 * 100, 0.8 * 100 + 0.2 * 25)
    if t >= 100:
      errors.append(np.abs(pooled.predict(state) / truth - 1))
  assert np.mean(errors) < 0.03 and np.max(errors) < 0.08
  # The default decision hedges between the levels, never outside them.
  hedged = regime.predict(_feed(regime, speeds))
  assert ((hedged >= 25.0 * 0.97) & (hedged <= 100.0 * 1.03)).all()


def test_a_switch_to_a_known_regime_is_recognised_at_once_and_a_blip_is_dropped():
  regime = Regime()
  fast_slow = np.array([[3.0]] * 4 + [[1.0]] * 4 + [[3.0]])
  state = _feed(regime, fast_slow)
  assert regime.predict(state)[0] == pytest.approx(3.0)  # back to a known level: no lag
  assert (state.count[0] > 0).sum() == 2
  blip = _feed(regime, np.array([[2.0]] * 6 + [[0.2]] + [[2.0]] * 3))  # one overrun
  assert (blip.count[0] > 0).sum() == 1  # the blip's slot is gone
  assert blip.trans[0].sum() == pytest.approx(blip.trans[0, blip.current[0], blip.current[0]])


def test_predictions_are_causal():
  # Two histories equal up to step 20 and different after: every prediction up to step 20,
  # and LB-BSP's shares up to step 21, are the same.
  rng = np.random.default_rng(1)
  base = np.where(_chain(40, 0.9, seed=2, workers=4), 3.0, 1.0)  # slowdown factors
  other = base.copy()
  other[21:] = rng.uniform(0.5, 4.0, other[21:].shape)
  regime = Regime()
  a, b = regime.init(4), regime.init(4)
  for t in range(40):
    a, b = regime.update(a, 1 / base[t], None), regime.update(b, 1 / other[t], None)
    if t <= 20:
      np.testing.assert_array_equal(regime.predict(a), regime.predict(b))
  policy = make_policy('lbbsp-regime', RULES)
  runs = [simulate_shares(policy, CsvTrace(f), COST, RULES.global_batch, 40)
          for f in (base, other)]
  np.testing.assert_array_equal(runs[0].shares[:22], runs[1].shares[:22])
  assert not np.array_equal(runs[0].shares, runs[1].shares)


def test_the_state_round_trips_and_a_resumed_policy_continues_identically():
  trace = MarkovTrace(4, slow=3, stay=0.9, seed=5)
  policy = make_policy('lbbsp-regime', RULES)
  full = simulate_shares(policy, trace, COST, RULES.global_batch, 30, noise_cv=0.3, seed=2)
  first = simulate_shares(policy, trace, COST, RULES.global_batch, 15, noise_cv=0.3, seed=2)
  saved = decode_state(policy.init(), json.loads(json.dumps(encode_state(first.policy_state))))
  assert encode_state(saved) == encode_state(first.policy_state)
  rest = simulate_shares(policy, trace, COST, RULES.global_batch, 30, noise_cv=0.3, seed=2,
                         start=15, policy_state=saved)
  np.testing.assert_array_equal(rest.shares, full.shares[15:])
  assert encode_state(rest.policy_state) == encode_state(full.policy_state)


@pytest.mark.parametrize('workers', [4, 64])
def test_lbbsp_regime_against_the_causal_limit_and_the_oracle(workers):
  # The causal limit (Bayes-optimal shares given the true chain and the states just observed)
  # is ~23% behind the oracle at 4 workers and equals uniform at 64 (someone flips every step).
  # LB-BSP on the regime model is within 5% of that limit on both; last value, which reacts to
  # every flip, falls 10% below uniform at 64.
  rules = ShareRules(512 * workers, workers, 128 if workers == 4 else 32)
  cost = ClockCosts(per_sample_s=2e-4, fixed_s=0.0)
  steps = 60
  mean = {}
  for seed in range(2):
    trace = MarkovTrace(workers, slow=3, stay=0.9, seed=seed)
    policies = {'limit': MarkovLimit(rules, trace, 2e-4),
                'regime': make_policy('lbbsp-regime', rules),
                'last': make_policy('lbbsp-last', rules), 'uniform': make_policy('uniform', rules),
                'oracle': make_policy('oracle', rules, trace)}
    for name, p in policies.items():
      mean[name] = mean.get(name, 0) + simulate_shares(p, trace, cost, rules.global_batch,
                                                       steps).mean_iter_s(5)
  print(workers, {k: round(v / mean['oracle'], 3) for k, v in mean.items()})
  assert mean['oracle'] < mean['limit']
  assert mean['regime'] <= 1.05 * mean['limit']
  if workers == 64:
    assert mean['regime'] <= 1.01 * mean['uniform'] < mean['last']


def test_expected_makespan_matches_enumeration():
  rng = np.random.default_rng(4)
  for _ in range(20):
    n, k = 3, 3
    speeds = rng.uniform(0.2, 3.0, (n, k))
    probs = rng.uniform(0.0, 1.0, (n, k)) * (rng.uniform(size=(n, k)) > 0.3)
    probs[:, 0] += 0.1
    probs /= probs.sum(axis=1, keepdims=True)
    x = rng.uniform(0.1, 1.0, n)
    brute = sum(np.prod([probs[i, c[i]] for i in range(n)])
                * max(x[i] / speeds[i, c[i]] for i in range(n))
                for c in itertools.product(range(k), repeat=n))
    assert expected_makespan(x, speeds, probs) == pytest.approx(brute, rel=1e-12)


def test_bad_settings_are_one_line_errors():
  for kwargs, match in (({'states': 1}, 'states >= 2'), ({'alpha': 0}, 'alpha'),
                        ({'decision': 'median'}, 'makespan, mean, mode')):
    with pytest.raises(ConfigError, match=match) as e:
      Regime(**kwargs)
    assert '\n' not in str(e.value)
  with pytest.raises(ConfigError, match='lbbsp-regime'):
    make_policy('lbbsp-regimes', RULES)
  with pytest.raises(ConfigError, match='before any update'):
    Regime().predict(Regime().init(2))
  with pytest.raises(ConfigError, match='one per worker'):
    Regime().update(Regime().init(2), np.ones(3), None)
  assert LBBSP(RULES, Regime()).name == 'lbbsp-regime'
