r"""Scheduled model parallelism (SchMP) against its parallel baselines, per app and worker count.

Part 1, virtual devices (P ∈ {1, 2, 4, 8} CPU devices of this process; `experiments/_schmp_bench`):
Lasso on two correlated designs and L1 logistic regression, SchMP's dynamic schedule (32 slots)
against Shotgun (P coordinates a round; and with 32 slots at the largest P), to the
scikit-learn optimum + 1e-3 relative; LDA (standard-library docstrings) and MF (Zipf ratings),
SchMP's static rotation against unscheduled parallel Gibbs / bulk-synchronous SGD-MF, the same
sweeps each, to the worse run's best + 1e-3 relative. Part 2, launched workers
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

  .venv/bin/python experiments/bench_schmp.py --quick --json runs/bench_schmp.json
"""

from __future__ import annotations

import pathlib
import sys
import time

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import flags

from experiments import _harness, _schmp_bench, _schmp_launched
from hetjax import ConfigError

FLAGS = _harness.define_flags('small data and few sweeps: under 5 minutes')
_WORKERS = flags.DEFINE_list('workers', ['1', '2', '4', '8'], 'virtual device counts P')
_APPS = flags.DEFINE_list('apps', ['lasso', 'logreg', 'lda', 'mf'], 'the apps to run')
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


def _fmt(value, spec='') -> str:
  return '—' if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
  head = (f'{"app":<7}{"design":<15}{"scheduler":<12}{"slots":>5}{"P":>3}  {"shares":<9}'
          f'{"rounds":>7}{"time s":>8}{"final":>13}{"reference":>13}{"div":>5}')
  lines = [head, '-' * len(head)]
  for r in rows:
    lines.append(f'{r["app"]:<7}{r["design"]:<15}{r["scheduler"]:<12}{r["schedule_size"]:>5}'
                 f'{r["workers"]:>3}  {r.get("shares", "—"):<9}'
                 f'{_fmt(r["rounds_to_target"]):>7}{_fmt(r["time_to_target_s"], ".2f"):>8}'
                 f'{_fmt(r["final_objective"], ".6g"):>13}'
                 f'{_fmt(r["reference_objective"], ".6g"):>13}{"yes" if r["diverged"] else "":>5}')
  return '\n'.join(lines)


def goals(rows: list[dict]) -> list[str]:
  """One line per goal and worker count: met or not, with the numbers."""
  lines = []
  virtual = [r for r in rows if r['source'] == _schmp_bench.SOURCE]

  def pick(app, design, scheduler, p, size=None):
    return next((r for r in virtual if (r['app'], r['design'], r['scheduler'], r['workers']) ==
                 (app, design, scheduler, p) and (size is None or r['schedule_size'] == size)),
                None)

  for app, design in sorted({(r['app'], r['design']) for r in virtual
                             if r['app'] in ('lasso', 'logreg')}):
    for p in sorted({r['workers'] for r in virtual}):
      s, g = pick(app, design, 'schmp', p), pick(app, design, 'shotgun', p, size=p)
      if not s or not g:
        continue
      if g['diverged']:
        verdict = 'met' if s['rounds_to_target'] else 'NOT met'
        text = f'Shotgun diverged; SchMP converged: {verdict}'
      elif s['rounds_to_target'] is None:
        text = 'SchMP did not reach the target: NOT met'
      elif g['rounds_to_target'] is None:
        bound = g['rounds_run'] / s['rounds_to_target']
        text = f'Shotgun not there after {g["rounds_run"]} rounds: ≥ {bound:.1f}x fewer, met'
      else:
        ratio = g['rounds_to_target'] / s['rounds_to_target']
        text = f'{ratio:.2f}x fewer rounds: {"met" if ratio >= 2 else "NOT met"}'
      gap = (None if s['final_objective'] is None else
             s['final_objective'] / s['reference_objective'] - 1)
      lines.append(f'{app} {design} P={p}: {text}; SchMP vs scikit-learn {_fmt(gap, ".1e")}')
  for app, design in sorted({(r['app'], r['design']) for r in virtual
                             if r['app'] in ('lda', 'mf')}):
    for p in sorted({r['workers'] for r in virtual if r['app'] == app}):
      s, b = pick(app, design, 'schmp', p), pick(app, design, 'unscheduled', p)
      if not s or not b:
        continue
      st, bt = s['time_to_target_s'], b['time_to_target_s']
      if p == 1:  # one block, one device: the rotation and the baseline are one computation
        lines.append(f'{app} {design} P=1: the same computation ({_fmt(st, ".2f")} s vs '
                     f'{_fmt(bt, ".2f")} s): no goal')
        continue
      faster = st is not None and (bt is None or st <= bt)
      no_worse = (s['final_objective'] or float('inf')) <= (b['final_objective'] or float('inf'))
      lines.append(f'{app} {design} P={p}: to target {_fmt(st, ".2f")} s vs {_fmt(bt, ".2f")} s '
                   f'({"met" if faster else "NOT met"}), ends {s["final_objective"]:.5g} vs '
                   f'{b["final_objective"]:.5g} ({"no worse" if no_worse else "worse"})')
  return lines


def main() -> None:
  quick = FLAGS.quick.value
  workers = _workers()
  rows: list[dict] = []
  start = time.perf_counter()
  apps = set(_APPS.value)
  unknown = apps - {'lasso', 'logreg', 'lda', 'mf'}
  if unknown:
    raise ConfigError(f'unknown --apps {",".join(sorted(unknown))}; choose from lasso, logreg, '
                      'lda, mf')
  designs = [d for d in _schmp_bench.designs(quick) if d.app in apps]
  statics = [s for s in _schmp_bench.statics(quick) if s.app in apps]
  for design in designs:
    rows += _schmp_bench.coordinate_rows(design, workers, with_wide_shotgun=True)
    print(f'{design.app} {design.name}: done at {time.perf_counter() - start:.0f} s', flush=True)
  for static in statics:
    rows += _schmp_bench.static_rows(static, workers, repeats=2)
    print(f'{static.app}: done at {time.perf_counter() - start:.0f} s', flush=True)
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
