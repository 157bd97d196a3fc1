r"""Uniform BSP under a straggler: measured on local workers, and on the virtual clock at scale.

One real job of `experiments/_bsp_worker.py` under `hetjax.launch` (4 workers, one device each,
an MLP whose per-worker gradient takes tens of ms) alternating blocks of two scenarios, so both
see the same machine state. Every worker runs as a host of known speed
(`hetjax.emulation.KnownSpeedHost`: each step padded by sleep to the time a host of the job's
calibrated per-row cost takes, times its slowdown): ``none`` (every host at its base speed; it
calibrates the virtual clock) and ``static`` (worker 3's host 3x slower). For each it reports
the measured iteration time (mean over steps of the slowest worker's step), each worker's idle
fraction (waiting at the barrier / step time), the balanced limit (the time at which hosts of
the calibrated ``fixed_s + rows × row_s``, each at its measured slowdown busy / that cost, would
cover the batch, fixed costs included, plus the step's measured time outside compute:
`experiments._harness.JobRun.limit_s`), and their ratio: the gap that load balancing can close.
How often a real compute ran past its host's time (an overrun) is printed as well. Rows say
``measured`` (telemetry) or ``virtual`` (modelled).

The virtual clock is the hosts' calibrated ``fixed_s + rows × row_s`` (circular: it agrees with
the hosts by construction, so the agreement checks the collectives and the step model, not the
calibration), with the busy time's step-to-step coefficient of variation, the all-reduce α and
β fitted by `hetjax.runtime.fit_allreduce`, and the rest of a step as host time measured on the
``none`` steps (`experiments._harness.host_costs`); it predicts the ``static`` run (the
agreement check, goal within 15%) and the same scenario at 64 and 1024 workers (one worker at
3x, 1024 rows per worker).

  .venv/bin/python -m experiments.bench_bsp --quick --json runs/bench_bsp.json
"""

from __future__ import annotations

import pathlib
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

from absl import flags

from experiments import _harness
from experiments._bench_launch import launch_workers
from hetjax import ConfigError, balance, core, emulation, simulation

WORKERS = 4
SCENARIOS = {'none': 'none', 'static': 'static:1,1,1,3'}
SCALE = (64, 1024)
AGREEMENT_GOAL = 0.15
BLOCK = 5  # steps per scenario block; the scenarios alternate block by block in one job

FLAGS = _harness.define_flags('15 measured steps per run instead of 40')
_STEPS = flags.DEFINE_integer('steps', None, 'steps per measured run (default 40, quick 15)')
_SKIP = flags.DEFINE_integer('skip', 3, 'first steps left out of every mean (compilation)')


def _launch(out: pathlib.Path, steps: int) -> dict:
  return launch_workers(out, '_bsp_worker', [steps, BLOCK], WORKERS, timeout=600)


def measured(job: _harness.JobRun, skip: int, scenario: str) -> dict:
  """A scenario's measured means over its steps after the first ``skip`` of the job."""
  keep = job.rows(scenario, key='scenario', after_step=skip)
  busy = job.busy_s(keep)  # the host's time: compute and padding
  iteration = job.iteration_s(keep)
  return {
      'iter_time_s': float(iteration.mean()),
      'balanced_limit_s': float(job.limit_s(keep).mean()),
      'idle_fraction': [float(x) for x in job.idle_fraction(keep).mean(axis=0)],
      'noise_cv': float((busy.std(axis=0) / busy.mean(axis=0)).mean()),
  }


def _virtual(cost: simulation.ClockCosts, workers: int, rows_per_worker: int, steps: int,
             noise_cv: float) -> dict:
  factors = (1.0,) * (workers - 1) + (3.0,)
  batch = rows_per_worker * workers
  uniform = balance.Uniform(core.ShareRules(batch, workers))
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
  job = _harness.JobRun.load(root)
  means = {name: measured(job, skip, name) for name in SCENARIOS}
  rows = [_row(name, WORKERS, 'measured', means[name]) for name in SCENARIOS]
  rows_per_worker = info['global_batch'] // WORKERS
  print(job.host_line(), flush=True)
  noise = means['none']['noise_cv']  # step-to-step jitter of the hosts' busy time
  cost = _harness.host_costs(job, job.rows('none', key='scenario', after_step=skip))
  predicted = _virtual(cost, WORKERS, rows_per_worker, steps, noise)
  agreement = abs(predicted['iter_time_s'] / means['static']['iter_time_s'] - 1)
  rows.append(_row('static', WORKERS, 'virtual', predicted) | {'agreement': agreement})
  for n in SCALE:
    rows.append(_row('static', n, 'virtual',
                     _virtual(cost, n, rows_per_worker, steps, noise)))
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


def main() -> None:
  steps = _STEPS.value or (15 if FLAGS.quick.value else 40)
  if steps <= _SKIP.value + 2 or _SKIP.value < 0:
    raise ConfigError(f'--steps {steps} must exceed --skip {_SKIP.value} + 2')
  start = time.perf_counter()
  with _harness.run_directory(FLAGS.keep.value) as root:
    rows = run(steps, _SKIP.value, root)
  print(_table(rows))
  check = next(r for r in rows if 'agreement' in r)
  print(f'virtual vs measured (static, {WORKERS} workers): {100 * check["agreement"]:.1f}% apart '
        f'(goal ≤ {100 * AGREEMENT_GOAL:.0f}%; circular: the virtual clock is calibrated on the '
        f'same hosts); {time.perf_counter() - start:.0f} s; {steps} steps per run, first '
        f'{_SKIP.value} skipped')
  _harness.finish(rows, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_bsp.py', main)
