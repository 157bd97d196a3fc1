r"""Scheduled model parallelism (SchMP) against its parallel baselines, per app and worker count.

Part 1, virtual devices (P ∈ {1, 2, 4, 8} CPU devices of this process; `experiments/_schmp_bench`):
Lasso on two correlated designs, L1 logistic regression and the linear SVM (dual coordinate
descent: its coordinates are examples), SchMP's dynamic schedule (32 slots) against Shotgun (P
coordinates a round; and with 32 slots at the largest P), to the scikit-learn optimum + 1e-3
relative (LinearSVC's objective for the SVM); LDA (standard-library docstrings) and MF (Zipf ratings),
SchMP's static rotation against unscheduled parallel Gibbs / bulk-synchronous SGD-MF, the same
sweeps each, to the worse run's best + 1e-3 relative (LDA also against ``unscheduled-rounds``,
unscheduled Gibbs merged every 1/P sweep, as often as SchMP syncs: the stronger baseline); CD-MF (CCD++) beside SGD-MF on P = 4, on
the same data and start, both reporting the regularised loss. Part 2, launched workers
(`experiments/_schmp_launched`): 4 workers under `hetjax.launch`, one device each, on hosts of
known speed with one 3× slow (``static:1,1,1,3``): LDA and MF with equal blocks, with blocks
sized by the hosts' speeds, and the baseline; Lasso with SchMP and Shotgun for the rounds SchMP
needed on 4 virtual devices (+ 20 %).

Every time is measured (wall time; on the launched part, of rounds padded to the emulated hosts'
times). Rows: ``app``, ``design``, ``scheduler``, ``schedule_size``, ``workers``, ``source``,
``rounds_to_target``, ``time_to_target_s`` (None: not reached), ``rounds_run``,
``final_objective``, ``reference_objective`` (scikit-learn's, where one exists), ``target``,
``diverged``; launched rows add ``shares`` and ``hosts``.

Goals: SchMP-Lasso reaches the target in ≥ 2× fewer rounds than Shotgun at the same P on
correlated data and converges at every P where Shotgun diverges, its solution within 1e-3 of
scikit-learn's; SchMP-LDA reaches the target in less time than unscheduled Gibbs and ends no
worse; SchMP-MF reaches the target RMSE no later than unscheduled SGD-MF.

  .venv/bin/python -m experiments.bench_schmp --quick --json runs/bench_schmp.json
"""

from __future__ import annotations

import pathlib
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

from absl import flags

from experiments import _harness, _schmp_bench, _schmp_launched
from experiments._schmp_report import goals, table
from hetjax import ConfigError

FLAGS = _harness.define_flags('small data and few sweeps: under 5 minutes')
_WORKERS = flags.DEFINE_list('workers', ['1', '2', '4', '8'], 'virtual device counts P')
APPS = ('lasso', 'logreg', 'svm', 'lda', 'mf', 'cdmf')
_APPS = flags.DEFINE_list('apps', list(APPS), 'the apps to run (cdmf: CD-MF beside SGD-MF)')
_LAUNCHED = flags.DEFINE_bool('launched', True, 'also run part 2 on launched workers')
_TIMEOUT = flags.DEFINE_float('timeout', 600, 'seconds before a launched job is stopped')


def _workers() -> list[int]:
  try:
    workers = sorted({int(w) for w in _WORKERS.value})
  except ValueError:
    raise ConfigError(f'--workers must be integers, got {",".join(_WORKERS.value)}') from None
  import jax
  if not workers or workers[0] < 1 or workers[-1] > jax.device_count():
    raise ConfigError(f'--workers must be in 1..{jax.device_count()} (the virtual devices), '
                      f'got {",".join(_WORKERS.value)}')
  return workers


def main() -> None:
  quick = FLAGS.quick.value
  workers = _workers()
  rows: list[dict] = []
  start = time.perf_counter()
  apps = set(_APPS.value)
  unknown = apps - set(APPS)
  if unknown:
    raise ConfigError(f'unknown --apps {",".join(sorted(unknown))}; choose from '
                      f'{", ".join(APPS)}')
  designs = [d for d in _schmp_bench.designs(quick) if d.app in apps]
  statics = [s for s in _schmp_bench.statics(quick) if s.app in apps]
  for design in designs:
    rows += _schmp_bench.coordinate_rows(design, workers, with_wide_shotgun=True)
    print(f'{design.app} {design.name}: done at {time.perf_counter() - start:.0f} s', flush=True)
  for static in statics:
    rows += _schmp_bench.static_rows(static, workers, repeats=2)
    print(f'{static.app}: done at {time.perf_counter() - start:.0f} s', flush=True)
  if 'cdmf' in apps:
    for pair in _schmp_bench.mf_pairs(quick):
      if pair.workers in workers:
        rows += _schmp_bench.mf_pair_rows(pair)
    print(f'cdmf: done at {time.perf_counter() - start:.0f} s', flush=True)
  if _LAUNCHED.value:
    with _harness.run_directory(FLAGS.keep.value) as root:
      for static in {s.app: s for s in reversed(statics)}.values():  # each app's first
        rows += _schmp_launched.static_rows(static, root, _TIMEOUT.value,
                                            repeats=1 if quick else 2)
        print(f'{static.app} launched: done at {time.perf_counter() - start:.0f} s', flush=True)
      if not quick and designs and designs[0].app == 'lasso':
        design = designs[0]
        needed = next(r['rounds_to_target'] for r in rows if r['app'] == design.app and
                      r['design'] == design.name and r['scheduler'] == 'schmp' and
                      r['workers'] == max(w for w in workers if w <= 4))
        rounds = int(1.2 * (needed or design.rounds)) // 10 * 10
        rows += _schmp_launched.coordinate_rows(design, rounds, root, _TIMEOUT.value)
  print(table(rows))
  print('\n'.join(goals(rows)))
  print(f'total {time.perf_counter() - start:.0f} s')
  _harness.finish(rows, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_schmp.py', main, cpu_devices=8)
