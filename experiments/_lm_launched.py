"""The launched part of `experiments/bench_lm.py`: ``experiments/train.py --config=gpt`` under
``python -m hetjax.launch``, 4 workers of one CPU device each, mode shares, each worker an
emulated host of known speed.

The model: 2 layers, d_model 64, 4 heads, mlp 256, ``seq_len`` 64 (132,352 parameters); 160
rows a step; ``--mesh=1x1``; every worker an emulated host of ``host_row_s`` a row and no fixed
cost (`hetjax.emulation.build_host` with a given cost), padded by sleep to it times its
slowdown.

* **shares**: ``--slowdown=static:1,1,1,3``, ``--policy=uniform`` then ``--policy=lbbsp``, the
  same seed and compilation cache, no evaluation (steady throughput counts the steps' hooks,
  and the final evaluation would land in the last step). ``tokens/s``: ``summary.json``'s
  ``steady_tokens_per_s`` (measured: the warm-up step and steps a compile held up left out).
  The balanced ideal is computed from the hosts' model: ``run.json``'s ``host_row_s`` (and
  ``host_fixed_s`` where recorded, else 0) and the trace's factors fᵢ, tokens a step /
  (fixed_s + X × row_s / Σ 1/fᵢ) = 160 × 64 / (160 × 10 ms / 3.33) = 21,333 tokens/s at 10 ms a
  row; 160 rows split 48, 48, 48, 16 balance exactly (whole rows, multiples of the automatic
  bucket, 2). Beside it, the *limit*: the ideal step plus the run's measured time outside
  compute (the mean iteration less the slowest host's busy time: batch, all-reduce, update),
  which no share policy removes. Losses: every step's, LB-BSP against uniform (shares change
  who computes which rows, never which rows form the batch).
* **goodput**: a uniform run on 4 equal emulated hosts (``static:1,1,1,1``, the same cost a
  row) with asynchronous checkpoints and the config's evaluation (every 100 steps and after
  the last, 2 batches), launched twice: first with an empty compilation cache (a job's first
  launch), then again in a fresh run directory with the cache the first filled (a relaunch,
  resume or restart of the job); `hetjax.report.goodput` of each run directory.

Goals: LB-BSP tokens/s ≥ 0.95 × the balanced ideal; LB-BSP's losses uniform's within 1e-5
relative; goodput ≥ 0.9. Telemetry also gives each run's overruns (worker-steps whose real
compute outran its host: the emulation did not hold), barrier idle fraction and mean
iteration. LB-BSP keeps shares whose predicted gain is within its dead band (10%,
`hetjax.balance`), so shares set from a noisy first step may stay a few percent off balance.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np

from experiments import _analysis, _harness
from hetjax import emulation, report

TRAIN = pathlib.Path(__file__).resolve().with_name('train.py')
ROOT = TRAIN.parents[1]
LAUNCH_WORKERS = 4
LAUNCH_MODEL = {'layers': 2, 'd_model': 64, 'heads': 4, 'mlp': 256, 'seq_len': 64}
# 160 rows: under static:1,1,1,3 the balanced shares 48, 48, 48, 16 are whole rows (and
# multiples of the automatic bucket, 2), so the continuous ideal is reachable exactly.
LAUNCH_BATCH = 160
SLOWDOWN = 'static:1,1,1,3'
EQUAL_HOSTS = 'static:1,1,1,1'
POLICIES = ('uniform', 'lbbsp')
GOAL_OF_IDEAL = 0.95
# Shares change who computes which rows, never which rows form the batch (hetjax's global
# batch depends on the step only), so the losses differ by float32 reduction order alone.
GOAL_LOSS_RTOL = 1e-5
GOAL_GOODPUT = 0.9
LAUNCH_TIMEOUT_S = 900


def _gpt_args(steps: int, workdir: pathlib.Path, host_row_s: float, *extra: str) -> list[str]:
  sets = [f'model.args.{k}={v}' for k, v in LAUNCH_MODEL.items()] + [
      f'global_batch={LAUNCH_BATCH}', f'host_row_s={host_row_s}']
  return ['--config=gpt', *[a for s in sets for a in ('--set', s)], '--mesh=1x1',
          '--mode=shares', f'--steps={steps}', f'--workdir={workdir}', '--overwrite', *extra]


def _launch_gpt(workdir: pathlib.Path, args: list[str], cache: pathlib.Path) -> float:
  """Runs ``experiments/train.py ARGS`` on `LAUNCH_WORKERS` local workers of one device each
  (``python -m hetjax.launch``), ``cache`` their compilation cache; returns the job's wall
  seconds. Its output goes to ``WORKDIR.log``.

  Raises:
    RuntimeError: the job failed or timed out (the message names the log).
  """
  command = [sys.executable, '-m', 'hetjax.launch', '--workers', str(LAUNCH_WORKERS),
             '--devices-per-worker', '1', '--timeout', str(LAUNCH_TIMEOUT_S), '--',
             sys.executable, str(TRAIN), *args]
  env = dict(os.environ, HETJAX_COMPILATION_CACHE=str(cache))
  log_path = workdir.with_name(workdir.name + '.log')
  start = time.perf_counter()
  with open(log_path, 'w') as log:
    try:
      result = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=LAUNCH_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
      raise RuntimeError(f'{workdir.name}: timed out (see {log_path})') from None
  if result.returncode:
    raise RuntimeError(f'{workdir.name}: the launched job exited {result.returncode} '
                       f'(see {log_path})')
  return time.perf_counter() - start


def _losses(workdir: pathlib.Path) -> dict[int, float]:
  """Every step's loss in ``metrics.jsonl`` (steps whose loss was not recorded left out)."""
  rows = [json.loads(line) for line in (workdir / report.METRICS_FILE).read_text().splitlines()
          if line.strip()]
  return {int(r['step']): float(r['loss']) for r in rows
          if r.get('loss') is not None and math.isfinite(r['loss'])}


