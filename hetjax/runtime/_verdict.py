"""Who stopped a job: a stopped (SIGSTOP) process, or the stall watchdog's written verdict.

When one worker of a JAX job stops, its peers fail after it (their collectives or the
coordination service's heartbeat time out), so the first process to exit is usually not the
culprit. The launcher asks two witnesses before it names one: the kernel (a process in the
stopped state, ``T`` in ``/proc/PID/stat``; Linux only, elsewhere nothing is ever seen stopped)
and the stall watchdog (`hetjax.runtime.ProgressWatchdog`), which writes ``verdict.json`` into
the directory the launcher gave it (``HETJAX_VERDICT_DIR``) before it ends the job.
"""

from __future__ import annotations

import contextlib
import json
import os

VERDICT_FILE = 'verdict.json'


def proc_stat(pid: int) -> list[bytes]:
  """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, …); empty if
  there is no such process (or no ``/proc``)."""
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      stat = f.read()
  except OSError:
    return []
  # The command name is in parentheses and may itself hold ')'.
  return stat[stat.rfind(b')') + 2:].split()


def is_stopped(pid: int) -> bool:
  """Whether process ``pid`` is stopped by a signal (SIGSTOP, SIGTSTP) or traced."""
  return proc_stat(pid)[:1] in ([b'T'], [b't'])


def write_verdict(directory: str, worker: int | None, cause: str) -> None:
  """Atomically leaves ``{"worker": worker, "cause": cause}`` in ``directory`` (``worker``
  None: no single worker is to blame)."""
  path = os.path.join(directory, VERDICT_FILE)
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w') as f:
    json.dump({'worker': worker, 'cause': cause}, f)
  os.replace(tmp, path)


def read_verdict(directory: str | None) -> tuple[int | None, str] | None:
  """The ``(worker, cause)`` a watchdog left in ``directory``, or None."""
  if directory is None:
    return None
  with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
    with open(os.path.join(directory, VERDICT_FILE)) as f:
      raw = json.load(f)
    worker = raw['worker']
    return (None if worker is None else int(worker)), str(raw['cause'])
  return None
