"""bench_schmp's launched part: each app run by `experiments/schmp.py` under `hetjax.launch` on
4 workers (one device each) on hosts of known speed, one of them 3× slow
(``static:1,1,1,3``), and its rows from the chief's ``metrics.jsonl``.

A round on a host of known speed is padded by sleep to the host's time for the worker's real
work that round (its rows; MF's ratings and LDA's tokens through the apps' ``round_work``), so
a round lasts as long as its slowest worker's work. The static apps run three ways: SchMP with
equal blocks, SchMP with blocks sized by the hosts' speeds (``row_shares`` / ``doc_shares``:
`shares_by_work` splits the users or documents so that each worker's ratings or tokens follow
its speed, the split a share policy gives for those speeds — the speeds are the emulated
hosts' known ones), and the unscheduled baseline with equal blocks. Times are the chief's
``returned_s`` (measured wall time on the emulated hosts).
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Sequence

import numpy as np

from experiments import _analysis, _schmp_bench
from experiments._schmp_runs import DIVERGED
from hetjax import runtime
from hetjax.core import ShareRules
from hetjax.schmp import make_app

SOURCE = 'launched workers, hosts of known speed (measured)'
HOSTS = 'static:1,1,1,3'
WORKERS = 4
ROOT = pathlib.Path(__file__).resolve().parents[1]


def shares_by_work(work: np.ndarray, weights: Sequence[float]) -> tuple[int, ...]:
  """Contiguous counts of ``work``'s units (users, documents), one per worker, each worker's
  total work as close as the units allow to the split `ShareRules.from_weights` gives the
  total for ``weights``; at least one unit each.

  Example::

    >>> shares_by_work(np.ones(10), [1, 1, 3])
    (2, 2, 6)
  """
  work = np.asarray(work, np.float64)
  total = round(float(work.sum()))
  target = ShareRules(total, len(weights)).from_weights(weights).values
  cuts = np.searchsorted(np.cumsum(work), np.cumsum(target)[:-1], side='left') + 1
  k, n = len(weights), len(work)
  for i in range(k - 1):  # strictly increasing, room for one unit each after
    low = cuts[i - 1] + 1 if i else 1
    cuts[i] = min(max(cuts[i], low), n - (k - 1 - i))
  edges = np.concatenate([[0], cuts, [n]])
  return tuple(int(n) for n in np.diff(edges))


def _speeds() -> list[float]:
  return [1.0 / float(s) for s in HOSTS.split(':')[1].split(',')]


def _by_speed(static: _schmp_bench.Static) -> tuple[str, list[int]]:
  """The static app's shares argument with blocks following the hosts' speeds."""
  app = make_app(static.app, scheduler='schmp', devices=WORKERS, **static.args)
  if static.app == 'mf':
    work = np.bincount(app.ratings.user, minlength=app.ratings.users)
    return 'row_shares', list(shares_by_work(work, _speeds()))
  return 'doc_shares', list(shares_by_work(app.corpus.lengths, _speeds()))


def _launch(out: pathlib.Path, app: str, steps: int, sets: dict, timeout: float) -> list[dict]:
  """Runs schmp.py on the workers; the chief's metrics rows."""
  command = [sys.executable, str(ROOT / 'experiments' / 'schmp.py'), f'--app={app}',
             f'--workdir={out}', f'--steps={steps}', '--overwrite']
  for key, value in sets.items():
    command += ['--set', f'{key}={value!r}']
  out.parent.mkdir(parents=True, exist_ok=True)
  with open(out.parent / f'{out.name}.log', 'w') as log:
    result = runtime.launch_local(command, WORKERS, slowdown=HOSTS, timeout=timeout,
                                  init_timeout=120, stdout=log)
  if result.returncode:
    raise RuntimeError(f'{app} job {out.name}: {result.cause} (see {out.parent / out.name}.log)')
  return [json.loads(line) for line in (out / 'metrics.jsonl').read_text().splitlines()]


