"""Loads a run's per-(step, worker) telemetry into arrays and summarises where the time went.

A heterogeneous run is only as fast as its slowest worker each step; these summaries show how
much of every worker's step was its own work and how much was waiting for the others.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hetjax._errors import ConfigError

TELEMETRY_FILE = 'telemetry.jsonl'
RUN_FILE = 'run.json'
FIELDS = ('share', 'slowdown', 'data_s', 'compute_s', 'dilation_s', 'comm_s', 'wait_s', 'step_s')
#: Fields newer runs write; absent in older telemetry, read as 0.
OPTIONAL_FIELDS = ('compile_s', 'load', 'overrun_s')
_INTS = ('step', 'worker', 'share')


@dataclasses.dataclass(frozen=True, eq=False)
class Telemetry:
  """One run's telemetry as read-only ``[step, worker]`` arrays (row ``i`` is ``steps[i]``).

  Example::

    t = load_telemetry('runs/het4')
    t.wait_s[:, 0]          # seconds worker index 0 waited at the barrier, per step
    t.share.sum(axis=1)     # the global batch of each step
  """

  directory: pathlib.Path
  steps: tuple[int, ...]
  workers: tuple[int, ...]
  run: Mapping[str, Any]
  share: np.ndarray
  slowdown: np.ndarray
  data_s: np.ndarray
  compute_s: np.ndarray
  dilation_s: np.ndarray
  comm_s: np.ndarray
  wait_s: np.ndarray
  step_s: np.ndarray
  compile_s: np.ndarray
  load: np.ndarray
  overrun_s: np.ndarray  # how far compute ran past the emulated host's time (0: it held)

  def iteration_s(self) -> np.ndarray:
    """Per step, the wall time of the iteration: the slowest worker's ``step_s``."""
    return self.step_s.max(axis=1)

  def batch(self) -> np.ndarray:
    """Per step, the global batch: the examples all workers computed together."""
    return self.share.sum(axis=1)


@dataclasses.dataclass(frozen=True)
class WorkerSummary:
  """One worker's means over the counted steps; times in seconds.

  ``idle_fraction`` is total ``wait_s`` over total ``step_s``: the part of this worker's wall
  time spent waiting for slower workers (0.0 for the straggler, near 1 for a starved worker).
  """

  worker: int
  slowdown: float
  share: float
  data_s: float
  compute_s: float
  dilation_s: float
  comm_s: float
  wait_s: float
  step_s: float
  idle_fraction: float


@dataclasses.dataclass(frozen=True)
class IterationSummary:
  """Whole-run figures over the counted steps (those after the ``skip`` compile steps)."""

  steps: int
  skipped: int
  iteration_s: float
  global_batch: float
  samples_per_s: float


def load_telemetry(run_dir: str | pathlib.Path) -> Telemetry:
  """Reads ``RUN_DIR/telemetry.jsonl`` (and ``run.json`` if present) into a `Telemetry`.

  Every line must be a JSON object with ``step``, ``worker`` and all of `FIELDS`, and the rows
  must form a full steps × workers grid; anything else is a one-line `ConfigError` naming the
  line or the missing (step, worker), because a silently partial grid would skew every mean.

  Example::

    load_telemetry('runs/het4').step_s.shape   # (100, 4): 100 steps × 4 workers
  """
  directory = pathlib.Path(run_dir)
  if not directory.is_dir():
    raise ConfigError(f'no run directory {directory}')
  path = directory / TELEMETRY_FILE
  if not path.is_file():
    raise ConfigError(f'no {TELEMETRY_FILE} in {directory}')
  rows = _read_rows(path)
  if not rows:
    raise ConfigError(f'{path} is empty')
  run = _read_run(directory / RUN_FILE)
  steps, workers = (sorted({key[i] for key in rows}) for i in (0, 1))
  _check_grid(rows, steps, workers, run, path)
  arrays = {f: np.array([[rows[s, w].get(f, 0.0) for w in workers] for s in steps],
                        dtype=np.int64 if f in _INTS else np.float64)
            for f in FIELDS + OPTIONAL_FIELDS}
  for array in arrays.values():
    array.setflags(write=False)
  return Telemetry(directory, tuple(steps), tuple(workers), run, **arrays)


def _read_rows(path: pathlib.Path) -> dict[tuple[int, int], dict[str, Any]]:
  rows: dict[tuple[int, int], dict[str, Any]] = {}
  with path.open() as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f'{path} line {number}'
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ConfigError(f'{where}: not valid JSON ({e.msg})') from None
      if not isinstance(row, dict):
        raise ConfigError(f'{where}: expected a JSON object, got {type(row).__name__}')
      missing = [k for k in ('step', 'worker', *FIELDS) if k not in row]
      if missing:
        raise ConfigError(f'{where}: missing field(s) {", ".join(missing)}')
      for key in ('step', 'worker', *FIELDS):
        _check_value(where, key, row[key])
      key = (row['step'], row['worker'])
      if key in rows:
        raise ConfigError(f'{where}: a second row for step {key[0]} worker {key[1]}')
      rows[key] = row
  return rows


