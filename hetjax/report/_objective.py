"""A run's objective against rounds and against time, from its ``metrics.jsonl``.

SchMP runs (mode ``schmp``) log their objective as each step's ``loss`` (lower is better: the
Lasso objective, the logistic loss, the RMSE, LDA's negative log-likelihood per token), with
``null`` on rounds that did not evaluate it (``objective_every``). Time is ``returned_s``, the host
time when the round returned (`hetjax.train.MetricsLogger`).

Example::

  curve = load_objective('runs/lasso')
  curve.rounds[-1], curve.objective[-1]
  plot_objective(curve, 'runs/lasso/objective.png')
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

from hetjax._errors import ConfigError
from hetjax.report._figure import figure as _figure

METRICS_FILE = 'metrics.jsonl'


@dataclasses.dataclass(frozen=True)
class ObjectiveCurve:
  """The evaluated rounds of a run: round number, objective, seconds since the start."""

  rounds: np.ndarray
  objective: np.ndarray
  seconds: np.ndarray
  run: dict
  diverged_by: int | None = None  # the run's last round, when its objective was not finite

  def first_reaching(self, target: float) -> tuple[int | None, float | None]:
    """(round, seconds) of the first evaluation at or below ``target``, or (None, None)."""
    hit = np.flatnonzero(self.objective <= target)
    if not hit.size:
      return None, None
    return int(self.rounds[hit[0]]), float(self.seconds[hit[0]])


def load_objective(run_dir: str | pathlib.Path) -> ObjectiveCurve:
  """Reads ``RUN_DIR/metrics.jsonl`` (and ``run.json`` when present).

  Raises:
    ConfigError: no such directory or file, a malformed line, or no evaluated round.
  """
  directory = pathlib.Path(run_dir)
  path = directory / METRICS_FILE
  if not path.is_file():
    raise ConfigError(f'no {METRICS_FILE} in {directory}')
  rows = []
  for n, line in enumerate(path.read_text().splitlines(), start=1):
    try:
      row = json.loads(line)
      rows.append((int(row['step']), math.nan if row['loss'] is None else float(row['loss']),
                   float(row.get('returned_s', row['time_s']))))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
      raise ConfigError(f'{path}:{n}: not a metrics line ({type(e).__name__}: {e})') from None
  # A run's last round always evaluates its objective: null there means it was not finite.
  diverged_by = rows[-1][0] if rows and not math.isfinite(rows[-1][1]) else None
  rows = [r for r in rows if math.isfinite(r[1])]
  if not rows:
    raise ConfigError(f'{path} has no finite objective'
                      + (f' (not finite at round {diverged_by})' if diverged_by else ''))
  run_path = directory / 'run.json'
  run = json.loads(run_path.read_text()) if run_path.is_file() else {}
  step, value, seconds = (np.array(c) for c in zip(*rows, strict=True))
  return ObjectiveCurve(step, value, seconds, run, diverged_by)


def plot_objective(curve: ObjectiveCurve, path: str | pathlib.Path) -> pathlib.Path:
  """Writes the objective against rounds (left) and against seconds (right) as a PNG."""

  fig = _figure(figsize=(10, 3.6), layout='constrained')
  title = ', '.join(f'{k} {curve.run[k]}' for k in ('model', 'scheduler', 'workers')
                    if curve.run.get(k))
  for i, (x, label) in enumerate(((curve.rounds, 'round'), (curve.seconds, 'seconds'))):
    ax = fig.add_subplot(1, 2, i + 1)
    ax.plot(x, curve.objective, marker='.', markersize=3)
    ax.set_xlabel(label)
    ax.set_ylabel('objective')
    positive = curve.objective > 0
    if positive.all() and curve.objective.max() > 10 * curve.objective.min():
      ax.set_yscale('log')
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  path = pathlib.Path(path)
  fig.savefig(path, dpi=110)
  return path