def _row(app, design, scheduler, shares, size, metrics, every, target, reference):
  values = [(r['step'], r['loss'], r['returned_s']) for r in metrics if r['loss'] is not None]
  hit = next(((s, t) for s, v, t in values if v <= target), (None, None))
  final = metrics[-1]['loss']  # the last round is always evaluated: null if not finite
  diverged = final is None or not values or final > DIVERGED * abs(values[0][1])
  return {'app': app, 'design': design, 'scheduler': scheduler, 'shares': shares,
          'schedule_size': size, 'workers': WORKERS, 'source': SOURCE, 'hosts': HOSTS,
          'rounds_to_target': hit[0], 'time_to_target_s': hit[1],
          'rounds_run': metrics[-1]['step'], 'objective_every': every,
          'final_objective': final, 'reference_objective': reference, 'target': target,
          'diverged': diverged}


def static_rows(static: _schmp_bench.Static, root: pathlib.Path, timeout: float,
                repeats: int = 1) -> list[dict]:
  """SchMP equal, SchMP by speed and the baseline on the launched workers (module docstring),
  each job ``repeats`` times, the order rotating by one each time; times are the median of
  the repeats (the objective values are the same every time: seeded)."""
  key, shares = _by_speed(static)
  runs = {('schmp', 'equal'): {}, ('schmp', 'by speed'): {f'model_args.{key}': shares},
          (static.baseline, 'equal'): {}}

  def job(scheduler, split, extra, r):
    per_sweep = WORKERS if (scheduler == 'schmp' or static.app == 'mf') else 1
    sets = {'scheduler': scheduler, 'objective_every': per_sweep, 'log_every': per_sweep,
            'checkpoint_every': static.sweeps * per_sweep,
            **{f'model_args.{k}': v for k, v in static.args.items()}, **extra}
    name = f'{static.design}-{scheduler}-{split.replace(" ", "-")}-{r}'
    return per_sweep, _launch(root / name, static.app, static.sweeps * per_sweep, sets, timeout)

  done: dict = {k: [] for k in runs}
  for r in range(repeats):
    for variant in _analysis.round_order(list(runs), r):
      done[variant].append(job(*variant, runs[variant], r))
  metrics = {k: (v[0][0], _median_metrics([m for _, m in v])) for k, v in done.items()}
  best = [min(r['loss'] for r in m if r['loss'] is not None) for _, m in metrics.values()]
  target = max(best) * (1 + _schmp_bench.TOLERANCE)
  size = {'schmp': WORKERS, static.baseline: WORKERS if static.app == 'mf' else 1}
  return [_row(static.app, static.design, scheduler, split, size[scheduler], m, every, target,
               None) | {'repeats': repeats}
          for (scheduler, split), (every, m) in metrics.items()]


def _median_metrics(runs: list[list[dict]]) -> list[dict]:
  """The first run's rows with each row's ``returned_s`` the median over the runs."""
  if any(len(m) != len(runs[0]) or [r['loss'] for r in m] != [r['loss'] for r in runs[0]]
         for m in runs[1:]):
    raise RuntimeError('repeats of a seeded SchMP job logged different objectives')
  seconds = np.median([[r['returned_s'] for r in m] for m in runs], axis=0)
  return [dict(row, returned_s=float(t)) for row, t in zip(runs[0], seconds, strict=True)]


def coordinate_rows(design: _schmp_bench.Design, rounds: int, root: pathlib.Path,
                    timeout: float, every: int = 10) -> list[dict]:
  """SchMP (32 slots) and Shotgun (one coordinate per worker) on the launched workers, the
  same ``rounds`` each (what SchMP needed on virtual devices, with a margin); the rows are
  equal, so each round lasts as long as the 3× slow host's."""
  reference = make_app(design.app, scheduler='schmp', **design.args).reference_objective()
  target = reference * (1 + _schmp_bench.TOLERANCE)
  rows = []
  for scheduler, size in (('schmp', _schmp_bench.SLOTS), ('shotgun', WORKERS)):
    sets = {'scheduler': scheduler, 'schedule_size': size, 'objective_every': every,
            'log_every': every, 'checkpoint_every': rounds,
            **{f'model_args.{k}': v for k, v in design.args.items()}}
    metrics = _launch(root / f'{design.app}-{design.name}-{scheduler}', design.app,
                      rounds, sets, timeout)
    rows.append(_row(design.app, design.name, scheduler, 'equal', size, metrics, every, target,
                     reference))
  return rows
