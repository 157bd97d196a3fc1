r"""The causal limit under Markov slowdowns (`hetjax.bench.MarkovLimit`, the best share policy
that cannot see the future) as `bench_lbbsp`'s virtual row, and its expectation over seeds:

  .venv/bin/python -m experiments._markov_limit   # expectation over seeds
"""

from __future__ import annotations

import time

import numpy as np

from hetjax import balance, core, emulation
from hetjax.bench import MarkovLimit


def virtual_row(scenario: str, trace, rules: core.ShareRules, cost, steps: int) -> dict:
  """`bench_lbbsp`'s virtual row of the causal limit on ``trace`` (a `MarkovTrace`) and ``cost``
  (`hetjax.simulation.ClockCosts`, one per-row cost for every worker)."""
  from experiments import _analysis
  from hetjax import simulation

  start = time.perf_counter()
  policy = MarkovLimit(rules, trace, float(np.max(cost.per_sample_s)), cost.fixed_s)
  run = simulation.simulate_shares(policy, trace, cost, rules.global_batch, steps)
  settle, reversals = _analysis.settle(run.shares, rules.bucket)
  return {'scenario': scenario, 'policy': policy.name, 'workers': rules.workers,
          'source': 'virtual', 'iter_s': run.mean_iter_s(), 'limit_s': run.mean_balanced_limit_s(),
          'idle_fraction': float(run.idle_fraction.mean()), 'compile_overhead_share': None,
          'settle_iterations': settle, 'reversals_after_settle': reversals,
          'simulate_s': time.perf_counter() - start}


def expected_rows(workers: int = 4, seeds: int = 20, steps: int = 200, names=(
    'uniform', 'lbbsp-last', 'lbbsp-ar', 'lbbsp-regime', 'causal-limit', 'oracle')) -> dict:
  """Mean iteration time of each policy over ``seeds`` Markov traces (3x, stay 0.9) on the
  virtual clock of `bench_lbbsp`'s calibrated-like hosts (0.22 ms/row, 17 ms/step)."""
  from hetjax import simulation

  cost = simulation.ClockCosts(per_sample_s=0.2236e-3, fixed_s=16.85e-3)
  rules = core.ShareRules(512 * workers, workers, 128 if workers == 4 else 32)
  out = {name: [] for name in (*names, 'limit')}
  known = balance.KnownCosts(cost.per_sample_s, cost.fixed_s)  # the oracle's: the hosts' costs
  for seed in range(seeds):
    trace = emulation.MarkovTrace(workers, 3.0, 0.9, seed=seed)
    for name in names:
      policy = (MarkovLimit(rules, trace, cost.per_sample_s, cost.fixed_s)
                if name == 'causal-limit' else
                balance.make_policy(name, rules, trace, known if name == 'oracle' else None))
      run = simulation.simulate_shares(policy, trace, cost, rules.global_batch, steps)
      out[name].append(run.mean_iter_s())
    out['limit'].append(run.mean_balanced_limit_s())
  return {name: float(np.mean(v)) for name, v in out.items()}


if __name__ == '__main__':
  for n in (4, 64):
    means = expected_rows(n, seeds=20 if n == 4 else 5)
    print(f'{n} workers, Markov 3x stay 0.9, mean over seeds of 200 steps (virtual clock):')
    for name, s in means.items():
      if name != 'limit':
        print(f'  {name:<14}{1e3 * s:8.1f} ms  {means["limit"] / s:.3f} of ideal  '
              f'{s / means["oracle"]:.3f}x oracle  {s / means["causal-limit"]:.3f}x causal limit')
