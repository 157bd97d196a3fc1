"""Progress lines and a JSONL metrics file, written from a loop hook without per-step syncs."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NamedTuple

import jax

from hetjax._errors import ConfigError
from hetjax.core import StepStats, WorkerTiming
from hetjax.report import Launch, LiveThroughput, Throughput, steady_throughput
from hetjax.train._loop import Hook, StepInfo

#: ``sink(step, scalars)``: takes every record's numbers (`MetricsLogger`'s ``sinks``), e.g.
#: `hetjax.report.TensorBoardWriter.scalars`.
Sink = Callable[[int, dict[str, float]], None]
#: Record fields a sink does not get: the step is its own argument, the rest are clock readings.
_NOT_SCALARS = ('step', 'time_s', 'returned_s', 'start_unix_s', 'launch', 'launched_unix_s')
#: Record fields the logger writes itself; ``extra`` may not return them.
_OWN_FIELDS = (*_NOT_SCALARS, 'held_up_by_compile', 'hooks_s', 'samples_per_s', 'tokens_per_s',
               'mfu')


class _Pending(NamedTuple):
  """A step until its interval is fetched: its device metrics (with ``extra``'s fields), when
  it returned, whether a compile held it up, and each worker's rows and busy seconds."""

  step: int
  values: dict[str, Any]
  returned: float
  held_up: bool
  rows: tuple[int, ...]
  busy_s: tuple[float, ...]


class MetricsLogger:
  """Keeps each step's device metrics and fetches them every ``every`` steps in one transfer.

  Each step becomes one JSON line ``{"step", "loss", "time_s", "returned_s"}``: ``time_s`` when
  its interval was fetched (the device had finished it), ``returned_s`` when the step returned
  to the host (dispatch may run ahead of the device: for a SchMP round with staleness k, the
  device had finished round t − k). A value that is not a finite number (a SchMP round that did
  not evaluate its objective, a diverged loss) is written as ``null``, so every line is strict
  JSON. Some lines carry more, only where it applies:

  * ``extra(info)``'s fields on every line (a learning rate, an evaluation's ``eval_loss`` on
    the steps it ran): device scalars are fetched with the loss, in the same transfer;
  * ``held_up_by_compile: true`` on a step a compile held up (`held_up_by_compile`);
  * ``hooks_s: {name: seconds}``: time spent in hooks wrapped by `timed` (a checkpoint's save)
    during this step's interval, which its time includes (calls under 0.1 ms left out);
  * ``start_unix_s`` on the logger's first line: its start on the Unix clock (``time_s`` counts
    from it), so the launches of a resumed or restarted run line up
    (`hetjax.report.goodput`); beside it ``launch`` (how this launch began, a `Launch` value)
    and ``launched_unix_s`` (when it began) where they are given.

  Every ``every`` steps a progress line gives the steady throughput so far and the time left,
  e.g. ``step 40/60 | loss 0.0911 |      1,024 samples/s |    12.3 s | eta 5.0s``; that step's
  JSON line carries the figure as ``samples_per_s``, and beside it ``tokens_per_s`` (samples/s
  × ``tokens_per_example``) and ``mfu`` (``flops_per_step`` × steps/s ÷ ``peak_flops``) when
  they are given. The figure is `throughput`: the one definition of samples/s that
  ``summary.json`` and ``python -m hetjax.report`` give too (`hetjax.report.steady_throughput`:
  the first step, which compiles, and every step that a compile held up left out). With
  ``telemetry`` (modes shares and tokens) a step's time is its slowest worker's, read from the
  run's ``telemetry.jsonl`` as it is written (`hetjax.report.LiveThroughput`; a step's rows
  arrive a step or two after it, so a line covers the steps before, and the last step is
  fetched by `close`: closed after the telemetry's writer, its line covers every step, as
  ``summary.json`` does); without, the interval between steps on this process's clock
  (`steady`). The time left is wall-clock time, so it goes at `steady`'s pace whatever the
  figure (``hetjax/report/_throughput.py`` says why the two differ). `summary` gives the final
  figures. On a terminal (``stream`` is a TTY) the progress is one live line drawn by ``rich``
  instead: step/total, a bar, the loss, the rate and the time left.

  Example::

    tb = hetjax.report.TensorBoardWriter('run/tensorboard')
    logger = MetricsLogger('run/metrics.jsonl', global_batch=256, total_steps=100, every=10,
                           sinks=[tb.scalars], tokens_per_example=63)
    hooks = [logger.hook(), logger.timed(checkpointer_hook, 'checkpoint')]
    for info in training_steps(trainer, state, 100, hooks=hooks):
      pass
    logger.close(); tb.close()
    print(logger.summary())   # {..., 'steady_samples_per_s': 812.3, 'steady_tokens_per_s': …}

  Args:
    path: the JSONL file (appended to); None: progress only.
    global_batch: examples per step.
    total_steps: the step the run stops at (for the progress and the time left).
    every: steps between progress lines (and fetches).
    stream: where progress goes (default stdout).
    sinks: each gets ``(step, {name: number})`` for every line written: its numbers (the step
      and clock readings aside; ``hooks_s`` as ``hooks_s/NAME``) and, in a step of several
      workers, each one's ``share/worker_I`` (rows) and ``busy_s/worker_I`` (its compute,
      emulated padding included). `hetjax.report.TensorBoardWriter.scalars` is one.
    extra: ``extra(info) -> {name: value}`` merged into the step's line: numbers (device
      scalars too), booleans, strings or None; not a field the logger writes itself.
    tokens_per_example: > 0: tokens in one example (a language model's positions), for
      ``tokens_per_s``.
    flops_per_step, peak_flops: both > 0: the FLOPs of one whole step (every device's part,
      `hetjax.bench.step_flops`) and the peak FLOP/s of all the devices that run it together
      (devices × `hetjax.runtime.peak_flops`), for ``mfu``.
    live: draw the progress as one live line; None: when ``stream`` is a TTY.
    telemetry: the run's ``telemetry.jsonl`` (modes shares and tokens), whose steps' times the figure
      reads; None: the steps' intervals on this clock.
    launch: how this launch of the run began (a fresh run, ``--resume``, a restart by the
      launcher), written on its first line for `hetjax.report.goodput`; None: not written.
    launched_unix_s: when this launch began (Unix seconds; the runner's call), written beside
      it: goodput counts the start-up of a resumed launch from there.

  Raises:
    ConfigError: a negative or non-finite ``tokens_per_example``, ``flops_per_step`` or
      ``peak_flops``; at a step, ``extra`` returned a field the logger writes (``loss``,
      ``mfu``, …).
  """

  def __init__(
      self,
      path: str | os.PathLike | None,
      global_batch: int,
      total_steps: int,
      every: int = 10,
      stream: IO[str] | None = None,
      *,
      sinks: Sequence[Sink] = (),
      extra: Callable[[StepInfo], Mapping[str, Any]] | None = None,
      tokens_per_example: int = 0,
      flops_per_step: float = 0.0,
      peak_flops: float = 0.0,
      live: bool | None = None,
      telemetry: str | os.PathLike | None = None,
      launch: Launch | None = None,
      launched_unix_s: float | None = None,
  ):
    for name, value in (('tokens_per_example', tokens_per_example),
                        ('flops_per_step', flops_per_step), ('peak_flops', peak_flops)):
      if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f'MetricsLogger: {name} must be a finite number >= 0 (0: not '
                          f'recorded), got {value!r}')
    self.global_batch, self.total_steps, self.every = global_batch, total_steps, every
    self.sinks, self.extra = tuple(sinks), extra
    self.tokens_per_example = tokens_per_example
    self.flops_per_step, self.peak_flops = float(flops_per_step), float(peak_flops)
    self._file = open(path, 'a') if path is not None else None  # noqa: SIM115 (closed in close)
    self._stream = sys.stdout if stream is None else stream
    live = _is_tty(self._stream) if live is None else live
    self._bar = _LiveLine(self._stream, total_steps) if live else None
    self._pending: list[_Pending] = []
    self._live = None if telemetry is None else LiveThroughput(telemetry)
    self._launch = {} if launch is None else {'launch': Launch(launch).value}
    if launched_unix_s is not None:
      self._launch['launched_unix_s'] = round(float(launched_unix_s), 3)
    self._start = self._last_time = time.perf_counter()
    self._start_unix = time.time()
    # Fetched steps, at most two entries per fetch: its steady steps and those a compile held
    # up, each (last step, steps, seconds, held up); the same figure as one entry per step.
    self._entries: list[tuple[int, int, float, bool]] = []
    # Calls of `timed` hooks not yet given to a step's interval: (start, name, seconds).
    self._calls: list[tuple[float, str, float]] = []
    self._hook_totals: dict[str, float] = {}
    self.last: dict[str, Any] = {}

  def hook(self) -> Hook:
    return Hook(self._on_step, every=1)

  def timed(self, hook: Hook, name: str) -> Hook:
    """``hook``, timed: the seconds each call takes go into the line of the step whose interval
    holds it (``hooks_s``) and into `summary`'s ``hooks_s`` totals. What goodput needs to tell
    a checkpoint's save from training (`hetjax.report.goodput`).

    Example::

      hooks = [logger.hook(), logger.timed(ckpt.hook(meta, every=100), 'checkpoint')]
    """
    def run(info: StepInfo) -> None:
      start = time.perf_counter()
      try:
        hook.fn(info)
      finally:
        seconds = time.perf_counter() - start
        self._calls.append((start, name, seconds))
        self._hook_totals[name] = self._hook_totals.get(name, 0.0) + seconds

    return Hook(run, every=hook.every, at_end=hook.at_end)

  def _on_step(self, info: StepInfo) -> None:
    first = not self._entries and not self._pending
    values = dict(info.metrics)
    if self.extra is not None:
      fields = self.extra(info)
      own = [k for k in fields if k in _OWN_FIELDS or k in values]
      if own:
        raise ConfigError(f'MetricsLogger: extra returned {", ".join(map(repr, own))}, which the '
                          'logger writes itself (tokens/s and MFU: tokens_per_example, '
                          'flops_per_step and peak_flops)')
      values.update(fields)
    stats = info.stats
    several = stats is not None and len(stats.rows) > 1
    self._pending.append(_Pending(
        info.step, values, info.time, held_up_by_compile(stats),
        tuple(stats.rows) if several else (), tuple(stats.compute_s) if several else ()))
    shown = info.step % self.every == 0 or info.step >= self.total_steps
    if shown and self._live is not None and info.step >= self.total_steps:
      return  # fetched by `close`, once the telemetry holds this step's rows too
    if first or shown:  # the first step on its own: the warm-up
      self._fetch(show=shown)

  def flush(self) -> None:
    """Fetches the pending metrics (waiting for their steps), writes them out and prints a
    progress line."""
    self._fetch(show=True)

  def throughput(self) -> Throughput:
    """The steady throughput the progress lines and `summary` give: ``telemetry``'s steps so
    far where the logger has it, else `steady`."""
    return self.steady() if self._live is None else self._live.read()

  def steady(self) -> Throughput:
    """`hetjax.report.steady_throughput` of the steps fetched so far, timed by this process's
    clock: the first (the warm-up) and those a compile held up left out. A step's time runs
    from the end of the one before to its return, or to its fetch if it is the last of one
    (the device may still have been busy with it when it returned: async dispatch). Steps are
    grouped by fetch, each group named by its last step. The pace of the time left, and the
    figure itself without ``telemetry``."""
    return steady_throughput([e[0] for e in self._entries],
                             [e[1] * self.global_batch for e in self._entries],
                             [e[2] for e in self._entries], [e[3] for e in self._entries])

  def _fetch(self, show: bool) -> None:
    if not self._pending:
      return
    values = jax.device_get([p.values for p in self._pending])
    now = time.perf_counter()
    step = self._pending[-1].step
    hooks = self._time_steps(now)
    rate = _finite_or_none(self.throughput().samples_per_s)
    pace = rate if self._live is None else _finite_or_none(self.steady().samples_per_s)
    for pending, fields, spent in zip(self._pending, values, hooks, strict=True):
      row = {'step': pending.step, **{k: _json_value(v) for k, v in fields.items()},
             'time_s': round(now - self._start, 4),
             'returned_s': round(max(pending.returned - self._start, 0.0), 4)}
      if not self.last:
        row |= {'start_unix_s': round(self._start_unix, 3), **self._launch}
      if pending.held_up:
        row['held_up_by_compile'] = True
      spent = {k: r for k, v in spent.items() if (r := round(v, 4)) > 0}  # not no-op calls
      if spent:
        row['hooks_s'] = spent
      if show and pending.step == step:
        row |= self._rates(rate)
      if self._file:
        self._file.write(json.dumps(row) + '\n')
      self._send(row, pending)
      self.last = row
    if self._file:
      self._file.flush()
    if show:
      self._show(step, rate, pace, now - self._start)
    self._pending.clear()
    self._last_time = now

  def _rates(self, rate: float | None) -> dict[str, float | None]:
    """``samples_per_s``, and ``tokens_per_s`` and ``mfu`` where configured, at ``rate``."""
    out = {'samples_per_s': None if rate is None else round(rate, 2)}
    if self.tokens_per_example:
      out['tokens_per_s'] = None if rate is None else round(rate * self.tokens_per_example, 2)
    if self.flops_per_step and self.peak_flops:
      mfu = None if rate is None else self.flops_per_step * rate / self.global_batch
      out['mfu'] = None if mfu is None else float(f'{mfu / self.peak_flops:.4g}')
    return out

  def _send(self, row: dict[str, Any], pending: _Pending) -> None:
    """Gives the row's numbers, and each worker's share and busy time, to every sink."""
    if not self.sinks:
      return
    scalars = {k: float(v) for k, v in row.items()
               if k not in _NOT_SCALARS and _is_number(v) and math.isfinite(v)}
    scalars |= {f'hooks_s/{k}': v for k, v in row.get('hooks_s', {}).items()}
    for i, (rows, busy) in enumerate(zip(pending.rows, pending.busy_s, strict=True)):
      scalars[f'share/worker_{i}'] = float(rows)
      if math.isfinite(busy):
        scalars[f'busy_s/worker_{i}'] = float(busy)
    for sink in self.sinks:
      sink(pending.step, scalars)

  def _time_steps(self, now: float) -> list[dict[str, float]]:
    """Adds the pending steps to the entries `steady` reads, fetched at ``now``; returns, per
    pending step, the seconds `timed` hooks spent in its interval."""
    groups: dict[bool, list] = {}  # held up -> [last step, steps, seconds]
    spent: list[dict[str, float]] = []
    begin = self._last_time
    for i, pending in enumerate(self._pending):
      end = now if i == len(self._pending) - 1 else max(pending.returned, begin)
      group = groups.setdefault(pending.held_up, [pending.step, 0, 0.0])
      group[0], group[1], group[2] = pending.step, group[1] + 1, group[2] + end - begin
      inside: dict[str, float] = {}
      for start, name, seconds in self._calls:
        if start < end:
          inside[name] = inside.get(name, 0.0) + seconds
      self._calls = [c for c in self._calls if c[0] >= end]
      spent.append(inside)
      begin = end
    self._entries += [(last, n, seconds, held_up)
                      for held_up, (last, n, seconds) in sorted(groups.items())]
    return spent

  def _show(self, step: int, rate: float | None, pace: float | None, elapsed: float) -> None:
    if self._bar is not None:
      self._bar.update(step, self._status(step, rate, pace, elapsed))
    else:
      print(self._line(step, rate, pace, elapsed), file=self._stream, flush=True)

  def _status(self, step: int, rate: float | None, pace: float | None, elapsed: float) -> str:
    """``loss 0.0911 |      1,024 samples/s |    12.3 s | eta 5.0s``: a progress line after
    its step, ``rate`` the figure and ``pace`` the clock's samples/s that the time left goes
    at; ``n/a`` for either until a steady step was counted."""
    loss = self.last.get('loss')
    loss = 'n/a' if loss is None else f'{loss:.4f}'
    left = max(self.total_steps - step, 0) * self.global_batch
    # Rounded as summary.json's `steady_samples_per_s` is (0.1) before it is shown whole, so the
    # last line prints the summary's figure to the digit (1945.46 and 1945.5 print 1,945 and 1,946).
    speed = 'n/a' if rate is None else f'{round(rate, 1):,.0f}'
    eta = 'n/a' if pace is None or pace <= 0 else format_duration(left / pace)
    return f'loss {loss} | {speed:>10} samples/s | {elapsed:7.1f} s | eta {eta}'

  def _line(self, step: int, rate: float | None, pace: float | None, elapsed: float) -> str:
    """``step 40/60 | loss 0.0911 |      1,024 samples/s |    12.3 s | eta 5.0s``."""
    head = f'step {step:>{len(str(self.total_steps))}}/{self.total_steps} | '
    return head + self._status(step, rate, pace, elapsed)

  def summary(self) -> dict[str, Any]:
    """Final loss, wall time, and the steady throughput (`throughput`: the progress lines'
    figure, read once more: under telemetry, every step whose rows are written by now);
    ``steady_tokens_per_s`` and ``steady_mfu`` over the same steps where configured, and
    ``hooks_s``, the seconds each `timed` hook took in all, where there are any."""
    throughput = self.throughput()
    out = {
        'final_step': self.last.get('step'),
        'final_loss': self.last.get('loss'),
        'wall_s': round(time.perf_counter() - self._start, 2),
        'steady_samples_per_s': throughput.to_json()['steady_samples_per_s'],
    }
    rates = self._rates(_finite_or_none(throughput.samples_per_s))
    if 'tokens_per_s' in rates:
      out['steady_tokens_per_s'] = rates['tokens_per_s']
    if 'mfu' in rates:
      out['steady_mfu'] = rates['mfu']
    if self._hook_totals:
      out['hooks_s'] = {k: round(v, 4) for k, v in self._hook_totals.items()}
    return out

  def close(self) -> None:
    """Fetches what is pending and prints the last line: under ``telemetry``, the last step's
    (close the telemetry's writer first, and the line covers every step, as `summary` does)."""
    self.flush()
    if self._bar is not None:
      self._bar.close()
      self._bar = None
    if self._file:
      self._file.close()
      self._file = None


