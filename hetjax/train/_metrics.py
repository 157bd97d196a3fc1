"""Progress lines and a JSONL metrics file, written from a loop hook without per-step syncs."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import IO, Any

import jax

from hetjax.core import StepStats, WorkerTiming
from hetjax.report._throughput import Throughput, steady_throughput
from hetjax.train._loop import Hook, StepInfo


class MetricsLogger:
  """Keeps each step's device metrics and fetches them every ``every`` steps in one transfer.

  Each step becomes one JSON line ``{"step", "loss", "time_s", "returned_s"}``: ``time_s`` when
  its interval was fetched (the device had finished it), ``returned_s`` when the step returned
  to the host (dispatch may run ahead of the device: for a SchMP round with staleness k, the
  device had finished round t − k). A value that is not a finite number (a SchMP round that did
  not evaluate its objective, a diverged loss) is written as ``null``, so every line is strict
  JSON.

  Every ``every`` steps a progress line gives the steady throughput so far and the time left
  at it, e.g. ``step 40/60 | loss 0.0911 |      1,024 samples/s |    12.3 s | eta 5.0s`` (20
  steps of 256 rows left at 1,024 samples/s); that step's JSON line carries the figure as
  ``samples_per_s``. Steady is `hetjax.report.steady_throughput` of the steps (`steady`), the
  definition ``summary.json`` and ``python -m hetjax.report`` use: the first step (it
  compiles; fetched on its own) is left out as the warm-up, and so is every step that a
  compile held up (`held_up_by_compile`). `summary` gives the final figure.

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
    # (step, device metrics, when it returned, whether a compile held it up) until fetched.
    self._pending: list[tuple[int, dict[str, jax.Array], float, bool]] = []
    self._start = self._last_time = time.perf_counter()
    # Fetched steps, at most two entries per fetch: its steady steps and those a compile held
    # up, each (last step, steps, seconds, held up); the same figure as one entry per step.
    self._entries: list[tuple[int, int, float, bool]] = []
    self.last: dict[str, Any] = {}

  def hook(self) -> Hook:
    return Hook(self._on_step, every=1)

  def _on_step(self, info: StepInfo) -> None:
    first = not self._entries and not self._pending
    self._pending.append((info.step, info.metrics, info.time, held_up_by_compile(info.stats)))
    shown = info.step % self.every == 0 or info.step >= self.total_steps
    if first or shown:  # the first step on its own: the warm-up
      self._fetch(show=shown)

  def flush(self) -> None:
    """Fetches the pending metrics (waiting for their steps), writes them out and prints a
    progress line."""
    self._fetch(show=True)

  def steady(self) -> Throughput:
    """`hetjax.report.steady_throughput` of the steps fetched so far: the first (the warm-up)
    and those a compile held up left out. A step's time runs from the end of the one before
    to its return, or to its fetch if it is the last of one (the device may still have been
    busy with it when it returned: async dispatch). Steps are grouped by fetch, each group
    named by its last step."""
    return steady_throughput([e[0] for e in self._entries],
                             [e[1] * self.global_batch for e in self._entries],
                             [e[2] for e in self._entries], [e[3] for e in self._entries])

  def _fetch(self, show: bool) -> None:
    if not self._pending:
      return
    values = jax.device_get([m for _, m, _, _ in self._pending])
    now = time.perf_counter()
    step = self._pending[-1][0]
    self._time_steps(now)
    rate = _finite_or_none(self.steady().samples_per_s)
    for (at, _, returned, _), metrics in zip(self._pending, values, strict=True):
      row = {'step': at, **{k: _finite_or_none(float(v)) for k, v in metrics.items()},
             'time_s': round(now - self._start, 4),
             'returned_s': round(max(returned - self._start, 0.0), 4)}
      if show and at == step:
        row['samples_per_s'] = None if rate is None else round(rate, 2)
      if self._file:
        self._file.write(json.dumps(row) + '\n')
      self.last = row
    if self._file:
      self._file.flush()
    if show:
      print(self._line(step, rate, now - self._start), file=self._stream, flush=True)
    self._pending.clear()
    self._last_time = now

  def _time_steps(self, now: float) -> None:
    """Adds the pending steps to the entries `steady` reads, fetched at ``now``."""
    groups: dict[bool, list] = {}  # held up -> [last step, steps, seconds]
    begin = self._last_time
    for i, (step, _, returned, held_up) in enumerate(self._pending):
      end = now if i == len(self._pending) - 1 else max(returned, begin)
      group = groups.setdefault(held_up, [step, 0, 0.0])
      group[0], group[1], group[2] = step, group[1] + 1, group[2] + end - begin
      begin = end
    self._entries += [(last, n, seconds, held_up)
                      for held_up, (last, n, seconds) in sorted(groups.items())]

  def _line(self, step: int, rate: float | None, elapsed: float) -> str:
    """``step 40/60 | loss 0.0911 |      1,024 samples/s |    12.3 s | eta 5.0s``; ``n/a`` for the
    rate and the time left until a steady interval was fetched."""
    width = len(str(self.total_steps))
    loss = self.last.get('loss')
    loss = 'n/a' if loss is None else f'{loss:.4f}'
    left = max(self.total_steps - step, 0) * self.global_batch
    speed = 'n/a' if rate is None else f'{rate:,.0f}'
    eta = 'n/a' if rate is None or rate <= 0 else format_duration(left / rate)
    return (f'step {step:>{width}}/{self.total_steps} | loss {loss} | {speed:>10} samples/s | '
            f'{elapsed:7.1f} s | eta {eta}')

  def summary(self) -> dict[str, Any]:
    """Final loss, wall time, and the steady throughput (`steady`: the progress lines' figure)."""
    return {
        'final_step': self.last.get('step'),
        'final_loss': self.last.get('loss'),
        'wall_s': round(time.perf_counter() - self._start, 2),
        'steady_samples_per_s': self.steady().to_json()['steady_samples_per_s'],
    }

  def close(self) -> None:
    self.flush()
    if self._file:
      self._file.close()
      self._file = None


def held_up_by_compile(stats: StepStats | None) -> bool:
  """Whether a compile held up a step, as far as this worker can tell: it waited for one
  (``compile_s``), or, in a per-worker step (its ``local`` is a `WorkerTiming`), some worker's
  time was no sample because a compile of its programs ran beside the step (``sampled``, which
  every worker learns through the combine). SPMD, pipeline and SchMP steps mark every time
  unsampled for other reasons, so only their ``compile_s`` counts."""
  if stats is None:
    return False
  if float(stats.compile_s) > 0:
    return True
  return isinstance(stats.local, WorkerTiming) and not all(stats.sampled)


def format_duration(seconds: float) -> str:
  """``0.4s``, ``42s``, ``1m12s``, ``2h03m``: a time left, to a tenth of a second below 10 s.

  Example::

    format_duration(72.4)   # '1m12s'
  """
  if seconds < 9.95:
    return f'{max(seconds, 0.0):.1f}s'
  seconds = round(seconds)
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'


def _finite_or_none(value: float | None) -> float | None:
  return value if value is not None and math.isfinite(value) else None