def _hosts(workdir: pathlib.Path) -> dict:
  """The emulated hosts' measured record: overruns (compute past the host's time) over all
  worker-steps, and over the steady steps (after the first, no compile waited for or beside)
  the mean iteration (the slowest worker's step), the mean time outside the slowest host's busy
  time (batch, all-reduce, update, dispatch: what no share policy balances away) and the
  workers' mean idle fraction at the barrier. Means, as steady throughput is total over total."""
  t = report.load_telemetry(workdir)
  busy = t.compute_s + t.dilation_s
  steady = np.ones(len(t.steps), bool)
  steady[0] = False
  steady &= (t.compile_s.max(axis=1) == 0) & t.sampled.all(axis=1)
  rows = np.flatnonzero(steady) if steady.any() else np.arange(len(t.steps))
  outside = t.step_s[rows].max(axis=1) - busy[rows].max(axis=1)
  late = t.overrun_s > 0
  return {'overruns': int(late.sum()), 'worker_steps': int(late.size),
          'max_overrun_s': float(t.overrun_s.max()),
          'outside_compute_s': float(outside.mean()),
          'idle_fraction': float((t.wait_s[rows] / t.step_s[rows]).mean()),
          'iteration_s': float(t.step_s[rows].max(axis=1).mean()),
          'last_shares': [int(x) for x in t.share[-1]]}


