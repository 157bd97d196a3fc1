"""A stall watchdog over the coordination channel: names the worker that stopped making progress.

A JAX job whose worker is alive but stuck hangs forever: its peers wait in a collective, and the
coordination service still gets the stuck process's heartbeats. Here every worker publishes two
things on the `Channel`: its last finished step (`ProgressWatchdog.report`, called after a
step's hooks) and a heartbeat from a thread, once a second. Worker 0 watches both
(`StallDetector`) and, when the slowest worker's step has not advanced for the stall timeout,
names the culprit:

* a worker whose heartbeat stopped too (stopped by SIGSTOP, or wedged with the interpreter
  held); else
* the workers behind the others (they did not finish the step their peers wait in); else
* nobody: every worker is stuck in the same step.

It prints one line, leaves the verdict for the launcher (`hetjax.runtime._verdict`), and ends
the job by exiting worker 0 with status 3. Each report is one key-value write (one round
trip to the coordinator); the watcher reads 3 keys per worker every half second.

The timeout is the one given, or it follows the step time measured from the first step on, so
that a healthy job is never ended for being slow:

* nothing is declared before every worker finished a step (starting, restoring and compiling
  are not a stall, however long they take);
* the first measured step time is the time from the watchdog's start (just before the first
  step) until the slowest worker finished its first step, compilation included; every later
  advance of the slowest worker adds its time per step (the last 20 are kept);
* the timeout is five times their median, never under 10 s.

Worked example: 4 workers whose step takes 14 s and whose first step is done 34 s after the
start (20 s of it compiling). Until step 2 is done the timeout is 5 x 34 = 170 s; once step 3
is done it is 5 x median(34, 14, 14) = 70 s. A worker that hangs in step 6 is named 70 s after
every worker had finished step 5. (A fixed 10 s timeout, with nothing measured, would end that
job 10 s into its second step.)

A worker inside a known long phase (`ProgressWatchdog.busy`: a checkpoint save, an evaluation)
is not stalled: its heartbeat thread publishes the phase's name as ``busy/{w}`` at its next beat
(a phase under a second is never published; nothing is written while the phase stays the same)
and ``''`` at the first beat after it ends. While any worker is busy the step timeout does not
apply; the phase has a bound of its own, `BUSY_FACTOR` times the step timeout and never under
`BUSY_FLOOR_S`, after which its worker is named as stuck in it. Once no worker is busy, the step
timeout counts again, from the last poll that saw one busy.

Worked example: 4 workers whose step takes 80 ms (timeout: the 10 s floor), and the last step's
checkpoint save takes 25 s (orbax compiles a slice program per array on its first save). Worker
0's phase is seen within 1.5 s of its start, so at 10 s the job is not stalled; the bound is
max(120, 10 x 10) = 120 s, the save ends at 25 s, the step is reported, the job ends normally. A
save that hangs is named 120 s after its phase was first seen: ``worker 0 stuck in its checkpoint
save for 120.0 s after step 59``.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from hetjax.runtime._verdict import write_verdict

STALL_EXIT_STATUS = 3
FLOOR_S = 10.0
FACTOR = 5.0
BUSY_FLOOR_S = 120.0  # the least a long phase (a checkpoint save) may take
BUSY_FACTOR = 10.0  # a long phase may take this many step timeouts
_KEPT_STEP_TIMES = 20
_HEARTBEAT_S = 1.0
_POLL_S = 0.5


class StallDetector:
  """Worker 0's reading of every worker's progress and heartbeat: is the job stalled, and who is
  to blame (the rule in the module docstring).

  It is fed the values it polled and the time it polled them, and keeps no thread or channel of
  its own, so tests drive it with a scripted clock. Example::

    detector = StallDetector(4, started=time.monotonic())
    ...
    verdict = detector.observe(time.monotonic(), {'progress/0': 7, 'alive/0': 120,
                                                  'busy/0': 'checkpoint save', ...})
    if verdict is not None:
      worker, cause = verdict   # worker None: every worker is stuck in the same step

  Args:
    workers: how many workers publish ``progress/{w}``, ``alive/{w}`` and ``busy/{w}``.
    timeout_s: seconds without progress that make a stall; None: follow the step time.
    started: when watching began (`time.monotonic`), just before the first step: the first
      measured step time counts from here.
    names: how to name each worker (default ``worker i``).
  """

  def __init__(self, workers: int, *, timeout_s: float | None = None, started: float,
               names: Sequence[str] | None = None):
    self.workers, self._timeout_s, self._started = workers, timeout_s, started
    self._names = list(names) if names is not None else [f'worker {w}' for w in range(workers)]
    self._seen: dict[str, tuple[object, float]] = {}  # key -> (value, when it last changed)
    self._step_times: collections.deque[float] = collections.deque(maxlen=_KEPT_STEP_TIMES)
    self._slowest: int | None = None  # the slowest worker's last step, once all finished one
    self._since = started  # when the slowest worker's step last advanced
    self._busy_seen = -math.inf  # the last poll that saw a worker busy

  @property
  def keys(self) -> list[str]:
    """The channel keys to poll."""
    return [f'{kind}/{w}' for w in range(self.workers)
            for kind in ('progress', 'alive', 'busy')]

  def timeout_s(self) -> float | None:
    """Seconds without progress that make a stall now; None before every worker finished a
    step (nothing is declared then)."""
    if self._slowest is None:
      return None
    if self._timeout_s is not None:
      return self._timeout_s
    return max(FLOOR_S, FACTOR * statistics.median(self._step_times))

  def busy_timeout_s(self) -> float | None:
    """Seconds a worker may spend in one long phase (`ProgressWatchdog.busy`) before it is
    named as stuck in it; None before every worker finished a step."""
    timeout = self.timeout_s()
    return None if timeout is None else max(BUSY_FLOOR_S, BUSY_FACTOR * timeout)

  def observe(self, now: float, values: dict[str, object]) -> tuple[int | None, str] | None:
    """Takes the values polled at ``now``; returns ``(worker or None, cause)`` once the job is
    stalled, else None. A value None (a key not written yet, or a failed read) keeps the last
    one seen: a failed read of ``busy/{w}`` does not end a worker's phase."""
    for key, value in values.items():
      if value is not None and (key not in self._seen or self._seen[key][0] != value):
        self._seen[key] = (value, now)
    busy = {w: phase for w in range(self.workers)
            if (phase := self._seen.get(f'busy/{w}', ('', now))[0])}
    if busy:
      self._busy_seen = now
    steps = [self._seen.get(f'progress/{w}', (None, now))[0] for w in range(self.workers)]
    if any(s is None for s in steps):
      return None  # not armed until every worker finished a step
    low = min(steps)
    if self._slowest is None:  # the first step, compilation included, is the first step time
      self._step_times.append(now - self._started)
      self._slowest, self._since = low, now
      return None
    if low != self._slowest:
      self._step_times.append((now - self._since) / max(1, low - self._slowest))
      self._slowest, self._since = low, now
      return None
    if now - self._since < self.timeout_s():
      return None
    if busy:  # a long phase has a bound of its own
      return self._stuck(busy, steps, now)
    if now - self._busy_seen < self.timeout_s():  # the step timeout counts from a phase's end
      return None
    return self._blame(steps, now, now - self._since)

  def _stuck(self, busy: dict[int, str], steps, now) -> tuple[int, str] | None:
    """The busy worker whose phase began first, once it has lasted the busy bound. A phase
    begins when its name was seen or, if later, the worker's last report (a phase of the same
    name after the next step is another phase)."""
    began = {w: max(self._seen[f'busy/{w}'][1], self._seen[f'progress/{w}'][1]) for w in busy}
    w = min(began, key=began.__getitem__)
    if now - began[w] < self.busy_timeout_s():
      return None
    return w, (f'{self._names[w]} stuck in its {busy[w]} for {now - began[w]:.1f} s after step '
               f'{steps[w]}')

  def _blame(self, steps, now, stalled_s) -> tuple[int | None, str]:
    silent = [w for w in range(self.workers)  # a heartbeat never seen is silent too
              if now - self._seen.get(f'alive/{w}', (None, -math.inf))[1] > 3 * _HEARTBEAT_S]
    low = min(steps)
    behind = [w for w, s in enumerate(steps) if s == low]
    if silent:
      w = silent[0]
      return w, (f'{self._names[w]} made no progress for {stalled_s:.1f} s after step '
                 f'{steps[w]} and its heartbeat stopped (stopped or wedged)')
    if len(behind) < self.workers:
      w = behind[0]
      return w, (f'{self._names[w]} made no progress for {stalled_s:.1f} s after step {low}, '
                 f'while others finished step {max(steps)}')
    return None, f'no worker made progress for {stalled_s:.1f} s after step {low}'


