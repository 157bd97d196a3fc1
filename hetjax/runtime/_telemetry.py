"""Per-step, per-worker timings, gathered to worker 0 and written as JSONL."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence
from typing import IO

from hetjax.core import WorkerTiming
from hetjax.runtime._kv import Channel


def split_collective(stats: Sequence[WorkerTiming]) -> list[dict]:
  """Splits each worker's collective time into communication and waiting at the barrier.

  The worker that arrives last at the all-reduce waits for nobody, so its collective time is
  the communication itself; every other worker waited ``collective_s − comm_s`` for it. Clocks
  of different hosts are never compared.

  Returns:
    one dict per worker: the stats' fields plus ``comm_s`` and ``wait_s``.
  """
  comm = min(s.collective_s for s in stats)
  return [dataclasses.asdict(s) | {'comm_s': comm, 'wait_s': s.collective_s - comm}
          for s in sorted(stats, key=lambda s: s.worker)]


class TelemetryGatherer:
  """Publishes each worker's `WorkerTiming` and writes everyone's rows on worker 0.

  Every worker calls `record` after each step. Worker 0 collects step s−1 while recording step
  s: by then every worker has published s−1 (it did so before joining step s's collective), so
  the read never waits. `close` collects the last step.

  Example::

    gatherer = TelemetryGatherer(Channel('run'), worker, workers, 'run/telemetry.jsonl')
    gatherer.record(stats)   # every step, every worker
    gatherer.close()
  """

  def __init__(self, channel: Channel | None, worker: int, workers: int,
               path: str | os.PathLike | None = None, timeout_s: float = 60.0):
    self.channel, self.worker, self.workers, self.timeout_s = channel, worker, workers, timeout_s
    self.path = None if path is None else pathlib.Path(path)
    self._file: IO[str] | None = open(path, 'a') if (path and worker == 0) else None  # noqa: SIM115
    self._pending: int | None = None

  def record(self, stats: WorkerTiming) -> None:
    if self.workers == 1 or self.channel is None:
      self._write([stats])
      return
    self.channel.set(f'telemetry/{stats.step}/{self.worker}', dataclasses.asdict(stats))
    if self.worker == 0:
      if self._pending is not None:
        self._collect(self._pending)
      self._pending = stats.step

  def _collect(self, step: int) -> None:
    stats = []
    for w in range(self.workers):
      key = f'telemetry/{step}/{w}'
      stats.append(WorkerTiming(**self.channel.get(key, self.timeout_s)))
      self.channel.delete(key)
    self._write(stats)

  def _write(self, stats: Sequence[WorkerTiming]) -> None:
    if self.worker != 0:
      return
    rows = split_collective(stats)
    if self._file:
      self._file.write(''.join(json.dumps(r) + '\n' for r in rows))
      self._file.flush()

  def close(self) -> None:
    if self.worker == 0 and self._pending is not None:
      self._collect(self._pending)
      self._pending = None
    if self._file:
      self._file.close()
      self._file = None
