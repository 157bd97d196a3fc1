"""Runs side by side: ``python -m hetjax.report RUN_A RUN_B …``, as ``make demo`` prints uniform
BSP beside LB-BSP.

One row per run: its mode, policy and slowdown, its steady samples/s (`steady_throughput`, the
figure of its own report and ``summary.json``), its step time, goodput and emulated hosts; then
each run's samples/s over the first's. A run with telemetry (several workers) is plotted too:
samples/s per step, and each worker's mean step split into compute, padding, wait and comm.

Two runs are a comparison of policies only on one cluster: the same hosts (``run.json``'s
``host_row_s`` and ``host_fixed_s``). Hosts calibrated separately can differ severalfold on a
busy machine, so `hosts_warning` names runs whose hosts differ, and the fix (``--hosts=RUN_DIR``).

Example::

  runs = compare_runs(['runs/uniform', 'runs/lbbsp'])
  print(format_comparison(runs))
  # run           mode    policy      slowdown        samples/s  step ms  goodput  hosts
  # runs/uniform  shares  uniform     static:1,1,1,3     57,454    17.82    91.0%  0.012 ms …
  # runs/lbbsp    shares  lbbsp-ewma  static:1,1,1,3    111,460     9.19    90.2%  0.012 ms …
  # runs/lbbsp: 1.94x the samples/s of runs/uniform
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hetjax._errors import ConfigError
from hetjax.report._figure import figure as _figure
from hetjax.report._goodput import goodput
from hetjax.report._hosts import cost, describe_hosts, hosts_of
from hetjax.report._objective import METRICS_FILE
from hetjax.report._plots import _SEGMENTS, _save
from hetjax.report._telemetry_table import (
  RUN_FILE,
  TELEMETRY_FILE,
  Telemetry,
  _read_run,
  iteration_summary,
  load_telemetry,
  summarise,
)

SUMMARY_FILE = 'summary.json'


@dataclasses.dataclass(frozen=True, eq=False)
class ComparedRun:
  """One run's figures for the comparison.

  Attributes:
    name: the run directory as given.
    run: its ``run.json`` (empty when it has none).
    samples_per_s: steady samples/s (telemetry, else ``summary.json``'s
      ``steady_samples_per_s``); None when no step was steady or nothing recorded it.
    step_s: the mean step time of the same steps (telemetry: the slowest worker's; else the
      global batch over ``samples_per_s``); None with it.
    goodput: the part of the wall time that trained (`hetjax.report.goodput`); None without
      a ``metrics.jsonl`` it can split.
    telemetry: the per-worker telemetry, or None (one process).
  """

  name: str
  run: Mapping[str, Any]
  samples_per_s: float | None
  step_s: float | None
  goodput: float | None
  telemetry: Telemetry | None


def compare_runs(run_dirs: Sequence[str | pathlib.Path], skip: int = 1) -> list[ComparedRun]:
  """Each run directory's figures (`ComparedRun`), ``skip`` warm-up steps left out of runs
  with telemetry, as their own report leaves them out.

  Raises:
    ConfigError: a directory that is missing or holds neither ``telemetry.jsonl`` nor
      ``metrics.jsonl``, or telemetry its own report would refuse.
  """
  return [_compared(pathlib.Path(d), str(d), skip) for d in run_dirs]


def _compared(directory: pathlib.Path, name: str, skip: int) -> ComparedRun:
  if not directory.is_dir():
    raise ConfigError(f'no run directory {directory}')
  has_metrics = (directory / METRICS_FILE).is_file()
  if not (directory / TELEMETRY_FILE).is_file():
    if not has_metrics:
      raise ConfigError(f'{directory} holds neither {TELEMETRY_FILE} nor {METRICS_FILE}: not a '
                        'run directory')
    run = _read_run(directory / RUN_FILE)
    rate = _summary(directory).get('steady_samples_per_s')
    rate = float(rate) if isinstance(rate, int | float) and rate > 0 else None
    batch = run.get('global_batch')
    step = batch / rate if rate and isinstance(batch, int | float) else None
    return ComparedRun(name, run, rate, step, _goodput(directory), None)
  t = load_telemetry(directory)
  it = iteration_summary(t, skip)
  step = it.iteration_s if it.samples_per_s is not None else None
  return ComparedRun(name, t.run, it.samples_per_s, step,
                     _goodput(directory) if has_metrics else None, t)


def _summary(directory: pathlib.Path) -> dict[str, Any]:
  try:
    summary = json.loads((directory / SUMMARY_FILE).read_text())
  except (OSError, ValueError):
    return {}
  return summary if isinstance(summary, dict) else {}


def _goodput(directory: pathlib.Path) -> float | None:
  try:
    return float(goodput(directory)['goodput'])
  except (ConfigError, KeyError, TypeError, ValueError):
    return None


def format_comparison(runs: Sequence[ComparedRun]) -> str:
  """An aligned table, one row per run (module docstring), then each run's samples/s over the
  first's."""
  head = ['run', 'mode', 'policy', 'slowdown', 'samples/s', 'step ms', 'goodput', 'hosts']
  body = [[r.name, _text(r.run.get('mode')), _text(r.run.get('policy')),
           _text(r.run.get('slowdown')),
           '-' if r.samples_per_s is None else f'{r.samples_per_s:,.0f}',
           '-' if r.step_s is None else f'{1e3 * r.step_s:.2f}',
           '-' if r.goodput is None else f'{r.goodput:.1%}',
           describe_hosts(r.run, prefix='') or 'none'] for r in runs]
  widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
  numeric = {'samples/s', 'step ms', 'goodput'}
  lines = ['  '.join(c.rjust(w) if h in numeric else c.ljust(w)
                     for c, w, h in zip(row, widths, head, strict=True)).rstrip()
           for row in [head, *body]]
  first = runs[0]
  for r in runs[1:]:
    if first.samples_per_s and r.samples_per_s:
      lines.append(f'{r.name}: {r.samples_per_s / first.samples_per_s:.2f}x the samples/s of '
                   f'{first.name}')
  return '\n'.join(lines)


