"""Progress lines and a JSONL metrics file, written from a loop hook without per-step syncs."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import IO, Any

import jax

from hetjax.train._loop import Hook, StepInfo


class MetricsLogger:
  """Keeps each step's device metrics and fetches them every ``every`` steps in one transfer.

  Each step becomes one JSON line ``{"step", "loss", "time_s", "returned_s"}``: ``time_s`` when
  its interval was fetched (the device had finished it), ``returned_s`` when the step returned
  to the host (dispatch may run ahead of the device: for a SchMP round with staleness k, the
  device had finished round t − k); steps that close an interval also carry ``samples_per_s``
  over that interval. A value that is not a finite number (a SchMP round that did not evaluate
  its objective, a diverged loss) is written as ``null``, so every line is strict JSON. The
  first interval includes compilation; `summary` reports throughput without it.

  Example::

    logger = MetricsLogger('run/metrics.jsonl', global_batch=256, total_steps=100, every=10)
    for info in training_steps(trainer, state, 100, hooks=[logger.hook()]):
      pass
    print(logger.summary())
  """

  def __init__(
      self,
      path: str | os.PathLike | None,
      global_batch: int,
      total_steps: int,
      every: int = 10,
      stream: IO[str] | None = None,
  ):
    self.global_batch, self.total_steps, self.every = global_batch, total_steps, every
    self._file = open(path, 'a') if path is not None else None  # noqa: SIM115 (closed in close)
    self._stream = sys.stdout if stream is None else stream
    self._pending: list[tuple[int, dict[str, jax.Array], float]] = []
    self._start = self._last_time = time.perf_counter()
    self._last_step: int | None = None
    self._intervals: list[tuple[int, float]] = []  # (steps, seconds) per flushed interval
    self.last: dict[str, Any] = {}

  def hook(self) -> Hook:
    return Hook(self._on_step, every=1)

  def _on_step(self, info: StepInfo) -> None:
    if self._last_step is None:
      self._last_step = info.step - 1
    self._pending.append((info.step, info.metrics, info.time))
    if info.step % self.every == 0 or info.step >= self.total_steps:
      self.flush()

  def flush(self) -> None:
    """Fetches the pending metrics (waiting for their steps) and writes them out."""
    if not self._pending:
      return
    values = jax.device_get([m for _, m, _ in self._pending])
    now = time.perf_counter()
    steps = self._pending[-1][0] - self._last_step
    rate = steps * self.global_batch / max(now - self._last_time, 1e-9)
    self._intervals.append((steps, now - self._last_time))
    for (step, _, returned), metrics in zip(self._pending, values, strict=True):
      row = {'step': step, **{k: _finite_or_none(float(v)) for k, v in metrics.items()},
             'time_s': round(now - self._start, 4),
             'returned_s': round(max(returned - self._start, 0.0), 4)}
      if step == self._pending[-1][0]:
        row['samples_per_s'] = round(rate, 2)
      if self._file:
        self._file.write(json.dumps(row) + '\n')
      self.last = row
    if self._file:
      self._file.flush()
    step = self._pending[-1][0]
    width = len(str(self.total_steps))
    loss = self.last.get('loss')
    loss = 'n/a' if loss is None else f'{loss:.4f}'
    print(f'step {step:>{width}}/{self.total_steps} | loss {loss} | '
          f'{rate:>10,.0f} samples/s | {now - self._start:7.1f} s', file=self._stream, flush=True)
    self._pending.clear()
    self._last_step, self._last_time = step, now

  def summary(self) -> dict[str, Any]:
    """Final loss, wall time, and throughput without the first (compiling) interval."""
    steady = self._intervals[1:] or self._intervals
    steps = sum(s for s, _ in steady)
    seconds = sum(t for _, t in steady)
    return {
        'final_step': self.last.get('step'),
        'final_loss': self.last.get('loss'),
        'wall_s': round(time.perf_counter() - self._start, 2),
        'steady_samples_per_s': round(steps * self.global_batch / seconds, 1) if seconds else None,
    }

  def close(self) -> None:
    self.flush()
    if self._file:
      self._file.close()
      self._file = None


def _finite_or_none(value: float) -> float | None:
  return value if math.isfinite(value) else None
