"""Restarting a failed local job from its last checkpoint, on fewer workers if one keeps failing.

JAX's coordination service is fate-sharing: when one process dies, the job ends. `launch_elastic`
runs `launch_local` again after a failure (up to ``max_restarts`` times), telling the new
processes which restart this is (``HETJAX_RESTART``, ``HETJAX_RESTART_CAUSE``), so a program
that checkpoints resumes on its own (``experiments/train.py`` does). A worker blamed for two
failures in a row is left out while more than ``min_workers`` remain: the next launch runs on
the others, which learn their original ids from ``HETJAX_HOSTS`` (a slowdown spec still names
the original workers). Parameter servers are never left out.

A job that was interrupted (SIGINT, SIGTERM, SIGHUP), timed out, or refused its input (a worker
exited with status 2: a restart would refuse it again) is not restarted; ``timeout`` counts over
all launches together. Every launch appends to the first one's launch log.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from hetjax._checks import between, positive_seconds
from hetjax._errors import ConfigError
from hetjax.runtime._elastic_env import (
  ENV_ORIGINAL_WORKERS,
  ENV_RESTART,
  ENV_RESTART_CAUSE,
  ENV_STALL_TIMEOUT,
)
from hetjax.runtime._launcher import (
    MAX_WORKERS,
    LaunchResult,
    device_counts,
    launch_local,
)

#: Not restarted: bad input (status 2, the experiment scripts' one-line errors), a timeout, and
#: the launcher's own SIGHUP, SIGINT or SIGTERM.
_NOT_RESTARTED = (2, 124, 128 + 1, 128 + 2, 128 + 15)


def _say(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def launch_elastic(command: Sequence[str], workers: int,
                   devices_per_worker: int | Sequence[int] = 1, *, max_restarts: int = 0,
                   min_workers: int | None = None, stall_timeout: float | None = None,
                   timeout: float | None = None, env: Mapping[str, str] | None = None,
                   log: Callable[[str], None] = _say,
                   on_result: Callable[[int, LaunchResult], None] | None = None,
                   **launch_options) -> LaunchResult:
  """Runs ``command`` as ``workers`` local processes, restarting the job when a worker fails.

  Example::

    >>> launch_elastic([sys.executable, 'train.py', '--workdir=runs/a'], workers=4,
    ...                max_restarts=3, min_workers=3, timeout=900)
    launch: worker 2 was killed by SIGKILL; restart 1 of 3 on workers 0,1,2,3
    LaunchResult(returncode=0, failed_worker=None, cause='all workers exited with status 0')

  Args:
    command, workers, devices_per_worker: as for `launch_local`.
    max_restarts: how many times to relaunch after a failure (0: never, as `launch_local`).
    min_workers: the fewest workers to go on with (default ``workers``: never leave one out).
    stall_timeout: seconds without progress before a worker is named stuck: the in-job
      watchdog's timeout (``HETJAX_STALL_TIMEOUT``; default automatic) and how long a stopped
      process may stay stopped (default `hetjax.runtime._launcher.DEFAULT_STOPPED_SECONDS`).
    timeout: seconds for all launches together (exit 124); None: no limit.
    env: the workers' base environment (default this process's).
    log: where the restart lines go (default stderr).
    on_result: called with (launch number, its `LaunchResult`) after every launch.
    **launch_options: passed on to `launch_local` (slowdown, port_range, servers, log_dir, …).

  Returns:
    The last launch's `LaunchResult`.

  Raises:
    ConfigError: bad arguments (as `launch_local`), ``max_restarts`` < 0, or ``min_workers``
      outside 1..workers.
  """
  between(workers, 1, MAX_WORKERS, 'workers')
  if timeout is not None:  # None: no limit
    positive_seconds(timeout, 'timeout')
  if not isinstance(max_restarts, int) or max_restarts < 0:
    raise ConfigError(f'max restarts must be a non-negative integer, got {max_restarts}')
  min_workers = workers if min_workers is None else min_workers
  if not isinstance(min_workers, int) or not 1 <= min_workers <= workers:
    raise ConfigError(f'min workers must be between 1 and the {workers} workers, got '
                      f'{min_workers}')
  counts = device_counts(workers, devices_per_worker)
  base = dict(os.environ if env is None else env) | {ENV_ORIGINAL_WORKERS: str(workers)}
  if stall_timeout is not None:
    base[ENV_STALL_TIMEOUT] = f'{stall_timeout:g}'
  deadline = math.inf if timeout is None else time.monotonic() + timeout
  hosts, blamed_before, result = tuple(range(workers)), None, None
  for attempt in range(max_restarts + 1):
    extra = {ENV_RESTART: str(attempt)}
    if result is not None:
      extra[ENV_RESTART_CAUSE] = result.cause
    left = None if timeout is None else deadline - time.monotonic()
    if left is not None and left <= 0:
      return LaunchResult(124, None, f'timed out after {timeout:g} s; stopped all workers')
    options = launch_options if attempt == 0 else {  # spec checks ran on the first launch
        k: v for k, v in launch_options.items() if not k.startswith('validate_')}
    result = launch_local(command, len(hosts), tuple(counts[h] for h in hosts), env=base | extra,
                          timeout=left, stall_timeout=stall_timeout, hosts=hosts, **options)
    if result.log is not None:  # the next launches append to the same log
      launch_options['log_dir'] = os.path.dirname(result.log)
    if on_result is not None:
      on_result(attempt, result)
    if result.returncode == 0 or result.returncode in _NOT_RESTARTED or attempt == max_restarts:
      return result
    worker = result.failed_worker
    host = hosts[worker] if worker is not None and worker < len(hosts) else None
    if host is not None and host == blamed_before and len(hosts) > min_workers:
      hosts = tuple(h for h in hosts if h != host)
      log(f'launch: {result.cause}; worker {host} failed twice in a row: left out')
      blamed_before = None
    else:
      log(f'launch: {result.cause}')
      blamed_before = host
    log(f'launch: restart {attempt + 1} of {max_restarts} on workers '
        f'{",".join(map(str, hosts))}')
  raise AssertionError('unreachable')
