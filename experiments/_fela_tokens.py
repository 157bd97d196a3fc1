"""The token-scheduling part of the Fela benchmark: BSP, LB-BSP and tokens, measured and virtual.

For each scenario one job of 4 local workers (one CPU device each, each a host of known speed:
`hetjax.emulation.KnownSpeedHost`, one calibrated per-row and per-step cost for the job, slowed
by the scenario's trace) trains with every policy in interleaved blocks
(`experiments/_tokens_worker.py`); each policy's median iteration time (compile time left out)
comes from the measured telemetry. Then the same scenarios on the virtual clock at 64 and 1024
workers (512 rows per worker, patterns tiled by `_analysis.tile_trace`): uniform and LB-BSP
through `hetjax.simulation.simulate_shares`, tokens (with and without the end game) through
`simulate_tokens`, all with one cost model calibrated on the static run (see `calibrate`): a
gradient call's fixed and per-row cost from the uniform (512-row) and token (128-row) calls,
host time from the uniform blocks, per-token overhead (pull, placing rows) from the token
blocks. The ``virtual-nocall`` rows repeat that without the
fixed cost per call.

What decides the comparison here is what a gradient call costs: tokens make 16 calls a step
where BSP and LB-BSP make 4. A host of known speed pads every call to its rows' cost plus the
calibrated per-call cost ``fixed_s``, so every token pays ``fixed_s`` and a share pays it once
a step. The job's workers are pinned to cores (`hetjax.runtime._affinity`) and its host is
calibrated on a stream of single calls at the token size and at a uniform share
(`hetjax.run.emulated_host`, mode tokens), the same host for every policy of the
job. Unpinned, the same 128-row call took 10–190 ms from one moment to the next and 14–38% of
token worker-steps ran past their host's time, so token rows measured the machine's noise as
much as the queue; pinned, 0–2 of 40 did in the quick runs. The virtual rows carry the fixed
cost per call too; the ``virtual-nocall`` rows are the counterfactual without it.

  run_tokens(pathlib.Path('/tmp/ft'), quick=True)   # rows for experiments/bench_fela.py
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from experiments import _analysis, _harness
from experiments._bench_launch import launch_workers
from experiments._lbbsp_worker import BUCKET
from hetjax import balance, core, emulation, simulation

WORKERS = 4
TOKEN_ROWS = 128  # 16 tokens of the 2048-row batch: a bucket, so one of the compiled pieces
SCENARIOS = {'static': 'static:1,1,1,3', 'markov': 'markov:3:0.9:seed=1'}
# tokens: the end game and prefetch; tokens-serial: the end game, each pull after its token;
# tokens-greedy: Fela's plain greedy pulling
POLICIES = ('uniform', 'lbbsp', 'tokens', 'tokens-serial', 'tokens-greedy')
VIRTUAL_TOKENS = {'tokens': (True, True), 'tokens-serial': (True, False),
                  'tokens-greedy': (False, False)}  # (end game, prefetch)
SCALE = (64, 1024)
ROWS_PER_WORKER = 512  # virtual clock: X = 512 × workers, as in bench_lbbsp
VIRTUAL_STEPS = 50


def _launch(out: pathlib.Path, spec: str, policies, rounds: int, block: int,
            cache: pathlib.Path) -> dict:
  return launch_workers(out, '_tokens_worker',
                        [','.join(policies), rounds, block, TOKEN_ROWS], WORKERS, timeout=600,
                        slowdown=spec, cache=cache, pin_cores=True)


def measured_rows(job: _harness.JobRun, scenario: str) -> list[dict]:
  """One measured row per policy of a token job."""
  t, run, rows = job.telemetry, job.info, []
  for name in run['shares']:
    idx = job.rows(name)
    # Medians keep a scheduler spike on the shared 2-core machine from deciding a comparison.
    iteration = job.iteration_s(idx, without_compile=True)
    busy = job.busy_s(idx)
    row = {'scenario': scenario, 'policy': name, 'workers': WORKERS, 'source': 'measured',
           'iter_s': float(np.median(iteration)),
           'idle_fraction': float(job.idle_fraction(idx).mean()),
           'compute_ms_per_row': 1e3 * float(t.compute_s[idx].sum() / t.share[idx].sum()),
           'compute_ms_per_call': 1e3 * float(np.median(
               (t.compute_s[idx] / np.maximum(_calls(name, t.share[idx]), 1))[t.share[idx] > 0])),
           'busy_imbalance': float(np.median(busy.max(axis=1) / busy.mean(axis=1)))}
    if name.startswith('tokens'):
      tokens = np.asarray(run['shares'][name]) // TOKEN_ROWS
      row |= {'pull_s': run['pull_s'], 'token_rows': TOKEN_ROWS, 'left_early': run['left_early'],
              'tokens_per_worker': tokens.sum(axis=0).tolist(),
              'data_ms_per_step': 1e3 * float(np.median(t.data_s[idx].max(axis=1)))}
    rows.append(row)
  return _analysis.with_speedups(rows)


def _calls(policy: str, share: np.ndarray) -> np.ndarray:
  """Gradient calls per (step, worker): one per token, or one per non-empty share."""
  return share // TOKEN_ROWS if policy.startswith('tokens') else (share > 0).astype(int)


def calibrate(job: _harness.JobRun) -> tuple[simulation.ClockCosts, float]:
  """(cost model, per-token overhead seconds) from a real run.

  A gradient call costs ``fixed_s + per_sample_s × rows`` at trace factor 1 (compute and the
  host's padding); the uniform blocks give a 512-row call, the token blocks a 128-row one, and
  the two give both terms (`_analysis.two_point_cost`), so share policies pay ``fixed_s`` once
  per step and tokens once per token. Host time is from the uniform blocks
  (`_harness.host_time_s`); the per-token overhead outside compute (pull round trip, placing the
  rows) from the token blocks' data time.
  """
  t = job.telemetry

  def per_call(name: str) -> tuple[float, float]:  # (rows, busy seconds per call at factor 1)
    idx = job.rows(name, skip=1)
    share, busy = t.share[idx], job.busy_s(idx)
    count = _calls(name, share)
    seconds = busy / np.maximum(count, 1) / t.slowdown[idx]
    rows = share / np.maximum(count, 1)
    return float(np.median(rows[count > 0])), float(np.median(seconds[count > 0]))

  # Token calls without prefetch: a prefetching worker's call also covers its next pull.
  serial = 'tokens-serial' if 'tokens-serial' in job.info['shares'] else 'tokens'
  per_sample, fixed = _analysis.two_point_cost(*per_call('uniform'), *per_call(serial))
  host = _harness.host_time_s(job, job.rows('uniform', skip=1), per_sample)
  cost = simulation.ClockCosts(per_sample, fixed_s=fixed, host_s=host, **_harness.network(job.info))
  # Pulls, placing rows and building the step's batch on the host, per round trip.
  steps = np.concatenate([job.rows(name) for name in job.info['shares']
                          if name.startswith('tokens')])
  return cost, float(t.data_s[steps].sum() / job.info['pulls'])


def _virtual_rows(scenario: str, workers: int, cost: simulation.ClockCosts,
                  overhead: float) -> list[dict]:
  """The scenario tiled over ``workers`` on the virtual clock (modelled, not measured)."""
  trace = _analysis.tile_trace(emulation.parse_trace(SCENARIOS[scenario], WORKERS), workers)
  x = ROWS_PER_WORKER * workers
  rules = core.ShareRules(x, workers, BUCKET)
  runs = {name: simulation.simulate_shares(balance.make_policy(name, rules), trace, cost, x,
                                           VIRTUAL_STEPS) for name in ('uniform', 'lbbsp')}
  for name, (endgame, prefetch) in VIRTUAL_TOKENS.items():
    runs[name] = simulation.simulate_tokens(trace, cost, x, TOKEN_ROWS, VIRTUAL_STEPS,
                                            pull_s=overhead, endgame=endgame, prefetch=prefetch)
  return _analysis.with_speedups([
      {'scenario': scenario, 'policy': name, 'workers': workers, 'source': 'virtual',
       'iter_s': run.mean_iter_s(), 'limit_s': run.mean_balanced_limit_s(),
       'idle_fraction': float(run.idle_fraction.mean())} for name, run in runs.items()])


def run_tokens(root: pathlib.Path, quick: bool) -> list[dict]:
  """Measured rows (4 workers) and virtual rows (64, 1024 workers) per scenario and policy.

  Args:
    root: run directories go to ``root/tokens-SCENARIO``.
    quick: 2 rounds × 5 steps of uniform, lbbsp, tokens and tokens-serial (the same without
      prefetch); else 6 rounds, and tokens-greedy (Fela's plain greedy pulling) too. The
      virtual rows always include all three token policies.

  Returns:
    dicts with ``scenario``, ``policy``, ``workers``, ``source``, ``iter_s`` and
    ``speedup_vs_uniform``, plus diagnostics (``pull_s``, compute per call, tokens per worker, the
    calibration, …). Sources: 'measured' (4 real workers), 'virtual' (the calibrated model) and
    'virtual-nocall' (the same without the fixed cost per gradient call: what tokens would do
    where a call costs only its rows).
  """
  rounds, block = (2, 5) if quick else (6, 5)
  policies = POLICIES[:4] if quick else POLICIES  # quick: without tokens-greedy
  rows, jobs = [], {}
  with _harness.compilation_cache() as cache:  # cold at the start, warmed by each scenario
    for scenario, spec in SCENARIOS.items():
      run_dir = root / f'tokens-{scenario}'
      _launch(run_dir, spec, policies, rounds, block, cache)
      jobs[scenario] = job = _harness.JobRun.load(run_dir)
      print(f'tokens {scenario}: {job.host_line()}', flush=True)
      rows += measured_rows(job, scenario)
  cost, overhead = calibrate(jobs['static'])
  # The counterfactual: no fixed cost per call, every row at the per-row cost of a 512-row call.
  per_row = cost.fixed_s / ROWS_PER_WORKER + cost.per_sample_s
  models = {'virtual': (cost, overhead),
            'virtual-nocall': (dataclasses.replace(cost, fixed_s=0.0, per_sample_s=per_row),
                               jobs['static'].info['pull_s'])}
  for source, (model, per_token) in models.items():
    calibration = {'fixed_s': model.fixed_s, 'per_sample_s': model.per_sample_s,
                   'host_s': model.host_s, 'token_overhead_s': per_token}
    for n in SCALE:
      for scenario in SCENARIOS:
        rows += [r | calibration | {'source': source}
                 for r in _virtual_rows(scenario, n, model, per_token)]
  return rows


def table(rows: list[dict]) -> str:
  """An aligned text table of `run_tokens`'s rows, then the goals for tokens, met or not."""
  head = (f'{"scenario":<9}{"workers":>8} {"source":<15}{"policy":<14}{"iter ms":>9}{"speedup":>9}'
          f'{"idle":>6}{"ms/call":>9}{"pull ms":>9}  tokens per worker')
  lines = [head, '-' * len(head)]
  for r in rows:
    call = f'{r["compute_ms_per_call"]:.1f}' if 'compute_ms_per_call' in r else '-'
    pull = f'{1e3 * r["pull_s"]:.2f}' if r.get('pull_s') is not None else '-'
    lines.append(f'{r["scenario"]:<9}{r["workers"]:>8} {r["source"]:<15}{r["policy"]:<14}'
                 f'{1e3 * r["iter_s"]:>9.1f}{r["speedup_vs_uniform"]:>9.2f}'
                 f'{r["idle_fraction"]:>6.2f}{call:>9}{pull:>9}  {r.get("tokens_per_worker", "")}')
  lines.append('goals for tokens (end game and prefetch): beat uniform everywhere, within 5% '
               'of LB-BSP under static, beat LB-BSP under Markov (issue 28)')
  groups = {(r['scenario'], r['workers'], r['source']): {} for r in rows}
  for r in rows:
    groups[r['scenario'], r['workers'], r['source']][r['policy']] = r['iter_s']
  for (scenario, workers, source), t in groups.items():
    vs_lbbsp = t['tokens'] / t['lbbsp']
    lbbsp_goal = vs_lbbsp <= 1.05 if scenario == 'static' else vs_lbbsp < 1.0
    lines.append(f'  {scenario} {workers} {source}: tokens/uniform {t["tokens"] / t["uniform"]:.2f} '
                 f'({"met" if t["tokens"] < t["uniform"] else "NOT met"}), tokens/lbbsp '
                 f'{vs_lbbsp:.2f} ({"met" if lbbsp_goal else "NOT met"})')
  return '\n'.join(lines)
