"""PNG plots of a run's telemetry: a per-worker timeline and throughput per step; with them
(`write_plots`) the loss and evaluation curves of its ``metrics.jsonl``.

Figures are built with `matplotlib.figure.Figure` directly, not pyplot, so plotting needs no
display, selects no backend and leaves no global figure state behind.
"""

from __future__ import annotations

import pathlib

import numpy as np

from hetjax.report._figure import figure as _figure
from hetjax.report._loss import load_loss, plot_loss
from hetjax.report._objective import METRICS_FILE
from hetjax.report._telemetry_table import Telemetry, _after_warmup, iteration_summary

# Drawn left to right inside each step: the barrier wait comes before the combine, so the comm
# segments of all workers end together at the step boundary.
_SEGMENTS = (('data_s', 'data', '#c7c7c7'), ('compute_s', 'compute', '#1f77b4'),
             ('dilation_s', 'padding to the emulated host', '#ff7f0e'),
             ('wait_s', 'wait (barrier)', '#d62728'), ('comm_s', 'comm', '#2ca02c'))
_OTHER = ('other', '#ececec')
_TIMELINE_STEPS = 40  # more steps than this turn into noise: the timeline shows the last ones
# Workers of equal share draw the same line (the demo's three fast workers, every worker of a
# uniform run): each worker gets its own dash, marker and width, the widest drawn first, and
# its markers on steps of its own, so a line covered by another still shows beside it.
_DASHES = ('-', '--', '-.', ':')
_MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '*')
_MARKS_PER_WORKER = 10  # about this many markers on each worker's line


def plot_timeline(t: Telemetry, path: str | pathlib.Path, skip: int = 1) -> pathlib.Path:
  """Writes a horizontal stacked-bar timeline: one row per worker, one block per step.

  All workers start a step together (the previous step ended at a barrier), so step ``i``
  starts at the sum of the earlier iteration times. Steps before ``skip`` (compilation) are
  left out so they do not squash the rest, and a long run shows only its last 40 steps, each
  still wide enough to read; x is seconds since the first plotted step.

  Example::

    plot_timeline(load_telemetry('runs/het4'), 'runs/het4/timeline.png')
  """
  rows = _after_warmup(t, skip)
  rows = slice(max(rows.start, len(t.steps) - _TIMELINE_STEPS), None)
  iteration = t.iteration_s()[rows]
  starts = np.concatenate([[0.0], np.cumsum(iteration)[:-1]])
  fig = _figure(figsize=(11, 1.2 + 0.6 * len(t.workers)), layout='constrained')
  ax = fig.add_subplot()
  for i in range(len(t.workers)):
    offset = starts.copy()
    for field, _, colour in _SEGMENTS:
      width = getattr(t, field)[rows, i]
      ax.broken_barh(list(zip(offset, width, strict=True)), (i - 0.35, 0.7), facecolors=colour)
      offset = offset + width
    other = np.maximum(t.step_s[rows, i] - (offset - starts), 0.0)
    ax.broken_barh(list(zip(offset, other, strict=True)), (i - 0.35, 0.7), facecolors=_OTHER[1])
  for x in [*starts[1:], starts[-1] + iteration[-1]]:
    ax.axvline(x, color='black', linewidth=0.6, alpha=0.5)
  ax.set_yticks(range(len(t.workers)),
                [f'worker {w}  ×{t.slowdown[rows, i].mean():g}' for i, w in enumerate(t.workers)])
  ax.invert_yaxis()
  ax.set_xlim(0, float(iteration.sum()))
  ax.set_xlabel('seconds since the first plotted step')
  first, last = t.steps[rows][0], t.steps[-1]
  note = (f'last {len(starts)} of {len(t.steps) - skip} counted steps' if rows.start > skip
          else f'first {skip} skipped: compile' if skip else '')
  ax.set_title(f'{_title(t)}per-worker time, steps {first}–{last}' + (f' ({note})' if note else ''))
  from matplotlib.patches import Patch

  handles = [Patch(color=c, label=label) for _, label, c in _SEGMENTS]
  handles.append(Patch(color=_OTHER[1], label=_OTHER[0]))
  fig.legend(handles=handles, loc='outside lower center', ncols=len(handles), frameon=False)
  return _save(fig, path)


