"""Pinning local workers to cores: what makes emulated hosts hold when workers outnumber cores.

Four workers on the 2-core development machine, each free to run on either core, timed the same
128-row gradient call back to back at 10–60 ms (median of 40 calls, one phase to the next) and
14–190 ms (90th percentile), using 10–45 ms of CPU for 8 ms of work: XLA's threads of one call
spread over both cores and wait for each other there. Pinned, two workers to a core, the same
calls took 16 ms (median) and 16.5–18.5 ms (90th percentile) in every phase on every worker, at
8 ms of CPU. A host of known speed (`hetjax.emulation.KnownSpeedHost`) pads a call to its
calibrated time only if the real call stays under it; pinned, it does.

`worker_cpus` deals this process's allowed CPUs out round robin (worker i gets CPU
``cpus[i mod len(cpus)]``); `affinity_for_children` sets the calling thread's mask for the
duration of a fork, which the child inherits (so its first thread, and every thread after it,
run there) while the launcher's other threads keep theirs. Linux only (`os.sched_setaffinity`).

Not for jobs that compile while they run: a worker's background compile of a new share size
(`hetjax.train.SharePrograms`) then shares its one core. Four LB-BSP workers under Markov
slowdowns, pinned, ran 88 of 420 worker-steps past their host's time; unpinned, at most 23 of
840.
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
