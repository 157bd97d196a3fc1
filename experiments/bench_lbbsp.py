r"""LB-BSP against uniform BSP under stragglers: real local workers, then the virtual clock at scale.

For each scenario, one job of 4 local workers (one CPU device each, each a host of known speed:
`hetjax.emulation.KnownSpeedHost`, one calibrated per-row cost for the job, slowed by the
scenario's trace) trains with every policy in turn, in interleaved blocks; policy p's k-th step
meets slowdown trace(k), so all policies see the same slowdowns
(`experiments/_lbbsp_worker.py`). Every host has the same base speed, so the oracle, which
knows the trace and takes base speeds as equal, knows every worker's true speed.
Per scenario × policy it reports, from measured telemetry (steps of that policy only):

* ``iter/limit``: median iteration time (compile time left out) over the median balanced limit
  X / Σ vᵢ + sync (vᵢ the measured speed shareᵢ / busyᵢ at that step, sync the measured
  communication and batch time);
* ``speedup``: Uniform's mean iteration time over the policy's;
* ``of ideal``: the policy's speedup over the ideal one (Uniform iteration / limit), i.e.
  limit / iteration — 1.0 is perfect balance;
* ``idle``: mean fraction of a step the workers wait at the barrier;
* ``compile``: share of the policy's time its steps waited for compiles (lowering a new share
  size's program; the XLA compile runs in the background while the size runs as pieces — see
  `hetjax.train.WorkerTrainer`'s ``bucket``). The piece ladder, compiled once before the first
  step, is printed per scenario instead;
* ``settle``: policy steps until the shares stop moving by more than one bucket (after the
  change for ``step``; ``-`` if they never settle, as expected under Markov);
* ``reversals``: direction reversals of any share after settling (oscillation).

Per scenario it also prints the hosts' calibrated cost and how many worker-steps overran their
host's time (the real compute took longer than the emulated host: the emulation did not hold).

Then the same scenarios (patterns tiled over the workers) on the virtual clock at 64 and 1024
workers, calibrated on the Uniform blocks of the first scenario's run.

Compiled share sizes are kept in memory and in a persistent compilation cache that is empty
when the benchmark starts and shared by its scenarios (as a relaunched job would share it), so
the first scenario pays cold compiles and later ones mostly load them.

  .venv/bin/python experiments/bench_lbbsp.py --quick --json runs/bench_lbbsp.json
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np
from absl import app, flags

from experiments._bench_launch import host_line, launch_workers
from hetjax import ConfigError, balance, emulation, simulation
from hetjax.report import load_telemetry

WORKERS = 4
SCENARIOS = {
    'static': 'static:1,1,1,3',
    'skewed': 'static:1,1.25,2,4',
    'markov': 'markov:3:0.9:seed=1',
    'step': 'step:20:1,1,1,1:1,1,1,3',
}
POLICIES = ('uniform', 'proportional', 'lbbsp-last', 'lbbsp-ewma', 'lbbsp-ar', 'lbbsp-narx',
            'oracle')
SCALE = (64, 1024)

_QUICK = flags.DEFINE_bool('quick', False, 'static and markov only, 3 rounds: under 3 minutes')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'blocks per policy (default 6, quick 3)')
_BLOCK = flags.DEFINE_integer('block', None, 'steps per block (default 5)')
_SCENARIOS = flags.DEFINE_list('scenarios', None, 'scenarios to run (default all; quick: '
                               'static, markov)')
_POLICIES = flags.DEFINE_list('policies', list(POLICIES), 'policies to compare')
_JSON = flags.DEFINE_string('json', None, 'write the rows as JSON here')
_KEEP = flags.DEFINE_string('keep', None, 'keep run directories under this directory')


def _launch(out: pathlib.Path, spec: str, policies, rounds: int, block: int,
            cache: pathlib.Path) -> dict:
  return launch_workers(out, '_lbbsp_worker.py', [','.join(policies), rounds, block], WORKERS,
                        timeout=900, slowdown=spec, cache=cache)


def _settle(shares: np.ndarray, bucket: int, after: int = 0) -> tuple[int | None, int]:
  """(policy steps from ``after`` until shares stop moving by > 1 bucket, reversals after)."""
  moves = np.abs(np.diff(shares, axis=0)).max(axis=1) > bucket  # moves[t]: t → t+1
  moving = [t for t in range(after, len(moves)) if moves[t]]
  if moving and moving[-1] >= len(moves) - 3:
    return None, 0  # still moving at the end: never settled
  settled = (moving[-1] + 1 if moving else after)
  delta = np.diff(shares[settled:], axis=0)
  signs = np.sign(delta)
  reversals = int(((signs[1:] * signs[:-1]) < 0).sum()) if len(signs) > 1 else 0
  return settled - after, reversals


def _policy_rows(run_dir: pathlib.Path, run: dict, scenario: str) -> list[dict]:
  t = load_telemetry(run_dir)
  schedule = json.loads((run_dir / 'schedule.json').read_text())
  step_index = {s: i for i, s in enumerate(t.steps)}
  out = {}
  for name in dict.fromkeys(s['policy'] for s in schedule):
    idx = [step_index[s] for b in schedule if b['policy'] == name
           for s in range(b['first_step'], b['last_step'] + 1)]
    busy = t.compute_s[idx] + t.dilation_s[idx]
    # Compiling a new share size is reported on its own (compile share), not as iteration time;
    # medians keep a scheduler spike on the shared 2-core machine from deciding a comparison.
    iteration = (t.step_s[idx] - t.compile_s[idx]).max(axis=1)
    speeds = t.share[idx] / np.maximum(busy, 1e-9)
    sync = t.comm_s[idx][:, 0] + t.data_s[idx].mean(axis=1)
    limit = t.share[idx].sum(axis=1) / speeds.sum(axis=1) + sync
    compile_share = t.compile_s[idx].max(axis=1).sum() / t.step_s[idx].max(axis=1).sum()
    shares = np.asarray(run['shares'][name])
    settle, reversals = _settle(shares, run['bucket'], 20 if scenario == 'step' else 0)
    out[name] = {'scenario': scenario, 'policy': name, 'workers': WORKERS, 'source': 'measured',
                 'iter_s': float(np.median(iteration)), 'limit_s': float(np.median(limit)),
                 'idle_fraction': float((t.wait_s[idx] / t.step_s[idx]).mean()),
                 'compile_overhead_share': float(compile_share),
                 'settle_iterations': settle, 'reversals_after_settle': reversals}
  return _with_speedups(list(out.values()))


def _with_speedups(rows: list[dict]) -> list[dict]:
  uniform = next(r['iter_s'] for r in rows if r['policy'] == 'uniform')
  for r in rows:
    r['ratio_to_limit'] = r['iter_s'] / r['limit_s']
    r['speedup_vs_uniform'] = uniform / r['iter_s']
    ideal = uniform / r['limit_s']
    r['fraction_of_ideal_speedup'] = r['speedup_vs_uniform'] / ideal
  return rows


def _virtual_rows(scenario: str, workers: int, cost: simulation.ClockCosts, steps: int,
                  policies) -> list[dict]:
  spec = SCENARIOS[scenario]
  pattern = emulation.parse_trace(spec, WORKERS)
  tiled = _tile(pattern, spec, workers)
  rows_per_worker = 512
  x = rows_per_worker * workers
  rules = balance.ShareRules(x, workers, 32)
  rows = []
  for name in policies:
    start = time.perf_counter()
    v = simulation.simulate_shares(balance.make_policy(name, rules, tiled), tiled, cost, x, steps)
    shares = v.shares
    settle, reversals = _settle(shares, 32, 20 if scenario == 'step' else 0)
    rows.append({'scenario': scenario, 'policy': name, 'workers': workers, 'source': 'virtual',
                 'iter_s': v.mean_iter_s(), 'limit_s': v.mean_balanced_limit_s(),
                 'idle_fraction': float(v.idle_fraction.mean()), 'compile_overhead_share': None,
                 'settle_iterations': settle, 'reversals_after_settle': reversals,
                 'simulate_s': time.perf_counter() - start})
  return _with_speedups(rows)


def _tile(pattern, spec: str, workers: int):
  """The 4-worker scenario repeated over ``workers`` (Markov: every worker its own chain)."""
  if spec.startswith('markov'):
    return emulation.parse_trace(spec, workers)
  if spec.startswith('step'):
    _, at, before, after = spec.split(':')
    rep = lambda s: ','.join(s.split(',') * (workers // WORKERS))  # noqa: E731
    return emulation.parse_trace(f'step:{at}:{rep(before)}:{rep(after)}', workers)
  return emulation.StaticTrace(tuple(np.tile(pattern.factors(0), workers // WORKERS).tolist()))


def _calibrate(run_dir: pathlib.Path, run: dict, workers: int) -> simulation.ClockCosts:
  t = load_telemetry(run_dir)
  schedule = json.loads((run_dir / 'schedule.json').read_text())
  index = {s: i for i, s in enumerate(t.steps)}
  idx = [index[s] for b in schedule if b['policy'] == 'uniform'
         for s in range(b['first_step'] + 1, b['last_step'] + 1)]
  # Per-sample busy time (compute and the host's padding) of a host at trace factor 1.
  busy = t.compute_s[idx] + t.dilation_s[idx]
  per_sample = float((busy / t.share[idx] / t.slowdown[idx]).mean())
  fit = run['allreduce']
  base = simulation.ClockCosts(per_sample, alpha_s=fit['alpha_s'],
                           beta_bytes_per_s=fit['beta_bytes_per_s'], grad_bytes=run['grad_bytes'])
  host = float((t.step_s[idx].max(axis=1) - busy.max(axis=1)).mean()) - base.allreduce_s(WORKERS)
  return simulation.ClockCosts(per_sample, alpha_s=fit['alpha_s'],
                           beta_bytes_per_s=fit['beta_bytes_per_s'], grad_bytes=run['grad_bytes'],
                           host_s=max(host, 0.0))


def _table(rows: list[dict]) -> str:
  head = (f'{"scenario":<8}{"workers":>8} {"source":<9}{"policy":<14}{"iter ms":>9}{"iter/limit":>11}'
          f'{"speedup":>9}{"of ideal":>9}{"idle":>6}{"compile":>8}{"settle":>7}{"rev":>4}')
  lines = [head, '-' * len(head)]
  for r in rows:
    compile_share = '-' if r['compile_overhead_share'] is None else f'{r["compile_overhead_share"]:.3f}'
    settle = '-' if r['settle_iterations'] is None else str(r['settle_iterations'])
    lines.append(
        f'{r["scenario"]:<8}{r["workers"]:>8} {r["source"]:<9}{r["policy"]:<14}'
        f'{1e3 * r["iter_s"]:>9.1f}{r["ratio_to_limit"]:>11.2f}{r["speedup_vs_uniform"]:>9.2f}'
        f'{r["fraction_of_ideal_speedup"]:>9.2f}{r["idle_fraction"]:>6.2f}{compile_share:>8}'
        f'{settle:>7}{r["reversals_after_settle"]:>4}')
  return '\n'.join(lines)


def run(root: pathlib.Path, rounds: int, block: int, scenarios, policies) -> list[dict]:
  rows = []
  with tempfile.TemporaryDirectory() as cache:  # cold at the start, warmed by each scenario
    for scenario in scenarios:
      rows += _scenario(root, scenario, policies, rounds, block, pathlib.Path(cache))
  cost = _calibrate(root / scenarios[0], json.loads((root / scenarios[0] / 'run.json').read_text()),
                    WORKERS)
  for n in SCALE:
    for scenario in scenarios:
      rows += _virtual_rows(scenario, n, cost, rounds * block, policies)
  return rows


def _scenario(root, scenario, policies, rounds, block, cache) -> list[dict]:
  run_info = _launch(root / scenario, SCENARIOS[scenario], policies, rounds, block, cache)
  compiles = {k: run_info[k] for k in ('warmup_compile_s', 'background_compiles',
                                       'background_compile_s', 'piece_steps')}
  print(f'{scenario} (worker 0): piece ladder compiled before step 1 in '
        f'{compiles["warmup_compile_s"]:.1f} s; {compiles["background_compiles"]} sizes compiled '
        f'in the background ({compiles["background_compile_s"]:.1f} s); '
        f'{compiles["piece_steps"]} steps ran as pieces; '
        f'{host_line(root / scenario, run_info)}', flush=True)
  return [r | compiles for r in _policy_rows(root / scenario, run_info, scenario)]


def main(argv: list[str]) -> None:
  rounds = (3 if _QUICK.value else 6) if _ROUNDS.value is None else _ROUNDS.value
  block = 5 if _BLOCK.value is None else _BLOCK.value
  scenarios = _SCENARIOS.value or (['static', 'markov'] if _QUICK.value else list(SCENARIOS))
  bad = [s for s in scenarios if s not in SCENARIOS] + [
      p for p in _POLICIES.value if p not in POLICIES]
  if len(argv) > 1 or bad or 'uniform' not in _POLICIES.value or rounds < 1 or block < 2:
    print(f'bench_lbbsp: error: bad arguments {argv[1:] + bad} (uniform must be among the '
          f'policies; rounds >= 1, block >= 2)', file=sys.stderr)
    sys.exit(2)
  start = time.perf_counter()
  try:
    if _KEEP.value:
      rows = run(pathlib.Path(_KEEP.value), rounds, block, scenarios, _POLICIES.value)
    else:
      with tempfile.TemporaryDirectory() as tmp:
        rows = run(pathlib.Path(tmp), rounds, block, scenarios, _POLICIES.value)
  except (ConfigError, RuntimeError) as e:
    print(f'bench_lbbsp: error: {e}', file=sys.stderr)
    sys.exit(1)
  print(_table(rows))
  print(f'{rounds} rounds x {block} steps per policy and scenario; '
        f'{time.perf_counter() - start:.0f} s')
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(rows, indent=2) + '\n')


if __name__ == '__main__':
  app.run(main)
