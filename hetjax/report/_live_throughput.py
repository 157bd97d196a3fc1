"""`telemetry_throughput` of a ``telemetry.jsonl`` still being written: the figure a run's
progress lines show (`hetjax.train.MetricsLogger`), the one ``summary.json`` and the report give
once the run is over.

Reading the whole file at every progress line would cost more the longer the run; this keeps
the figure's running sums (`SteadyCount`) and reads only the lines written since the last read.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import NamedTuple

from hetjax.report._throughput import SteadyCount, Throughput


class _Row(NamedTuple):
  """What the figure needs of one worker's row: its rows, its time, whether a compile held it
  up (`hetjax.report.telemetry_throughput`'s test: ``compile_s`` > 0 or not ``sampled``)."""

  share: int
  step_s: float
  compiling: bool


class LiveThroughput:
  """The steady throughput of a growing ``telemetry.jsonl``, as `telemetry_throughput` gives it
  for the whole file: per step the global batch (the workers' shares), the slowest worker's
  ``step_s`` and whether any worker's step was held up by a compile; the file's first step is
  the warm-up.

  A step counts once it is complete: a later step has begun, or it has as many rows as the
  step before it (a step's rows are written together, by `hetjax.runtime.TelemetryGatherer`).
  A line not yet finished is left for the next read, and one that does not parse is skipped
  (the report names it). A file that shrank (rewritten) is read again from its start.

  Example::

    live = LiveThroughput('runs/lbbsp/telemetry.jsonl')
    live.read().samples_per_s   # so far; at the end, summary.json's steady_samples_per_s
  """

  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path)
    self._reset()

  def _reset(self) -> None:
    self._offset = 0
    self._open: dict[int, dict[int, _Row]] = {}  # steps read but not yet counted
    self._count = SteadyCount(warmup=1)
    self._width = 0  # rows of the last step counted

  def read(self) -> Throughput:
    """The figure over the complete steps written so far (no file yet: no steps)."""
    for row in self._new_rows():
      try:
        step, worker = int(row['step']), int(row['worker'])
        self._open.setdefault(step, {})[worker] = _Row(
            int(row['share']), float(row['step_s']),
            float(row.get('compile_s', 0.0)) > 0 or not row.get('sampled', True))
      except (KeyError, TypeError, ValueError):
        continue
    steps = sorted(self._open)
    for i, step in enumerate(steps):
      rows = self._open[step]
      if i == len(steps) - 1 and not 0 < self._width <= len(rows):  # may be incomplete
        break
      self._count.add(step, sum(r.share for r in rows.values()),
                      max(r.step_s for r in rows.values()), any(r.compiling for r in rows.values()))
      self._width = len(rows)
      del self._open[step]
    return self._count.throughput()

  def _new_rows(self) -> list[dict]:
    """The JSON objects of the lines finished since the last read."""
    try:
      size = self.path.stat().st_size
    except FileNotFoundError:
      return []
    if size < self._offset:
      self._reset()
    with self.path.open('rb') as f:
      f.seek(self._offset)
      data = f.read()
    end = data.rfind(b'\n') + 1  # the lines finished so far
    self._offset += end
    rows = []
    for line in data[:end].decode('utf-8', errors='replace').splitlines():
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(row, dict):
        rows.append(row)
    return rows