class _LiveLine:
  """One progress line that ``rich`` redraws in place: ``step 40/60 ━━━━━━╸━━━ loss 0.0911 |
  … | eta 5.0s``. Redrawn at each progress fetch only (no refresh thread); what the program
  prints meanwhile goes above it."""

  def __init__(self, stream: IO[str], total: int):
    from rich.console import Console  # imported for a terminal only
    from rich.progress import BarColumn, Progress, TextColumn

    width = len(str(total))
    self._progress = Progress(
        TextColumn(f'step {{task.completed:>{width}.0f}}/{total}'), BarColumn(),
        TextColumn('{task.fields[status]}'),
        console=Console(file=stream, force_terminal=True), auto_refresh=False)
    self._task = self._progress.add_task('train', total=total, status='')
    self._progress.start()

  def update(self, step: int, status: str) -> None:
    self._progress.update(self._task, completed=step, status=status)
    self._progress.refresh()

  def close(self) -> None:
    self._progress.stop()


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


def _is_tty(stream: IO[str]) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):  # no isatty, or a closed stream
    return False


def _is_number(value: Any) -> bool:
  return isinstance(value, int | float) and not isinstance(value, bool)


def _json_value(value: Any) -> Any:
  """A fetched metric as JSON: a number as a float (``null`` unless finite), booleans, strings
  and None as they are."""
  if value is None or isinstance(value, bool | str):
    return value
  return _finite_or_none(float(value))


def _finite_or_none(value: float | None) -> float | None:
  return value if value is not None and math.isfinite(value) else None
