"""Running a SchMP app for a benchmark: rounds in the one loop, the objective against rounds and
time, and the analysis of those curves (targets, divergence).

`run_curve` trains an app with its scheduler (`hetjax.schmp.SchmpProgram` in
`hetjax.train.training_steps`), evaluating the objective every ``every`` rounds: the loop waits
only at those rounds (between them scheduling overlaps the devices' work, as in a run), and the
time of an evaluation is when its value was ready. Compiling is left out: one untimed round on a
throwaway state first. `reach` reads a curve: the first evaluation at or below a target.

  curve = run_curve(make_app('lasso', scheduler='shotgun', …), devices[:4], 4, rounds=400)
  reach(curve, target=1.001 * reference)   # (rounds, seconds) or (None, None)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from hetjax.schmp import App, SchmpProgram
from hetjax.train import Hook, training_steps

#: An objective this many times the starting one (or not finite) has diverged.
DIVERGED = 1e3


@dataclasses.dataclass(frozen=True)
class Curve:
  """An app's objective as it trained.

  Attributes:
    rounds: the rounds after which the objective was evaluated (0: before the first).
    objective: its values (lower is better).
    seconds: wall time from the first round's start to each value being ready.
    diverged: the objective stopped being finite or grew past `DIVERGED` × its start.
  """

  rounds: tuple[int, ...]
  objective: tuple[float, ...]
  seconds: tuple[float, ...]
  diverged: bool

  @property
  def final(self) -> float:
    return self.objective[-1]

  def best(self) -> float:
    finite = [v for v in self.objective if math.isfinite(v)]
    return min(finite) if finite else math.inf


def run_curve(app: App, devices: Sequence[jax.Device], schedule_size: int, rounds: int,
              every: int = 5, staleness: int = 1, seed: int = 0, host: Any = None,
              stop_below: float | None = None) -> Curve:
  """Trains ``app`` for ``rounds`` rounds (module docstring); stops early once the objective is
  at or below ``stop_below`` or has diverged."""
  program = SchmpProgram(app, schedule_size, devices, seed=seed, staleness=staleness,
                         objective_every=every, host=host)
  policy = app.policy(schedule_size, seed)
  program.time_rounds(policy.update(policy.init(), None)[0], 0)  # compiles, off the clock
  state = program.init_state()
  start_value = float(program.objective(state))
  values, at_rounds, seconds = [start_value], [0], [0.0]
  stopped = []

  def record(info) -> None:
    value = float(info.stats.loss)  # waits for this round's objective
    values.append(value)
    at_rounds.append(info.step)
    seconds.append(time.perf_counter() - start)
    if not math.isfinite(value) or value > DIVERGED * abs(start_value) or (
        stop_below is not None and value <= stop_below):
      stopped.append(info.step)

  start = time.perf_counter()
  for _ in training_steps(program, state, rounds, [Hook(record, every=every)], policy):
    if stopped:
      break
  diverged = any(not math.isfinite(v) or v > DIVERGED * abs(start_value) for v in values)
  return Curve(tuple(at_rounds), tuple(values), tuple(seconds), diverged)


def reach(curve: Curve, target: float) -> tuple[int | None, float | None]:
  """(rounds, seconds) at the first evaluation at or below ``target``; (None, None) if never."""
  hit = np.flatnonzero(np.asarray(curve.objective) <= target)  # NaN compares False
  if not hit.size:
    return None, None
  i = int(hit[0])
  return curve.rounds[i], curve.seconds[i]


def common_target(curves: Sequence[Curve], slack: float = 1e-3) -> float:
  """A target every curve that did not diverge reached: the worst of their best values, plus
  ``slack`` relative (for apps without an independent optimum: MF's RMSE, LDA's likelihood)."""
  best = [c.best() for c in curves if not c.diverged]
  if not best:
    return math.nan
  worst = max(best)
  return worst + slack * abs(worst)