class ProgressWatchdog:
  """Step progress and heartbeats of every worker; worker 0 ends a stalled job.

  Create it just before the first step: the first step time is measured from here.

  Example::

    watchdog = ProgressWatchdog(Channel('run'), ctx.worker, ctx.workers)
    def save(info):
      with watchdog.busy('checkpoint save'):   # may take minutes: not a stall
        ckpt.save(info.state)
    hooks += [Hook(save), Hook(lambda info: watchdog.report(info.step))]   # report last
    ...
    watchdog.close()

  Args:
    channel: the job's `Channel` (or anything with ``set`` and ``try_get``).
    worker, workers: this worker and how many there are.
    timeout_s: seconds without progress that make a stall; None: follow the measured step time
      (module docstring).
    verdict_dir: where to leave the verdict for the launcher (``HETJAX_VERDICT_DIR``), or None.
    names: how to name each worker in the verdict (default ``worker i``).
    on_stall: called with (worker or None, cause) instead of exiting — for tests.
  """

  def __init__(self, channel, worker: int, workers: int, *, timeout_s: float | None = None,
               verdict_dir: str | None = None, names: Sequence[str] | None = None,
               on_stall: Callable[[int | None, str], None] | None = None):
    self._channel, self.worker, self.workers = channel, worker, workers
    self.timeout_s, self._verdict_dir = timeout_s, verdict_dir
    self._detector = StallDetector(workers, timeout_s=timeout_s, started=time.monotonic(),
                                   names=names)
    self._on_stall = on_stall or self._exit
    self._phase = ''  # the long phase this worker is in ('': none); the heartbeat publishes it
    self._stop = threading.Event()
    self._threads = [threading.Thread(target=self._beat, name='hetjax-heartbeat', daemon=True)]
    if worker == 0:
      self._threads.append(threading.Thread(target=self._watch, name='hetjax-watchdog',
                                            daemon=True))
    for thread in self._threads:
      thread.start()

  def report(self, step: int) -> None:
    """Publishes that this worker finished ``step`` (call after the step's other hooks)."""
    self._channel.set(f'progress/{self.worker}', int(step))

  @contextlib.contextmanager
  def busy(self, phase: str) -> Iterator[None]:
    """Runs the ``with`` block as the long phase ``phase`` (``'checkpoint save'``,
    ``'evaluation'``): no stall while it lasts, up to the busy bound (module docstring). Costs
    no key-value write: the heartbeat thread publishes the phase at its next beat, so a block
    under a second (a checkpoint hook on a step that saves nothing) is free."""
    outer, self._phase = self._phase, phase
    try:
      yield
    finally:
      self._phase = outer

  def close(self) -> None:
    self._stop.set()
    for thread in self._threads:
      thread.join(timeout=2 * _HEARTBEAT_S)

  def _beat(self) -> None:
    beat, published = 0, ''
    while not self._stop.is_set():
      beat += 1
      phase = self._phase
      try:
        self._channel.set(f'alive/{self.worker}', beat)
        if phase != published:
          self._channel.set(f'busy/{self.worker}', phase)
          published = phase
      except Exception:  # the service is gone: the job is ending anyway
        return
      self._stop.wait(_HEARTBEAT_S)

  def _watch(self) -> None:
    keys = self._detector.keys
    while not self._stop.wait(_POLL_S):
      now = time.monotonic()
      try:
        values = {key: self._channel.try_get(key) for key in keys}
      except Exception:
        return
      verdict = self._detector.observe(now, values)
      if verdict is not None:
        self._on_stall(*verdict)
        return

  def _exit(self, worker: int | None, cause: str) -> None:
    print(f'watchdog: {cause}; ending the job', file=sys.stderr, flush=True)
    if self._verdict_dir:
      try:
        write_verdict(self._verdict_dir, worker, cause)
      except OSError as e:
        print(f'watchdog: could not leave the verdict in {self._verdict_dir}: {e}',
              file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(STALL_EXIT_STATUS)
