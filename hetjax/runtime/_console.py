"""What the workers print: echoed while the job is healthy, kept to the log once it fails.

When one worker of a JAX job fails, every peer prints its own account of it: Python tracebacks
of collectives that lost a peer, the coordination service's error and fatal log lines, C++
check-failure stack traces. For 3 workers that is ~80 lines, and the one line that says what
happened is lost in them. `Console` sends every line of every process to the launch log, and to
the console only while the job looks healthy:

* a line that opens a failure report — a Python traceback, an ``E`` or ``F`` line of absl/glog
  logging (JAX's C++ runtime and coordination service), a C++ check failure, a fatal Python
  error — holds that process's lines back from the console. If the process writes again more
  than `LINGER_S` later, or exits with status 0, the held lines come out after all (it was an
  error it recovered from);
* once the job has failed or is being torn down (`Console.quiet`), nothing more goes to the
  console;
* chatter goes to the log only: Gloo's ``[Gloo] Rank 0 is connected to 3 peer ranks. Expected
  number of connected peer ranks is : 3``, one per worker at every start (`_CHATTER`). A rank
  connected to fewer peers than expected is not chatter and stays on the console.

For the launcher's verdict it keeps, per process, its own error (`Console.error`: the exception
its last traceback ended with, else its first fatal or error log message), its last line, and
when its last traceback began (`Console.tracebacks`): a worker that raised is alive for a while
(JAX's shutdown barrier waits for the others), so it is often not the first to exit.

What the launcher makes of it (the console, 3 workers, worker 1 raised; long lines wrapped)::

  [w0] step 3 | loss 2.07
  launch: worker 1 raised ValueError: boom; its peers failed after it (worker 0 was killed by
    SIGABRT)
  launch:   worker 0: was killed by SIGABRT (Terminating process because the JAX distributed
    service detected fatal errors.)
  launch:   worker 1: was killed by SIGABRT (ValueError: boom)
  launch:   worker 2: was killed by SIGABRT (ValueError: UNKNOWN: Gloo AllGather failed: …)
  launch: the full output of every worker: runs/gpt/launch.log
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Callable
from typing import TextIO

#: How long a failing process may stay alive after its traceback (JAX's shutdown barrier waits
#: 10 s, `hetjax.runtime.initialize`): held lines are released after it, and a traceback older
#: than this when the first process exits did not start the failure.
LINGER_S = 30.0
TRACEBACK = 'Traceback (most recent call last):'
_ALARM = re.compile(r'Traceback \(most recent call last\):|[EF]\d{4} \d\d:\d\d:\d\d\.\d+ |'
                    r'\*\*\* Check failure stack trace|Fatal Python error:|'
                    r'terminate called after throwing')
_EXCEPTION = re.compile(r'[A-Za-z_][\w.]*(: .*)?')  # 'ValueError: boom', 'KeyboardInterrupt'
_LOG = re.compile(r'([EF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]*\] ?(.*)')
#: Lines that say all is well and nothing the user acts on: the log keeps them.
_CHATTER = re.compile(r'\[Gloo\] Rank \d+ is connected to (?P<peers>\d+) peer ranks\. '
                      r'Expected number of connected peer ranks is : (?P=peers)\s*')


@dataclasses.dataclass
class _Process:
  """One process's output so far, as far as the verdict needs it."""

  prefix: str
  held: list[str] = dataclasses.field(default_factory=list)
  held_since: float | None = None
  in_traceback: bool = False
  traceback_at: float | None = None  # when its last traceback began
  exception: str | None = None  # the exception line its last traceback ended with
  logged: tuple[str, str] | None = None  # (level, message) of its first F, else first E line
  last: str = ''


class Console:
  """The launch's output, from the reader threads of every process.

  Args:
    out: the console (the workers' ``[w{i}] ``-prefixed lines while the job is healthy).
    log: the launch log (every line, whatever the state of the job).
    clock: `time.monotonic`, or a scripted clock in tests.
  """

  def __init__(self, out: TextIO, log: TextIO, clock: Callable[[], float] = time.monotonic):
    self._out, self._log, self._clock = out, log, clock
    self._lock = threading.Lock()
    self._processes: list[_Process] = []
    self._quiet = False

  def add(self, prefix: str) -> int:
    """A new process whose lines are prefixed ``[prefix] ``; returns its index."""
    with self._lock:
      self._processes.append(_Process(prefix))
      return len(self._processes) - 1

  def write(self, i: int, text: str) -> None:
    """One line (without its newline) of process ``i``."""
    p = self._processes[i]
    line = f'[{p.prefix}] {text}\n'
    with self._lock:
      now = self._clock()
      self._remember(p, text, now)
      _emit(self._log, line)
      if self._quiet or _CHATTER.fullmatch(text):
        return
      if p.held_since is not None and now - p.held_since > LINGER_S:
        self._release(p)
      if p.held_since is None and _ALARM.match(text):
        p.held_since = now
      if p.held_since is None:
        _emit(self._out, line)
      else:
        p.held.append(line)

  def end(self, i: int, returncode: int) -> None:
    """Process ``i`` exited: with status 0 its held lines come out; else the job has failed."""
    with self._lock:
      if returncode != 0:
        self._quiet = True
      elif not self._quiet:
        self._release(self._processes[i])

  def quiet(self) -> None:
    """The job has failed or is being torn down: from now on, lines go to the log only."""
    with self._lock:
      self._quiet = True

  def note(self, text: str) -> None:
    """A line of the launcher's own, for the log only."""
    with self._lock:
      _emit(self._log, text + '\n')

  def error(self, i: int) -> str | None:
    """Process ``i``'s own error: the exception of its last traceback, else the message of its
    first fatal (else error) log line; None if it printed neither."""
    with self._lock:
      p = self._processes[i]
      return p.exception or (p.logged[1] if p.logged else None)

  def last(self, i: int) -> str:
    """The last non-blank line process ``i`` printed ('' if none)."""
    with self._lock:
      return self._processes[i].last

  def tracebacks(self) -> dict[int, float]:
    """When each process's last traceback began (`clock` time), for those that printed one."""
    with self._lock:
      return {i: p.traceback_at for i, p in enumerate(self._processes)
              if p.traceback_at is not None}

  def _remember(self, p: _Process, text: str, now: float) -> None:
    if text.strip():
      p.last = text
    if text.startswith(TRACEBACK):
      p.in_traceback, p.traceback_at = True, now
    elif p.in_traceback and _EXCEPTION.fullmatch(text):  # frames and code are indented
      p.in_traceback, p.exception = False, text
    logged = _LOG.match(text)
    if logged and (p.logged is None or (p.logged[0], logged[1]) == ('E', 'F')):
      p.logged = (logged[1], logged[2])

  def _release(self, p: _Process) -> None:
    for line in p.held:
      _emit(self._out, line)
    p.held, p.held_since = [], None


def _emit(stream: TextIO, line: str) -> None:
  with contextlib.suppress(OSError, ValueError):  # a closed stdout must not stop the launch
    stream.write(line)
    stream.flush()