def _ideal(workdir: pathlib.Path) -> dict:
  """The balanced ideal of the run's hosts, computed from their model: ``run.json``'s
  ``host_row_s`` (``host_fixed_s`` where recorded; a given ``host_row_s`` has no fixed cost,
  `hetjax.emulation.build_host`) and `SLOWDOWN`'s factors: one step of perfectly balanced
  shares takes fixed_s + X × row_s / Σ 1/fᵢ (`experiments._analysis.balanced_time_s`), with no
  time outside compute."""
  info = json.loads((workdir / 'run.json').read_text())
  row_s, fixed_s = float(info['host_row_s']), float(info.get('host_fixed_s') or 0.0)
  factors = emulation.parse_trace(SLOWDOWN, LAUNCH_WORKERS).factors(0)
  step_s = _analysis.balanced_time_s(LAUNCH_BATCH, factors, row_s, fixed_s)
  return {'host_row_s': row_s, 'host_fixed_s': fixed_s, 'ideal_step_s': step_s,
          'ideal_tokens_per_s': LAUNCH_BATCH * LAUNCH_MODEL['seq_len'] / step_s}


def _shares_rows(root: pathlib.Path, steps: int, host_row_s: float) -> list[dict]:
  """Uniform and LB-BSP shares of one batch on the 4 hosts (`SLOWDOWN`), the same seed and
  one compilation cache (the second job loads what the first compiled: steady throughput
  leaves compiling steps out either way). No evaluation: the one after the last step would
  fall inside the last step's interval, which steady throughput counts (the config
  checkpoints every 100 steps, so only after the last one, outside the steps)."""
  rows = []
  with _harness.compilation_cache() as cache:
    for policy in POLICIES:
      workdir = root / f'shares_{policy}'
      wall = _launch_gpt(workdir, _gpt_args(
          steps, workdir, host_row_s, f'--policy={policy}', f'--slowdown={SLOWDOWN}', '--set',
          'eval.enabled=False'), cache)
      summary = json.loads((workdir / 'summary.json').read_text())
      info = json.loads((workdir / 'run.json').read_text())
      rows.append({
          'part': 'launched', 'run': 'shares', 'policy': policy,
          'policy_name': info['policy'], 'workers': LAUNCH_WORKERS,
          'slowdown': SLOWDOWN, 'global_batch': LAUNCH_BATCH,
          'seq_len': LAUNCH_MODEL['seq_len'], 'steps': steps,
          'tokens_per_s': float(summary['steady_tokens_per_s']),
          'steady_steps': summary['steady_steps'], 'final_loss': summary.get('final_loss'),
          'job_wall_s': wall, **_hosts(workdir), **_ideal(workdir),
          'losses': _losses(workdir)})
  uniform = rows[0]
  reference = dict(uniform['losses'])
  for r in rows:
    common = sorted(set(r['losses']) & set(reference))
    if not common:
      raise RuntimeError(f'{r["policy"]}: no step has a loss in both runs\' metrics.jsonl')
    mine = np.array([r['losses'][s] for s in common])
    ref = np.array([reference[s] for s in common])
    r['loss_steps_compared'] = len(common)
    r['loss_max_rel_diff_vs_uniform'] = float(np.max(np.abs(mine - ref) / np.abs(ref)))
    r['uniform_tokens_per_s'] = uniform['tokens_per_s']
    r['speedup_vs_uniform'] = r['tokens_per_s'] / uniform['tokens_per_s']
    r['ratio_of_ideal'] = r['tokens_per_s'] / r['ideal_tokens_per_s']
    # The ideal plus this run's measured time outside compute, which balancing cannot remove:
    # what is left of the gap to it is the shares' imbalance (and the hosts' overruns).
    r['limit_tokens_per_s'] = LAUNCH_BATCH * LAUNCH_MODEL['seq_len'] / (
        r['ideal_step_s'] + r['outside_compute_s'])
    r['ratio_of_limit'] = r['tokens_per_s'] / r['limit_tokens_per_s']
    r['losses'] = [r['losses'][s] for s in common]
    r['measured'] = ['tokens_per_s', 'loss_max_rel_diff_vs_uniform', 'overruns',
                     'outside_compute_s', 'idle_fraction', 'iteration_s', 'last_shares',
                     'job_wall_s']
    r['computed_from_host_model'] = ['ideal_step_s', 'ideal_tokens_per_s', 'ratio_of_ideal',
                                     'limit_tokens_per_s (with the measured outside time)',
                                     'ratio_of_limit']
  return rows


