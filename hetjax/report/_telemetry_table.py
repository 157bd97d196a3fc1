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
from hetjax.report._throughput import Throughput, steady_throughput

TELEMETRY_FILE = 'telemetry.jsonl'
RUN_FILE = 'run.json'
FIELDS = ('share', 'slowdown', 'data_s', 'compute_s', 'dilation_s', 'comm_s', 'wait_s', 'step_s')
#: Fields newer runs write; absent in older telemetry, read as 0.
OPTIONAL_FIELDS = ('compile_s', 'load', 'overrun_s')
#: Whether a worker's step ran without a compile beside it; absent in older telemetry, True.
SAMPLED = 'sampled'
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
  sampled: np.ndarray  # bool; False: a compile ran beside the step (`WorkerTiming.sampled`)

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
  """Whole-run figures over the counted steps: those after the ``skip`` warm-up steps that
  no compile held up (``throughput`` says which were left out), or every step after the
  warm-up when none is steady (``samples_per_s`` is then None)."""

  iteration_s: float
  global_batch: float
  throughput: Throughput

  @property
  def samples_per_s(self) -> float | None:
    """Steady throughput: `hetjax.report.steady_throughput`, as in ``summary.json``; None
    when every step after the warm-up waited for a compile or ran beside one."""
    return self.throughput.samples_per_s

  @property
  def steps(self) -> int:
    """How many steps were counted."""
    return len(self.throughput.steps)

  @property
  def skipped(self) -> int:
    """How many leading warm-up steps were left out."""
    return len(self.throughput.warmup)


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
  arrays[SAMPLED] = np.array([[bool(rows[s, w].get(SAMPLED, True)) for w in workers]
                              for s in steps], dtype=bool).reshape(len(steps), len(workers))
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
      if not isinstance(row.get(SAMPLED, True), bool):
        raise ConfigError(f'{where}: {SAMPLED} must be true or false, got {row[SAMPLED]!r}')
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


def _after_warmup(t: Telemetry, skip: int) -> slice:
  """The steps after the first ``skip`` (warm-up), compiling ones included: what plots show."""
  if skip < 0 or skip >= len(t.steps):
    raise ConfigError(f'skip must be in [0, {len(t.steps)}) for {len(t.steps)} steps, got {skip}')
  return slice(skip, None)


def telemetry_throughput(t: Telemetry, skip: int = 1) -> Throughput:
  """`steady_throughput` of a run: per step, the global batch, the slowest worker's time, and
  whether any worker waited for a compile or ran beside one (``sampled`` false: it ran a new
  size as pieces while the size compiled, often overrunning its host by seconds); the others
  then waited for it at the barrier.

  Example::

    telemetry_throughput(load_telemetry('runs/lbbsp')).describe()
    # 'steps 2-100, 96 counted: 1 warm-up step and 3 compiling steps (2-3, 9) excluded'
  """
  _after_warmup(t, skip)
  compiling = (t.compile_s.max(axis=1) > 0) | ~t.sampled.all(axis=1)
  return steady_throughput(t.steps, t.batch().tolist(), t.iteration_s().tolist(),
                           compiling.tolist(), skip)


def summary_fields(run_dir: str | pathlib.Path, skip: int = 1) -> dict[str, Any]:
  """`Throughput.to_json` of the run in ``run_dir``, the figure ``python -m hetjax.report``
  prints; empty when the run wrote no ``telemetry.jsonl`` (an SPMD or pipeline run).

  ``experiments/train.py`` merges it into ``summary.json`` so that the two agree. Telemetry it
  cannot read gives ``steady_samples_per_s: None`` and the reason, not a failed run.

  Example::

    summary_fields('runs/lbbsp')   # {'steady_samples_per_s': 5123.4, 'steady_steps': 'steps …'}
  """
  if not (pathlib.Path(run_dir) / TELEMETRY_FILE).is_file():
    return {}
  try:
    return telemetry_throughput(load_telemetry(run_dir), skip).to_json()
  except ConfigError as e:
    return {'steady_samples_per_s': None, 'steady_steps': f'unknown: {e}'}


def _counted(t: Telemetry, skip: int) -> tuple[np.ndarray, Throughput]:
  """Row indices of the steps `telemetry_throughput` counts, and its result; every step after
  the warm-up when none is steady (a run shorter than its compiles: the means then include
  them, and the throughput has no figure, which `format_table` says)."""
  throughput = telemetry_throughput(t, skip)
  if not throughput.steps:
    return np.arange(skip, len(t.steps)), throughput
  counted = set(throughput.steps)
  return np.array([i for i, s in enumerate(t.steps) if s in counted]), throughput


def summarise(t: Telemetry, skip: int = 1) -> list[WorkerSummary]:
  """Per-worker means over the counted steps: those after the first ``skip`` (warm-up) that
  no compile held up, as in `iteration_summary` (every step after the warm-up when none is
  steady).

  Example::

    for s in summarise(load_telemetry('runs/het4')):
      print(s.worker, s.slowdown, f'{s.idle_fraction:.0%}')   # 3 3.0 0%  /  0 1.0 64% ...
  """
  rows, _ = _counted(t, skip)
  out = []
  for i, worker in enumerate(t.workers):
    mean = {f: float(getattr(t, f)[rows, i].mean()) for f in FIELDS}
    total_step = float(t.step_s[rows, i].sum())
    idle = float(t.wait_s[rows, i].sum()) / total_step if total_step > 0 else 0.0
    out.append(WorkerSummary(worker=worker, idle_fraction=idle, **mean))
  return out


def iteration_summary(t: Telemetry, skip: int = 1) -> IterationSummary:
  """Mean iteration time (slowest worker per step) and throughput over the counted steps.

  Throughput is `telemetry_throughput`: total examples over total iteration time of the steps
  after the ``skip`` warm-up ones that no compile held up, so a few slow steps weigh in by
  how long they took, and a run's ``summary.json`` gives the same figure.

  Example::

    it = iteration_summary(t)   # iteration_s=0.12, global_batch=256.0, throughput=...
    it.samples_per_s, it.throughput.describe()   # 2133.3, 'steps 2-100, 99 counted: ...'
  """
  rows, throughput = _counted(t, skip)
  return IterationSummary(iteration_s=float(t.iteration_s()[rows].mean()),
                          global_batch=float(t.batch()[rows].mean()), throughput=throughput)


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
  if iteration.samples_per_s is None:
    rate = ('no steady samples/s: the means cover every step after the warm-up, compiles '
            'included; run more steps')
  else:
    rate = f'{iteration.samples_per_s:,.1f} samples/s'
  footer = (f'iteration {iteration.iteration_s * 1e3:.2f} ms (slowest worker) | {rate} | '
            f'global batch {iteration.global_batch:g} | {iteration.throughput.describe()}')
  return '\n'.join([lines[0], rule, *lines[1:], rule, footer])
