"""Pinning local workers to cores: what makes emulated hosts hold when workers outnumber cores.

When workers outnumber the cores and each is free to run on any of them, the same gradient call
timed back to back swings severalfold from one phase to the next (its median and its tail
alike) and uses several times its work in CPU time: XLA's threads of one call spread over all
the cores and wait for each other there. Pinned, several workers to a core, the same calls take
a steady time in every phase on every worker, at about their work's CPU time. A host of known
speed (`hetjax.emulation.KnownSpeedHost`) pads a call to its
calibrated time only if the real call stays under it; pinned, it does.

`worker_cpus` deals this process's allowed CPUs out round robin (worker i gets CPU
``cpus[i mod len(cpus)]``); `affinity_for_children` sets the calling thread's mask for the
duration of a fork, which the child inherits (so its first thread, and every thread after it,
run there) while the launcher's other threads keep theirs. Linux only (`os.sched_setaffinity`).

Not for jobs that compile while they run: a worker's background compile of a new share size
(`hetjax.train.SharePrograms`) then shares its one core: LB-BSP workers under Markov slowdowns
run many more worker-steps past their host's time pinned than unpinned.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from hetjax._errors import ConfigError


def worker_cpus(workers: int) -> list[frozenset[int]]:
  """The one CPU each of ``workers`` workers is pinned to, round robin over the CPUs this process
  may use.

  Raises:
    ConfigError: one line, where the platform cannot pin (no ``os.sched_setaffinity``).
  """
  if not hasattr(os, 'sched_setaffinity'):
    raise ConfigError('pinning workers to cores needs os.sched_setaffinity (Linux); run '
                      'without --pin-cores')
  cpus = sorted(os.sched_getaffinity(0))
  return [frozenset({cpus[i % len(cpus)]}) for i in range(workers)]


@contextlib.contextmanager
def affinity_for_children(cpus: frozenset[int] | None) -> Iterator[None]:
  """The calling thread runs on ``cpus`` inside the block (a process forked there inherits it);
  None: nothing changes."""
  if cpus is None:
    yield
    return
  before = os.sched_getaffinity(0)  # 0: the calling thread
  os.sched_setaffinity(0, cpus)
  try:
    yield
  finally:
    os.sched_setaffinity(0, before)