def goodput_rows(root: pathlib.Path, steps: int, every: int, host_row_s: float) -> list[dict]:
  """One uniform run of ``steps`` on 4 equal emulated hosts (`EQUAL_HOSTS`, the same cost per
  row) with asynchronous checkpoints every ``every`` steps and the config's evaluation, twice:
  a job's first launch (an empty compilation cache) and the same job launched again in a fresh
  run directory with the cache the first one filled (what a relaunch, a resume or an elastic
  restart of a job finds); `hetjax.report.goodput` of each."""
  rows = []
  with _harness.compilation_cache() as cache:
    for cache_state in ('cold', 'warm'):
      workdir = root / f'goodput_{cache_state}'
      wall = _launch_gpt(workdir, _gpt_args(
          steps, workdir, host_row_s, '--policy=uniform', f'--slowdown={EQUAL_HOSTS}', '--set',
          f'checkpoint.every={every}', '--set', 'checkpoint.asynchronous=True'), cache)
      rows.append(_goodput_row(workdir, steps, every, host_row_s, cache_state, wall))
  return rows


def _goodput_row(workdir: pathlib.Path, steps: int, every: int, host_row_s: float,
                 cache_state: str, wall: float) -> dict:
  g = report.goodput(workdir)
  summary = json.loads((workdir / 'summary.json').read_text())
  config = json.loads((workdir / 'config.json').read_text())
  badput = {k: v for k, v in g['badput_s'].items() if v is not None}
  return {'part': 'launched', 'run': 'goodput', 'policy': 'uniform', 'cache': cache_state,
          'workers': LAUNCH_WORKERS, 'slowdown': EQUAL_HOSTS, 'global_batch': LAUNCH_BATCH,
          'seq_len': LAUNCH_MODEL['seq_len'], 'steps': steps, 'host_row_s': host_row_s,
          'checkpoint_every': every, 'checkpoint_asynchronous': True,
          'eval_every': config['eval']['every'], 'eval_batches': config['eval']['batches'],
          'goodput': g['goodput'], 'wall_s': g['wall_s'], 'productive_s': g['productive_s'],
          'badput_s': g['badput_s'], 'largest_badput': max(badput, key=badput.get),
          'unrecorded': g['unrecorded'], 'tokens_per_s': summary.get('steady_tokens_per_s'),
          'job_wall_s': wall, 'productive_over_job_wall': g['productive_s'] / wall,
          'goodput_line': report.format_goodput(g), **_hosts(workdir),
          'measured': ['goodput', 'wall_s', 'productive_s', 'badput_s', 'tokens_per_s',
                       'job_wall_s (launch to exit, timed here)', 'productive_over_job_wall']}


def _launched_table(rows: list[dict]) -> str:
  head = (f'{"policy":<8} {"tok/s":>7} {"ideal":>7} {"of ideal":>8} {"of limit":>8} '
          f'{"vs unif":>7} '
          f'{"loss diff":>9} {"iter ms":>8} {"outside":>8} {"idle":>5} {"overruns":>9}  '
          f'last shares')
  lines = [head, '-' * len(head)]
  for r in rows:
    lines.append(
        f'{r["policy"]:<8} {r["tokens_per_s"]:>7.0f} {r["ideal_tokens_per_s"]:>7.0f} '
        f'{r["ratio_of_ideal"]:>8.3f} {r["ratio_of_limit"]:>8.3f} {r["speedup_vs_uniform"]:>7.2f} '
        f'{r["loss_max_rel_diff_vs_uniform"]:>9.1e} {1e3 * r["iteration_s"]:>8.1f} '
        f'{1e3 * r["outside_compute_s"]:>8.1f} {r["idle_fraction"]:>5.2f} '
        f'{r["overruns"]:>4}/{r["worker_steps"]:<4}  {r["last_shares"]}')
  r = rows[0]
  lines.append(
      f'gpt {LAUNCH_MODEL}, {LAUNCH_BATCH} rows x {LAUNCH_MODEL["seq_len"]} tokens a step, '
      f'{r["steps"]} steps, {LAUNCH_WORKERS} workers x 1 CPU device, mode shares, hosts '
      f'{SLOWDOWN} at {1e3 * r["host_row_s"]:g} ms/row + {1e3 * r["host_fixed_s"]:g} ms/step. '
      'Measured: tok/s (summary.json steady_tokens_per_s), loss diff (per step, vs uniform), '
      'iter (mean slowest step), outside (mean iteration less the slowest host\'s busy '
      'time), idle (barrier wait / step), overruns (worker-steps whose compute outran the '
      'host). Computed from the host model (run.json host_row_s, the trace\'s factors): ideal '
      '= tokens a step / (fixed_s + X x row_s / sum 1/f_i), and "of ideal"; "of limit": over '
      'the ideal step plus the run\'s measured outside time')
  return '\n'.join(lines[:-1] + textwrap.wrap(lines[-1], 100))