def _text(value: Any) -> str:
  return '-' if value is None or value == '' else str(value)


def hosts_warning(runs: Sequence[ComparedRun]) -> str | None:
  """One line when the runs emulated different hosts (module docstring), naming each run's and
  the flag that runs the others on the first one's; None when they agree."""
  if len({hosts_of(r.run) for r in runs}) <= 1:
    return None
  each = '; '.join(f'{r.name}: {cost(r.run) if hosts_of(r.run) else "none"}' for r in runs)
  first = next(r for r in runs if hosts_of(r.run) is not None)
  return (f'warning: these runs emulated different hosts ({each}), so they compare clusters '
          f'as well as policies: run the others again with --hosts={first.name}')


def plot_comparison(runs: Sequence[ComparedRun], path: str | pathlib.Path,
                    skip: int = 1) -> pathlib.Path:
  """Writes the runs with telemetry side by side: samples/s per step (the steady figure
  dashed), and each worker's mean step over the steady steps split into data, compute,
  padding to its host, barrier wait and comm.

  Raises:
    ConfigError: none of ``runs`` has telemetry.
  """
  plotted = [r for r in runs if r.telemetry is not None]
  if not plotted:
    raise ConfigError('no run to plot: none of them has telemetry.jsonl (several workers)')
  bars = sum(len(r.telemetry.workers) for r in plotted)
  fig = _figure(figsize=(11, 4.5 + 0.3 * bars), layout='constrained')
  rate_ax, time_ax = fig.subplots(2, 1, height_ratios=(4.5, 1 + 0.3 * bars))
  colours = [f'C{i}' for i in range(len(plotted))]
  for r, colour in zip(plotted, colours, strict=True):
    t = r.telemetry
    rate = t.batch() / np.maximum(t.iteration_s(), 1e-12)
    rate_ax.plot(np.array(t.steps)[skip:], rate[skip:], marker='o', markersize=3, color=colour,
                 label=f'{r.name} ({_text(r.run.get("policy"))})')
    if r.samples_per_s is not None:
      rate_ax.axhline(r.samples_per_s, linestyle='--', color=colour, linewidth=1)
  rate_ax.set_xlabel('step')
  rate_ax.set_ylabel('samples/s')
  rate_ax.set_ylim(bottom=0)
  rate_ax.grid(alpha=0.3)
  rate_ax.legend(loc='best')
  left_out = [r.name for r in runs if r.telemetry is None]
  rate_ax.set_title('samples/s per step, steady dashed' + (
      f' (no telemetry, not drawn: {", ".join(left_out)})' if left_out else ''))
  labels = []
  for r in plotted:
    for w in summarise(r.telemetry, skip):
      left = 0.0
      for field, _, colour in _SEGMENTS:
        width = 1e3 * getattr(w, field)
        time_ax.barh(len(labels), width, left=left, color=colour)
        left += width
      labels.append(f'{r.name}  worker {w.worker}  x{w.slowdown:g}')
  time_ax.set_yticks(range(len(labels)), labels)
  time_ax.invert_yaxis()
  time_ax.set_xlabel('ms, mean step of each worker (steady steps)')
  from matplotlib.patches import Patch

  time_ax.legend(handles=[Patch(color=c, label=label) for _, label, c in _SEGMENTS],
                 loc='lower right', fontsize='small')
  return _save(fig, path)