def _check_value(where: str, key: str, value: Any) -> None:
  number = isinstance(value, int | float) and not isinstance(value, bool)
  if key in _INTS and not (type(value) is int and value >= 0):
    raise ConfigError(f'{where}: {key} must be a non-negative integer, got {value!r}')
  if not (number and math.isfinite(value) and value >= 0):
    raise ConfigError(f'{where}: {key} must be a non-negative number, got {value!r}')


def _read_run(path: pathlib.Path) -> dict[str, Any]:
  if not path.is_file():
    return {}
  try:
    run = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ConfigError(f'{path}: not valid JSON ({e.msg})') from None
  if not isinstance(run, dict):
    raise ConfigError(f'{path}: expected a JSON object, got {type(run).__name__}')
  return run


def _check_grid(rows, steps, workers, run, path) -> None:
  expected = run.get('workers')
  if isinstance(expected, int) and not isinstance(expected, bool) and expected != len(workers):
    absent = ', '.join(map(str, sorted(set(range(expected)) - set(workers))))
    detail = f' (no rows for worker {absent})' if absent else ''
    raise ConfigError(
        f'{path}: run.json says {expected} workers but telemetry has {len(workers)}{detail}')
  for step in steps:
    absent = ', '.join(str(w) for w in workers if (step, w) not in rows)
    if absent:
      raise ConfigError(f'{path}: incomplete grid: step {step} lacks worker {absent}')


def _counted(t: Telemetry, skip: int) -> slice:
  if skip < 0 or skip >= len(t.steps):
    raise ConfigError(f'skip must be in [0, {len(t.steps)}) for {len(t.steps)} steps, got {skip}')
  return slice(skip, None)


def summarise(t: Telemetry, skip: int = 1) -> list[WorkerSummary]:
  """Per-worker means over the steps after the first ``skip`` (which include compilation).

  Example::

    for s in summarise(load_telemetry('runs/het4')):
      print(s.worker, s.slowdown, f'{s.idle_fraction:.0%}')   # 3 3.0 0%  /  0 1.0 64% ...
  """
  rows = _counted(t, skip)
  out = []
  for i, worker in enumerate(t.workers):
    mean = {f: float(getattr(t, f)[rows, i].mean()) for f in FIELDS}
    total_step = float(t.step_s[rows, i].sum())
    idle = float(t.wait_s[rows, i].sum()) / total_step if total_step > 0 else 0.0
    out.append(WorkerSummary(worker=worker, idle_fraction=idle, **mean))
  return out


def iteration_summary(t: Telemetry, skip: int = 1) -> IterationSummary:
  """Mean iteration time (slowest worker per step) and throughput over the counted steps.

  Throughput is total examples over total iteration time, i.e. mean global batch divided by
  mean iteration time, so a few slow steps weigh in by how long they took.

  Example::

    it = iteration_summary(t)   # IterationSummary(steps=99, skipped=1, iteration_s=0.12, ...)
  """
  rows = _counted(t, skip)
  iteration = t.iteration_s()[rows]
  batch = t.batch()[rows]
  total = float(iteration.sum())
  return IterationSummary(
      steps=len(iteration), skipped=skip, iteration_s=float(iteration.mean()),
      global_batch=float(batch.mean()),
      samples_per_s=float(batch.sum()) / total if total > 0 else math.inf)


# (field, heading, format); fields shown in ms are seconds scaled by 1e3.
_COLUMNS = (('worker', 'worker', 'd'), ('slowdown', 'slowdown', '.2f'), ('share', 'share', '.1f'),
            *((f, f.removesuffix('_s') + ' ms', '.2f') for f in FIELDS if f.endswith('_s')),
            ('idle_fraction', 'idle', '.1%'))


def format_table(workers: Sequence[WorkerSummary], iteration: IterationSummary) -> str:
  """An aligned text table: one row per worker, then the iteration time and throughput.

  Example::

    print(format_table(summarise(t), iteration_summary(t)))
    # worker  slowdown  share  data ms  compute ms  dilation ms  comm ms  wait ms  step ms   idle
    #      0      1.00   40.0    50.00      200.00         0.00   100.00   400.00   800.00  50.0%
  """
  def cell(s: WorkerSummary, field: str, heading: str, spec: str) -> str:
    return format(getattr(s, field) * (1e3 if heading.endswith(' ms') else 1), spec)

  body = [[cell(s, *column) for column in _COLUMNS] for s in workers]
  head = [heading for _, heading, _ in _COLUMNS]
  widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
  lines = ['  '.join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *body]]
  rule = '-' * len(lines[0])
  skipped = f' after skipping {iteration.skipped}' if iteration.skipped else ''
  footer = (f'iteration {iteration.iteration_s * 1e3:.2f} ms (slowest worker) | '
            f'{iteration.samples_per_s:,.1f} samples/s | global batch '
            f'{iteration.global_batch:g} | {iteration.steps} steps{skipped}')
  return '\n'.join([lines[0], rule, *lines[1:], rule, footer])