def _launched_goals(shares: list[dict], goods: list[dict]) -> list[str]:
  lines = []
  lb = next((r for r in shares if r['policy'] == 'lbbsp'), None)
  if lb is not None:
    met = 'met' if lb['ratio_of_ideal'] >= GOAL_OF_IDEAL else 'not met'
    lines.append(f'goal: LB-BSP tokens/s >= {GOAL_OF_IDEAL} x balanced ideal: {met} '
                 f'({lb["tokens_per_s"]:.0f} / {lb["ideal_tokens_per_s"]:.0f} = '
                 f'{lb["ratio_of_ideal"]:.3f}; uniform {lb["uniform_tokens_per_s"]:.0f}, '
                 f'LB-BSP {lb["speedup_vs_uniform"]:.2f}x it)')
    met = 'met' if lb['loss_max_rel_diff_vs_uniform'] <= GOAL_LOSS_RTOL else 'not met'
    lines.append(f'goal: LB-BSP losses = uniform\'s within {GOAL_LOSS_RTOL:g} relative: {met} '
                 f'(max {lb["loss_max_rel_diff_vs_uniform"]:.1e} over '
                 f'{lb["loss_steps_compared"]} steps)')
  for good in goods:
    met = 'met' if (good['goodput'] or 0) >= GOAL_GOODPUT else 'not met'
    lines.append(f'goal: goodput >= {GOAL_GOODPUT} ({good["steps"]} steps, asynchronous '
                 f'checkpoints every {good["checkpoint_every"]}, eval every '
                 f'{good["eval_every"]}, {good["cache"]} compilation cache): {met} '
                 f'({good["goodput"]}; largest badput {good["largest_badput"]})')
    lines.append(good['goodput_line'])
    # goodput's wall starts when run.train is called (run.json's started_unix_s): the
    # processes' start and JAX's import and initialisation come before it.
    lines.append(f'goodput run ({good["cache"]}): job {good["job_wall_s"]:.1f} s from launch to '
                 f'exit (goodput\'s wall {good["wall_s"]:.1f} s); productive / job wall '
                 f'{good["productive_over_job_wall"]:.3f}; overruns {good["overruns"]}/'
                 f'{good["worker_steps"]} worker-steps, idle {good["idle_fraction"]:.3f}')
  return lines


def run_launched(root: pathlib.Path, steps: int, goodput_steps: int, every: int,
                 host_row_s: float, goodput: bool = True) -> list[dict]:
  """The launched part under ``root``: the shares runs (printed as a table) and (``goodput``)
  the goodput runs, with the goals' verdicts; returns their rows."""
  shares = _shares_rows(root, steps, host_row_s)
  print(_launched_table(shares), flush=True)
  goods = goodput_rows(root, goodput_steps, every, host_row_s) if goodput else []
  for line in _launched_goals(shares, goods):
    print(line, flush=True)
  return [*shares, *goods]
