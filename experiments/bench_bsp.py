r"""Uniform BSP under a straggler: measured on local workers, and on the virtual clock at scale.

One real job of `experiments/_bsp_worker.py` under `hetjax.launch` (4 workers, one device each,
an MLP whose per-worker gradient takes tens of ms) alternating blocks of two scenarios, so both
see the same machine state. Every worker runs as a host of known speed
(`hetjax.emulation.KnownSpeedHost`: each step padded by sleep to the time a host of the job's
calibrated per-row cost takes, times its slowdown): ``none`` (every host at its base speed; it
calibrates the virtual clock) and ``static`` (worker 3's host 3x slower). For each it reports
the measured iteration time (mean over steps of the slowest worker's step), each worker's idle
fraction (waiting at the barrier / step time), the balanced limit X / Σ vᵢ + sync, where
vᵢ = shareᵢ / busyᵢ is the measured speed (busy: compute plus the host's padding) and sync the
measured communication and batch preparation, and their ratio: the gap that load balancing can
close. How often a real compute ran past its host's time (an overrun) is printed as well.

The virtual clock is calibrated on the ``none`` run only (per-worker busy seconds per sample and
their step-to-step coefficient of variation, the all-reduce α and β fitted by
`hetjax.runtime.fit_allreduce`, the rest of a step as host time)
and then predicts the ``static`` run (the agreement check, goal within 15%) and the same
scenario at 64 and 1024 workers (one worker at 3x, 1024 rows per worker).

  .venv/bin/python experiments/bench_bsp.py --quick --json runs/bench_bsp.json
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
SCENARIOS = {'none': 'none', 'static': 'static:1,1,1,3'}
SCALE = (64, 1024)
AGREEMENT_GOAL = 0.15

_QUICK = flags.DEFINE_bool('quick', False, '15 measured steps per run instead of 40')
_STEPS = flags.DEFINE_integer('steps', None, 'steps per measured run (default 40, quick 15)')
_SKIP = flags.DEFINE_integer('skip', 3, 'first steps left out of every mean (compilation)')
_JSON = flags.DEFINE_string('json', None, 'write the rows as JSON here')
_KEEP = flags.DEFINE_string('keep', None, 'keep the run directories under this directory')


BLOCK = 5  # steps per scenario block; the scenarios alternate block by block in one job


def _launch(out: pathlib.Path, steps: int) -> dict:
  return launch_workers(out, '_bsp_worker.py', [steps, BLOCK], WORKERS, timeout=600)


def _measured(run_dir: pathlib.Path, skip: int, scenario: str) -> dict:
  t = load_telemetry(run_dir)
  index = {s: i for i, s in enumerate(t.steps)}
  blocks = json.loads((run_dir / 'schedule.json').read_text())
  keep = [index[s] for b in blocks if b['scenario'] == scenario
          for s in range(b['first_step'], b['last_step'] + 1) if s > skip]
  share = t.share[keep]
  busy = t.compute_s[keep] + t.dilation_s[keep]  # the host's time: compute and padding
  iteration = t.step_s[keep].max(axis=1)
  sync = t.comm_s[keep][:, 0] + t.data_s[keep].mean(axis=1)
  speeds = share.sum(axis=0) / busy.sum(axis=0)
  limit = share.sum(axis=1).mean() / speeds.sum() + sync.mean()
  return {
      'iter_time_s': float(iteration.mean()),
      'balanced_limit_s': float(limit),
      'idle_fraction': [float(x) for x in (t.wait_s[keep] / t.step_s[keep]).mean(axis=0)],
      'per_sample_s': [float(x) for x in (busy / share).mean(axis=0)],
      'noise_cv': float((busy.std(axis=0) / busy.mean(axis=0)).mean()),
      'host_s': float((iteration - busy.max(axis=1)).mean()),
  }


def _cost(calibration: dict, run: dict, workers: int | None = None) -> simulation.ClockCosts:
  fit = run['allreduce']
  per_sample = tuple(calibration['per_sample_s'])
  if workers is not None:
    per_sample = float(np.mean(per_sample))
  allreduce = simulation.ClockCosts(1.0, alpha_s=fit['alpha_s'],
                                 beta_bytes_per_s=fit['beta_bytes_per_s'],
                                 grad_bytes=run['grad_bytes']).allreduce_s(WORKERS)
  return simulation.ClockCosts(
      per_sample, alpha_s=fit['alpha_s'], beta_bytes_per_s=fit['beta_bytes_per_s'],
      grad_bytes=run['grad_bytes'], host_s=max(calibration['host_s'] - allreduce, 0.0))


def _virtual(cost: simulation.ClockCosts, workers: int, rows_per_worker: int, steps: int,
             noise_cv: float) -> dict:
  factors = (1.0,) * (workers - 1) + (3.0,)
  batch = rows_per_worker * workers
  uniform = balance.Uniform(balance.ShareRules(batch, workers))
  v = simulation.simulate_shares(uniform, emulation.StaticTrace(factors), cost, batch, steps,
                       noise_cv=noise_cv)
  idle = v.idle_fraction.mean(axis=0)
  return {'iter_time_s': v.mean_iter_s(), 'balanced_limit_s': v.mean_balanced_limit_s(),
          'idle_fraction': [float(idle[:-1].mean())] * (workers - 1) + [float(idle[-1])]}


def _row(scenario: str, workers: int, source: str, r: dict) -> dict:
  return {'scenario': scenario, 'workers': workers, 'source': source,
          'iter_time_s': r['iter_time_s'], 'balanced_limit_s': r['balanced_limit_s'],
          'ratio_to_limit': r['iter_time_s'] / r['balanced_limit_s'],
          'idle_fraction_max': max(r['idle_fraction']), 'idle_fraction': r['idle_fraction']}


def run(steps: int, skip: int, root: pathlib.Path) -> list[dict]:
  info = _launch(root, steps)
  runs = {name: info for name in SCENARIOS}
  measured = {name: _measured(root, skip, name) for name in SCENARIOS}
  rows = [_row(name, WORKERS, 'measured', measured[name]) for name in SCENARIOS]
  rows_per_worker = info['global_batch'] // WORKERS
  print(host_line(root, info), flush=True)
  noise = measured['none']['noise_cv']  # step-to-step jitter of the hosts' busy time
  predicted = _virtual(_cost(measured['none'], runs['none']), WORKERS, rows_per_worker, steps,
                       noise)
  agreement = abs(predicted['iter_time_s'] / measured['static']['iter_time_s'] - 1)
  rows.append(_row('static', WORKERS, 'virtual', predicted) | {'agreement': agreement})
  for n in SCALE:
    rows.append(_row('static', n, 'virtual',
                     _virtual(_cost(measured['none'], runs['none'], n), n, rows_per_worker, steps,
                              noise)))
  return rows


def _table(rows: list[dict]) -> str:
  head = (f'{"scenario":<9}{"workers":>8}  {"source":<9}{"iter ms":>9}{"limit ms":>10}'
          f'{"ratio":>7}{"max idle":>10}  idle per worker')
  lines = [head, '-' * len(head)]
  for r in rows:
    idle = ' '.join(f'{x:.2f}' for x in r['idle_fraction'][:4]) + (' …' if r['workers'] > 4 else '')
    lines.append(f'{r["scenario"]:<9}{r["workers"]:>8}  {r["source"]:<9}'
                 f'{1e3 * r["iter_time_s"]:>9.1f}{1e3 * r["balanced_limit_s"]:>10.1f}'
                 f'{r["ratio_to_limit"]:>7.2f}{r["idle_fraction_max"]:>10.2f}  {idle}')
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    print(f'bench_bsp: error: unexpected arguments {argv[1:]}', file=sys.stderr)
    sys.exit(2)
  steps = _STEPS.value or (15 if _QUICK.value else 40)
  if steps <= _SKIP.value + 2 or _SKIP.value < 0:
    print(f'bench_bsp: error: --steps {steps} must exceed --skip {_SKIP.value} + 2', file=sys.stderr)
    sys.exit(2)
  start = time.perf_counter()
  try:
    if _KEEP.value:
      rows = run(steps, _SKIP.value, pathlib.Path(_KEEP.value))
    else:
      with tempfile.TemporaryDirectory() as tmp:
        rows = run(steps, _SKIP.value, pathlib.Path(tmp))
  except (ConfigError, RuntimeError) as e:
    print(f'bench_bsp: error: {e}', file=sys.stderr)
    sys.exit(1)
  print(_table(rows))
  check = next(r for r in rows if 'agreement' in r)
  print(f'virtual vs measured (static, {WORKERS} workers): {100 * check["agreement"]:.1f}% apart '
        f'(goal ≤ {100 * AGREEMENT_GOAL:.0f}%); {time.perf_counter() - start:.0f} s; '
        f'{steps} steps per run, first {_SKIP.value} skipped')
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(rows, indent=2) + '\n')


if __name__ == '__main__':
  app.run(main)
