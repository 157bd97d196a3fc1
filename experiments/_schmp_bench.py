"""bench_schmp's comparisons on virtual devices: each app with SchMP's scheduler and with its
baseline, on P devices of this process, as objective-versus-rounds-and-time curves
(`experiments._schmp_runs`), turned into the benchmark's rows.

* Lasso and logistic regression: SchMP's dynamic schedule (32 slots, STRADS's) against Shotgun
  with P coordinates a round (its definition: P parallel updates from the same β) and, as a
  reference, Shotgun with SchMP's 32 slots. Target: the scikit-learn optimum + 1e-3 relative.
  Shotgun stops at 10× SchMP's rounds or the design's round budget, whichever is more
  (``rounds_to_target`` None: not reached by then).
* LDA and MF: SchMP's static rotation against the unscheduled baseline, the same number of
  sweeps (epochs) each, the objective evaluated once a sweep. Target: the worse of the two
  runs' best values + 1e-3 relative (`common_target`): both reach it, and the time says which
  got there first.

Every number in these rows is measured (wall time of rounds on virtual CPU devices).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax

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
                                                group_size=32), 3000)]
  return [Design('correlated', 'lasso', dict(rows=512, features=2048, groups=32, group_size=32),
                 8000),
          Design('one-group', 'lasso', dict(rows=512, features=1024, groups=1, group_size=512),
                 8000),
          Design('correlated', 'logreg', dict(rows=512, features=2048, groups=32,
                                              group_size=32), 8000)]


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
    cap = max(ROUND_CAP * (reach(schmp, target)[0] or design.rounds), design.rounds)
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
  baseline: str
  args: dict[str, Any]
  sweeps: int


def statics(quick: bool) -> list[Static]:
  """LDA on the standard library's docstrings, MF on Zipf ratings."""
  if quick:
    return [Static('lda', 'unscheduled', dict(topics=16, documents=256, vocabulary=1000), 8),
            Static('mf', 'unscheduled', dict(users=1000, items=500, ratings=20_000), 10)]
  return [Static('lda', 'unscheduled', dict(topics=32, documents=1024, vocabulary=3000), 30),
          Static('mf', 'unscheduled', dict(users=4000, items=2000, ratings=200_000), 30)]


def static_rows(static: Static, workers: Sequence[int]) -> list[dict]:
  """SchMP's rotation and the baseline, ``static.sweeps`` sweeps each, at each worker count: a
  SchMP round is 1/P of a sweep (evaluated every P rounds), a baseline round a whole sweep for
  LDA and 1/P of an epoch for MF (as the apps define their rounds)."""
  rows = []
  for p in workers:
    devices = jax.devices()[:p]
    curves = {}
    for scheduler in ('schmp', static.baseline):
      app = make_app(static.app, scheduler=scheduler, devices=p, **static.args)
      size = app.default_schedule_size(p)
      per_sweep = p if (scheduler == 'schmp' or static.app == 'mf') else 1
      curves[scheduler] = (size, per_sweep, run_curve(app, devices, size,
                                                     static.sweeps * per_sweep, every=per_sweep))
    target = common_target([c for _, _, c in curves.values()], TOLERANCE)
    for scheduler, (size, per_sweep, curve) in curves.items():
      rows.append(_row(static.app, 'default', scheduler, size, p, curve, target, None,
                       per_sweep))
  return rows
