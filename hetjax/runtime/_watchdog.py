"""A stall watchdog over the coordination channel: names the worker that stopped making progress.

A JAX job whose worker is alive but stuck hangs forever: its peers wait in a collective, and the
coordination service still gets the stuck process's heartbeats. Here every worker publishes two
things on the `Channel`: its last finished step (`ProgressWatchdog.report`, called after a
step's hooks) and a heartbeat from a thread, once a second. Worker 0 watches both. When the
slowest worker's step has not advanced for the stall timeout — given, or five times the recent
step time with a 10 s floor, armed once every worker has finished a step (compilation is not a
stall) — it names the culprit:

* a worker whose heartbeat stopped too (stopped by SIGSTOP, or wedged with the interpreter
  held); else
* the workers behind the others (they did not finish the step their peers wait in); else
* nobody: every worker is stuck in the same step.

It prints one line, leaves the verdict for the launcher (`hetjax.runtime._verdict`), and ends
the job by exiting worker 0 with status 3. Each report is one key-value write (~0.4 ms on
loopback); the watcher reads 2 keys per worker every half second.
"""

from __future__ import annotations

import collections
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence

from hetjax.runtime._verdict import write_verdict

STALL_EXIT_STATUS = 3
FLOOR_S = 10.0
FACTOR = 5.0
_HEARTBEAT_S = 1.0
_POLL_S = 0.5


class ProgressWatchdog:
  """Step progress and heartbeats of every worker; worker 0 ends a stalled job.

  Example::

    watchdog = ProgressWatchdog(Channel('run'), ctx.worker, ctx.workers)
    hooks.append(Hook(lambda info: watchdog.report(info.step)))   # after the other hooks
    ...
    watchdog.close()

  Args:
    channel: the job's `Channel` (or anything with ``set`` and ``try_get``).
    worker, workers: this worker and how many there are.
    timeout_s: seconds without progress that make a stall; None: automatic (module docstring).
    verdict_dir: where to leave the verdict for the launcher (``HETJAX_VERDICT_DIR``), or None.
    names: how to name each worker in the verdict (default ``worker i``).
    on_stall: called with (worker or None, cause) instead of exiting — for tests.
  """

  def __init__(self, channel, worker: int, workers: int, *, timeout_s: float | None = None,
               verdict_dir: str | None = None, names: Sequence[str] | None = None,
               on_stall: Callable[[int | None, str], None] | None = None):
    self._channel, self.worker, self.workers = channel, worker, workers
    self.timeout_s, self._verdict_dir = timeout_s, verdict_dir
    self._names = list(names) if names is not None else [f'worker {w}' for w in range(workers)]
    self._on_stall = on_stall or self._exit
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

  def close(self) -> None:
    self._stop.set()
    for thread in self._threads:
      thread.join(timeout=2 * _HEARTBEAT_S)

  def _beat(self) -> None:
    beat = 0
    while not self._stop.is_set():
      beat += 1
      try:
        self._channel.set(f'alive/{self.worker}', beat)
      except Exception:  # the service is gone: the job is ending anyway
        return
      self._stop.wait(_HEARTBEAT_S)

  def _watch(self) -> None:
    seen: dict[str, tuple[object, float]] = {}  # key -> (value, when it last changed)
    advances: collections.deque[float] = collections.deque(maxlen=20)
    slowest, slowest_since = None, time.monotonic()
    while not self._stop.wait(_POLL_S):
      now = time.monotonic()
      for w in range(self.workers):
        for key in (f'progress/{w}', f'alive/{w}'):
          try:
            value = self._channel.try_get(key)
          except Exception:
            return
          if value is not None and (key not in seen or seen[key][0] != value):
            seen[key] = (value, now)
      steps = [seen.get(f'progress/{w}', (None, now))[0] for w in range(self.workers)]
      if any(s is None for s in steps):
        slowest_since = now  # not armed until every worker finished a step
        continue
      low = min(steps)
      if low != slowest:
        if slowest is not None:
          advances.append((now - slowest_since) / max(1, low - slowest))
        slowest, slowest_since = low, now
        continue
      timeout = self.timeout_s or max(FLOOR_S, FACTOR * statistics.median(advances or [0.0]))
      if now - slowest_since >= timeout:
        self._on_stall(*self._blame(steps, seen, now, now - slowest_since))
        return

  def _blame(self, steps, seen, now, stalled_s) -> tuple[int | None, str]:
    silent = [w for w in range(self.workers)  # a heartbeat never seen is silent too
              if now - seen.get(f'alive/{w}', (None, -math.inf))[1] > 3 * _HEARTBEAT_S]
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
