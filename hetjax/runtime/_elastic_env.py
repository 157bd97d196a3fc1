"""What a restarted worker is told by `hetjax.launch --max-restarts` (environment variables).

  HETJAX_RESTART=k          this is the job's k-th restart (absent or 0: the first launch)
  HETJAX_RESTART_CAUSE=…    why the previous launch ended, e.g. 'worker 2 was killed by SIGKILL'
  HETJAX_HOSTS=0,1,3        the original worker ids of this launch's workers, when some were left
                            out (``--min-workers``): worker i runs on host ``hosts[i]``
  HETJAX_ORIGINAL_WORKERS=4 how many workers the job was first launched with
  HETJAX_VERDICT_DIR=dir    where the stall watchdog leaves its verdict for the launcher
  HETJAX_STALL_TIMEOUT=s    the watchdog's timeout (absent: automatic)

Every reader here returns the first launch's value when the variable is absent, so a script run
by hand, by SLURM or by another launcher behaves as before.
"""

from __future__ import annotations

import os

from hetjax._checks import positive_seconds
from hetjax._errors import ConfigError

ENV_RESTART = 'HETJAX_RESTART'
ENV_RESTART_CAUSE = 'HETJAX_RESTART_CAUSE'
ENV_HOSTS = 'HETJAX_HOSTS'
ENV_ORIGINAL_WORKERS = 'HETJAX_ORIGINAL_WORKERS'
ENV_VERDICT_DIR = 'HETJAX_VERDICT_DIR'
ENV_STALL_TIMEOUT = 'HETJAX_STALL_TIMEOUT'


def restart_attempt() -> int:
  """How many times the launcher restarted this job before this launch (0: the first)."""
  raw = os.environ.get(ENV_RESTART, '').strip()
  if not raw:
    return 0
  if not raw.isdigit():
    raise ConfigError(f'{ENV_RESTART}={raw!r} is not a non-negative integer')
  return int(raw)


def restart_cause() -> str | None:
  """Why the previous launch ended, as the launcher named it, or None."""
  return os.environ.get(ENV_RESTART_CAUSE) or None


def hosts(workers: int) -> tuple[int, ...]:
  """The original worker id of each of this job's ``workers`` workers (``range`` when none was
  left out)."""
  raw = os.environ.get(ENV_HOSTS, '').strip()
  if not raw:
    return tuple(range(workers))
  try:
    ids = tuple(int(h) for h in raw.split(','))
  except ValueError:
    raise ConfigError(f'{ENV_HOSTS}={raw!r} is not comma-separated worker ids') from None
  if len(ids) != workers or len(set(ids)) != len(ids) or min(ids) < 0:
    raise ConfigError(f'{ENV_HOSTS}={raw!r} does not name {workers} distinct worker ids')
  return ids


def original_workers(workers: int) -> int:
  """How many workers the job was first launched with (``workers`` unless some were left
  out)."""
  raw = os.environ.get(ENV_ORIGINAL_WORKERS, '').strip()
  if not raw:
    return workers
  if not raw.isdigit() or int(raw) < workers:
    raise ConfigError(f'{ENV_ORIGINAL_WORKERS}={raw!r} is not a worker count of at least '
                      f'{workers}')
  return int(raw)


def verdict_dir() -> str | None:
  return os.environ.get(ENV_VERDICT_DIR) or None


def stall_timeout() -> float | None:
  """The stall timeout the launcher was given, in seconds, or None (automatic)."""
  raw = os.environ.get(ENV_STALL_TIMEOUT, '').strip()
  if not raw:
    return None
  try:
    seconds = float(raw)
  except ValueError:
    raise ConfigError(f'{ENV_STALL_TIMEOUT}={raw!r} is not a number of seconds') from None
  return positive_seconds(seconds, ENV_STALL_TIMEOUT)
