"""A run's training loss and its evaluations against steps, from its ``metrics.jsonl``.

Each step's line has its ``loss`` (`hetjax.train.MetricsLogger`); the steps that evaluated on
the held-out split carry ``eval_loss`` too. Non-finite values (``null``) are left out.

Example::

  curves = load_loss('runs/lm')
  curves.steps[-1], curves.loss[-1], curves.eval_steps, curves.eval_loss
  plot_loss(curves, 'runs/lm/loss.png')
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

from hetjax._errors import ConfigError
from hetjax.report._figure import figure as _figure
from hetjax.report._objective import METRICS_FILE


@dataclasses.dataclass(frozen=True)
class LossCurves:
  """Training loss by step, and evaluation loss at the steps that evaluated (maybe none)."""

  steps: np.ndarray
  loss: np.ndarray
  eval_steps: np.ndarray
  eval_loss: np.ndarray


def load_loss(run_dir: str | pathlib.Path) -> LossCurves:
  """Reads ``RUN_DIR/metrics.jsonl``; a resumed run's rows keep their order by step.

  Raises:
    ConfigError: no such file, or a malformed line.
  """
  path = pathlib.Path(run_dir) / METRICS_FILE
  if not path.is_file():
    raise ConfigError(f'no {METRICS_FILE} in {path.parent}')
  train, held_out = {}, {}
  for n, line in enumerate(path.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      step = int(row['step'])
      for key, into in (('loss', train), ('eval_loss', held_out)):
        value = row.get(key)
        if value is not None and math.isfinite(float(value)):
          into[step] = float(value)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
      raise ConfigError(f'{path}:{n}: not a metrics line ({type(e).__name__}: {e})') from None
  steps, evals = sorted(train), sorted(held_out)
  return LossCurves(np.array(steps, dtype=np.int64), np.array([train[s] for s in steps]),
                    np.array(evals, dtype=np.int64), np.array([held_out[s] for s in evals]))


def plot_loss(curves: LossCurves, path: str | pathlib.Path, title: str = '') -> pathlib.Path:
  """Writes the training loss against steps, with the evaluation loss as marked points joined
  by a line when there is any, as a PNG (a log scale when the loss spans a factor of 10; the
  title says so when no loss was finite).

  Example::

    plot_loss(load_loss('runs/lm'), 'runs/lm/loss.png')
  """

  fig = _figure(figsize=(9, 4.5), layout='constrained')
  ax = fig.add_subplot()
  ax.plot(curves.steps, curves.loss, color='#1f77b4', linewidth=1, label='training loss')
  if curves.eval_steps.size:
    ax.plot(curves.eval_steps, curves.eval_loss, color='#d62728', marker='o', markersize=4,
            label='evaluation loss (held-out)')
  values = np.concatenate([curves.loss, curves.eval_loss])
  if values.size and (values > 0).all() and values.max() > 10 * values.min():
    ax.set_yscale('log')
  ax.set_xlabel('step')
  ax.set_ylabel('loss')
  ax.grid(alpha=0.3)
  ax.legend(loc='best')
  if not values.size:
    title = (title + '\n' if title else '') + 'no finite loss logged'
  if title:
    ax.set_title(title)
  path = pathlib.Path(path)
  fig.savefig(path, dpi=110)
  return path
