"""bench_schmp's comparisons on virtual devices: each app with SchMP's scheduler and with its
baseline, on P devices of this process, as objective-versus-rounds-and-time curves
(`experiments._schmp_runs`), turned into the benchmark's rows.

* Lasso and logistic regression: SchMP's dynamic schedule (32 slots, STRADS's) against Shotgun
  with P coordinates a round (its definition: P parallel updates from the same β) and, as a
  reference, Shotgun with SchMP's 32 slots. Target: the scikit-learn optimum + 1e-3 relative.
  Shotgun stops at 10× SchMP's rounds or the design's round budget, whichever is more
  (``rounds_to_target`` None: not reached by then).
* The SVM (dual coordinate descent): the same as Lasso, its coordinates the examples; the
  reference LinearSVC's primal objective, Shotgun's its unscheduled parallel dual coordinate
  descent, stopped at the design's own round cap.
* LDA and MF: SchMP's static rotation against the unscheduled baseline, the same number of
  sweeps (epochs) each, the objective evaluated once a sweep. Target: the worse of the two
  runs' best values + 1e-3 relative (`common_target`): both reach it, and the time says which
  got there first.
* CD-MF against SGD-MF, both in SchMP's rotation on the same data from the same start, both
  reporting the regularised loss (`mf_pair_rows`): SGD-MF for some epochs, CD-MF for some
  outer iterations (2 × rank sweeps each), the objective once an epoch and once an outer
  iteration; target as for MF.

Every number in these rows is measured (wall time of rounds on virtual CPU devices).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from experiments import _harness
from experiments._schmp_runs import Curve, common_target, reach, run_curve
from hetjax.schmp import make_app

SOURCE = 'virtual devices (measured)'
#: SchMP's slots for the coordinate apps (STRADS's schedule size)
SLOTS = 32
#: Shotgun runs until this many times SchMP's rounds to the target
ROUND_CAP = 10
#: the target of the coordinate apps: the reference optimum + this, relative
TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class Design:
  """A coordinate app's data for the benchmark (the app's design arguments)."""

  name: str
  app: str
  args: dict[str, Any]
  rounds: int  # SchMP's round cap
  cap: int | None = None  # Shotgun's round cap (None: `ROUND_CAP` × SchMP's rounds, or more)


def designs(quick: bool) -> list[Design]:
  """Lasso on a design with many correlated groups (Shotgun's P* = d / ρ(XᵀX) ≈ 70 full, 18
  quick) and on one with a single large group (P* ≈ 2), and logistic regression on the first
  kind."""
  if quick:
    return [Design('correlated', 'lasso', dict(rows=256, features=512, groups=8, group_size=32),
                   3000),
            Design('one-group', 'lasso', dict(rows=256, features=512, groups=1, group_size=256),
                   3000),
            Design('correlated', 'logreg', dict(rows=256, features=512, groups=8,
                                                group_size=32), 3000),
            Design('one-group', 'svm', dict(rows=256, features=64, groups=1, group_size=32,
                                            c=0.01), 600, cap=600)]
  return [Design('correlated', 'lasso', dict(rows=512, features=2048, groups=32, group_size=32),
                 8000),
          Design('one-group', 'lasso', dict(rows=512, features=1024, groups=1, group_size=512),
                 8000),
          Design('correlated', 'logreg', dict(rows=512, features=2048, groups=32,
                                              group_size=32), 8000),
          Design('correlated', 'svm', dict(c=0.01), 2000, cap=3000),
          Design('breast_cancer', 'svm', dict(data='breast_cancer', pad_rows=True, c=0.1), 1500,
                 cap=3000)]


def _row(app: str, design: str, scheduler: str, size: int, workers: int, curve: Curve,
         target: float, reference: float | None, every: int) -> dict:
  rounds, seconds = reach(curve, target)
  return {'app': app, 'design': design, 'scheduler': scheduler, 'schedule_size': size,
          'workers': workers, 'source': SOURCE, 'rounds_to_target': rounds,
          'time_to_target_s': None if seconds is None else round(seconds, 3),
          'rounds_run': curve.rounds[-1], 'objective_every': every,
          'final_objective': curve.final if math.isfinite(curve.final) else None,
          'reference_objective': reference, 'target': target, 'diverged': curve.diverged}


def coordinate_rows(design: Design, workers: Sequence[int], with_wide_shotgun: bool,
                    every: int = 10) -> list[dict]:
  """SchMP and Shotgun on ``design`` at each worker count (module docstring)."""
  reference = make_app(design.app, scheduler='schmp', **design.args).reference_objective()
  target = reference * (1 + TOLERANCE)
  rows = []
  for p in workers:
    devices = jax.devices()[:p]
    schmp = run_curve(make_app(design.app, scheduler='schmp', **design.args), devices, SLOTS,
                      design.rounds, every=every, stop_below=target)
    rows.append(_row(design.app, design.name, 'schmp', SLOTS, p, schmp, target, reference,
                     every))
    cap = design.cap or max(ROUND_CAP * (reach(schmp, target)[0] or design.rounds),
                            design.rounds)
    sizes = [p] + ([SLOTS] if with_wide_shotgun and p == max(workers) else [])
    for size in sizes:
      shotgun = run_curve(make_app(design.app, scheduler='shotgun', **design.args), devices,
                          size, cap, every=every, stop_below=target)
      rows.append(_row(design.app, design.name, 'shotgun', size, p, shotgun, target, reference,
                       every))
  return rows


@dataclasses.dataclass(frozen=True)
class Static:
  """A static-rotation app for the benchmark: its arguments and how many sweeps to run."""

  app: str
  design: str
  baseline: str
  args: dict[str, Any]
  sweeps: int
  more_baselines: tuple[str, ...] = ()   # on virtual devices only (`static_rows`)


#: LDA's second baseline: unscheduled Gibbs merged every 1/P sweep, as often as SchMP syncs
LDA_ROUNDS = ('unscheduled-rounds',)
#: LDA's baselines run up to this many times SchMP's sweeps to reach its final value
LONGER = 4


def statics(quick: bool) -> list[Static]:
  """LDA on the standard library's docstrings, MF on Zipf ratings (the full run: 10⁵ users ×
  10⁴ items, 10⁶ ratings, at two step sizes: the serial SGD of the rotation and the averaged
  one of the baseline do not have the same best one)."""
  if quick:
    return [Static('lda', 'stdlib-1k', 'unscheduled',
                   dict(topics=16, documents=1024, vocabulary=3000), 10, LDA_ROUNDS),
            Static('mf', 'zipf-100k', 'unscheduled',
                   dict(users=4000, items=2000, ratings=100_000), 10)]
  big = dict(users=100_000, items=10_000, ratings=1_000_000)
  return [Static('lda', 'stdlib-3k', 'unscheduled',
                 dict(topics=32, documents=3000, vocabulary=5000), 30, LDA_ROUNDS),
          Static('mf', 'zipf-1m-lr0.05', 'unscheduled', dict(big, lr=0.05), 20),
          Static('mf', 'zipf-1m-lr0.1', 'unscheduled', dict(big, lr=0.1), 20)]


def static_rows(static: Static, workers: Sequence[int], repeats: int = 3) -> list[dict]:
  """SchMP's rotation and the baselines, ``static.sweeps`` sweeps each, at each worker count:
  a SchMP round is 1/P of a sweep (evaluated every P rounds), a baseline round a whole sweep for
  LDA's ``unscheduled`` and 1/P of one for ``unscheduled-rounds`` and MF's (as the apps define
  their rounds). Each runs ``repeats``
  times, the two interleaved (A B, B A, …: machine drift hits both alike); the curves are the
  same every time (seeded), their times the median of the repeats.

  LDA's baselines then run once more, up to `LONGER` × the sweeps, until they reach SchMP's
  final value: ``sweeps_to_schmp_final`` (None: not by then; SchMP's own: its sweeps)."""
  rows = []
  for p in workers:
    devices = jax.devices()[:p]
    runs, shapes, apps = {}, {}, {}
    for scheduler in ('schmp', static.baseline, *static.more_baselines):
      app = apps[scheduler] = make_app(static.app, scheduler=scheduler, devices=p,
                                       **static.args)
      size = app.default_schedule_size(p)
      per_sweep = 1 if (static.app, scheduler) == ('lda', 'unscheduled') else p
      shapes[scheduler] = size, per_sweep
      runs[scheduler] = (lambda app=app, size=size, per_sweep=per_sweep, devices=devices: run_curve(
          app, devices, size, static.sweeps * per_sweep, every=per_sweep))
    curves = {k: median_curve(v) for k, v in _harness.interleave(runs, repeats).items()}
    target = common_target(list(curves.values()), TOLERANCE)
    for scheduler, curve in curves.items():
      size, per_sweep = shapes[scheduler]
      row = _row(static.app, static.design, scheduler, size, p, curve, target, None, per_sweep)
      if static.app == 'lda':
        final = curves['schmp'].final
        longer = curve if scheduler == 'schmp' else run_curve(
            apps[scheduler], devices, size, LONGER * static.sweeps * per_sweep, every=per_sweep,
            stop_below=final)
        rounds = reach(longer, final)[0]
        row['sweeps_to_schmp_final'] = None if rounds is None else rounds // per_sweep
      rows.append(row | {'repeats': repeats})
  return rows


def median_curve(curves: Sequence[Curve]) -> Curve:
  """Repeats of one seeded run: their values (checked equal) with the median of their times."""
  first = curves[0]
  for other in curves[1:]:
    if other.rounds != first.rounds or not np.array_equal(other.objective, first.objective,
                                                          equal_nan=True):
      raise RuntimeError('repeats of a seeded SchMP run differ: not deterministic')
  seconds = tuple(float(t) for t in np.median([c.seconds for c in curves], axis=0))
  return dataclasses.replace(first, seconds=seconds)


@dataclasses.dataclass(frozen=True)
class MFPair:
  """CD-MF against SGD-MF on one data set: ``args`` for both apps, SGD-MF's ``epochs``, CD-MF's
  ``outer`` iterations, on ``workers`` devices."""

  design: str
  args: dict[str, Any]
  epochs: int
  outer: int
  workers: int


def mf_pairs(quick: bool) -> list[MFPair]:
  """The MF configs' data (1000 × 500, 20,000 ratings) quick; 10⁵ × 10⁴ with 10⁶ ratings full
  (SGD-MF's lr 0.05 there: 0.1 is its worse step, the MF rows above). P = 4 only: CD-MF's outer
  iteration is 2 × rank × P rounds."""
  if quick:
    return [MFPair('zipf-20k', {}, 40, 60, 4)]
  return [MFPair('zipf-1m', dict(users=100_000, items=10_000, ratings=1_000_000), 20, 30, 4)]


def mf_pair_rows(pair: MFPair) -> list[dict]:
  """SGD-MF (``'mf'``, lr 0.05 on the big data) and CD-MF (``'cdmf'``) on the same data, blocks
  and start, both reporting the regularised loss (module docstring)."""
  p = pair.workers
  devices = jax.devices()[:p]
  sgd_args = pair.args | ({'lr': 0.05} if pair.args else {})
  sgd = make_app('mf', devices=p, metric='loss', **sgd_args)
  cd = make_app('cdmf', devices=p, **pair.args)
  per_outer = 2 * cd.rank * cd.inner * p
  curves = {'mf': run_curve(sgd, devices, p, pair.epochs * p, every=p),
            'cdmf': run_curve(cd, devices, p, pair.outer * per_outer, every=per_outer)}
  target = common_target(list(curves.values()), TOLERANCE)
  return [_row(app, pair.design, 'schmp', p, p, curve, target, None, every)
          for (app, curve), every in zip(curves.items(), (p, per_outer), strict=True)]