def plot_throughput(t: Telemetry, path: str | pathlib.Path, skip: int = 1) -> pathlib.Path:
  """Writes samples/s of every step, with the steady throughput (`iteration_summary`) as a
  dashed line; the steps it leaves out (warm-up, compiling) are grey crosses.

  Example::

    plot_throughput(load_telemetry('runs/het4'), 'runs/het4/throughput.png', skip=1)
  """
  summary = iteration_summary(t, skip)
  rate = t.batch() / np.maximum(t.iteration_s(), 1e-12)
  steps = np.array(t.steps)
  fig = _figure(figsize=(9, 4.5), layout='constrained')
  ax = fig.add_subplot()
  counted = np.isin(steps, summary.throughput.steps)
  ax.plot(steps[skip:], rate[skip:], marker='o', markersize=3, color='#1f77b4', label='per step')
  if not counted.all():
    ax.plot(steps[~counted], rate[~counted], marker='x', linestyle='none', color='grey',
            label='left out (warm-up, compiling)')
  if summary.samples_per_s is not None:  # None: every step after the warm-up compiled
    ax.axhline(summary.samples_per_s, linestyle='--', color='#d62728',
               label=f'steady {summary.samples_per_s:,.1f} samples/s (examples / time)')
  _finish(ax, 'samples/s', f'{_title(t)}throughput, global batch {summary.global_batch:g}'
          f'\n{summary.throughput.describe()}')
  return _save(fig, path)


def plot_shares(t: Telemetry, path: str | pathlib.Path) -> pathlib.Path:
  """Writes each worker's batch share over the steps, its slowdown factor in the legend.

  Workers with equal shares are told apart by dash, marker and width (`shares_figure`).

  Example::

    plot_shares(load_telemetry('runs/lbbsp'), 'runs/lbbsp/shares.png')
  """
  return _save(shares_figure(t), path)


def shares_figure(t: Telemetry):
  """The figure `plot_shares` writes: one step line per worker.

  Lines of equal shares lie on each other, so worker ``j`` of ``n`` is drawn with dash
  ``_DASHES[j % 4]``, marker ``_MARKERS[j % 8]`` and a width from 3.5 (worker 0, drawn first)
  down to 1.5 (the last, drawn on top); its markers sit every ``every`` steps starting at step
  index ``j * every // n``, a different step for each worker when ``every >= n``. For 4 workers
  over 80 steps: markers every 8 steps, at steps 0, 2, 4 and 6 of each 8.
  """
  steps = np.array(t.steps)
  fig = _figure(figsize=(9, 4.5), layout='constrained')
  ax = fig.add_subplot()
  n = len(t.workers)
  every = max(n, len(steps) // _MARKS_PER_WORKER)
  for j, worker in enumerate(t.workers):
    factors = np.unique(t.slowdown[:, j])
    label = f'worker {worker} (x{factors[0]:g})' if len(factors) == 1 else f'worker {worker}'
    width = 1.5 + 2.0 * (n - 1 - j) / max(n - 1, 1)
    ax.step(steps, t.share[:, j], where='post', label=label, linestyle=_DASHES[j % len(_DASHES)],
            linewidth=width, marker=_MARKERS[j % len(_MARKERS)], markersize=6,
            markevery=(j * every // n, every), zorder=2 + j / n)
  _finish(ax, 'rows per step (share)', f'{_title(t)}batch shares, global batch {t.batch()[0]:g}')
  return fig


def _finish(ax, ylabel: str, title: str) -> None:
  """The per-step axes style shared by the throughput and shares plots."""
  ax.set_xlabel('step')
  ax.set_ylabel(ylabel)
  ax.set_ylim(bottom=0)
  ax.grid(alpha=0.3)
  ax.set_title(title)
  ax.legend(loc='best')


def write_plots(t: Telemetry, skip: int = 1,
                out_dir: str | pathlib.Path | None = None) -> list[pathlib.Path]:
  """Writes ``timeline.png``, ``throughput.png`` and ``shares.png`` into ``out_dir`` (default:
  the run dir), and ``loss.png`` (training loss, and evaluation loss where the run evaluated:
  `hetjax.report.plot_loss`) when the run dir holds a ``metrics.jsonl``.

  Example::

    write_plots(load_telemetry('runs/het4'))   # [.../timeline.png, …, .../loss.png]
  """
  directory = pathlib.Path(out_dir) if out_dir is not None else t.directory
  paths = [plot_timeline(t, directory / 'timeline.png', skip),
           plot_throughput(t, directory / 'throughput.png', skip),
           plot_shares(t, directory / 'shares.png')]
  if (t.directory / METRICS_FILE).is_file():
    paths.append(plot_loss(load_loss(t.directory), directory / 'loss.png', _title(t).strip()))
  return paths


def _title(t: Telemetry) -> str:
  parts = [f'{k} {t.run[k]}' for k in ('model', 'policy', 'slowdown') if t.run.get(k)]
  return ', '.join(parts) + '\n' if parts else ''


def _save(fig, path: str | pathlib.Path) -> pathlib.Path:
  path = pathlib.Path(path)
  fig.savefig(path, dpi=110)
  return path
