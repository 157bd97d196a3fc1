"""`StepStats`: the one record of a finished step, on a real run and on the virtual clock.

Every step program returns one, the virtual clock builds the same type from modelled times,
and every policy learns from it, so a policy cannot tell which clock fed it. Fields are named
for what they measure; nothing rides in another field's slot.

Example::

  >>> s = StepStats(step=3, rows=(64, 32), compute_s=(0.2, 0.1), sync_s=0.01, iter_s=0.21)
  >>> s.wait_s   # each worker's idle time before the combine: slowest compute − own compute
  (0.0, 0.1)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class WorkerTiming:
  """What one worker measured of one step, each phase timed on its own (real runs only).

  Attributes:
    step: the state's step after this one (1-based).
    worker: the worker id.
    share: rows this worker computed.
    slowdown: the emulated slowdown factor in force (1.0 when none).
    data_s: building and placing this worker's rows (token pulls included).
    compute_s: the local gradient, measured (`block_until_ready`).
    dilation_s: time slept to emulate this worker's host: its padded time minus compute_s.
    collective_s: the cross-worker combine plus the optimizer update, from dispatch to ready:
      communication plus the wait for the slowest worker.
    step_s: wall time of the whole iteration on this worker.
    compile_s: waiting for a program of a size seen for the first time (outside compute_s).
    load: the host-load input given to the share policy (see `StepStats.load`).
    overrun_s: how far the real compute ran past the emulated host's time (then the step is
      slower than emulated; 0.0 when the emulation held, or without one).
    pulls: token steps: round trips to the token counter (one per token, plus the one that
      found the queue empty or the end game's read); 0 otherwise.
    pull_s: seconds those round trips took (inside ``data_s``).
    left: tokens still queued when this worker left them to faster ones (the end game).
    sampled: False when a compile of this worker's programs ran beside the step (in the
      background: it ran a new size as pieces, or the compile competed for the cores), so
      its time is neither its speed nor a steady step's (`StepStats.sampled`, this worker's).
  """

  step: int
  worker: int
  share: int
  slowdown: float
  data_s: float
  compute_s: float
  dilation_s: float
  collective_s: float
  step_s: float
  compile_s: float = 0.0
  load: float = 0.0
  overrun_s: float = 0.0
  pulls: int = 0
  pull_s: float = 0.0
  left: int = 0
  sampled: bool = True


@dataclasses.dataclass(frozen=True)
class StepStats:
  """One finished step.

  Attributes:
    step: the index of the finished step (0-based: the batch it consumed).
    rows: rows each worker computed; they sum to the global batch.
    compute_s: each worker's busy seconds on its rows, emulated padding included.
    sync_s: the part of the step after the slowest worker's compute: the combine (collective
      and optimizer update) and per-step host work. Measured by the worker that arrived last,
      or modelled on the virtual clock.
    iter_s: the whole step, wall clock or modelled.
    load: each worker's exogenous host-load input (LB-BSP's NARX); empty when unknown.
    sampled: per worker, False when its time says nothing about its speed: a compile ran during
      the step, on this worker (it waited for one, ran a new size as pieces while the size's
      own program compiled, or a background compile competed for its cores) or on any other
      worker of the job (whose compile may share this worker's cores); empty means every time
      is a sample.
    compile_s: seconds this step waited for compiles (this worker).
    worker_compile_s: per worker, seconds it spent compiling its programs during the step
      (waited for, or on its background thread); what a change of the shares cost in compiles.
      Empty when unknown (the virtual clock, which models no compiles).
    worker_ready: per worker, whether it can run the shares a policy prepared
      (`hetjax.core.Shares.upcoming`) without waiting for a compile; empty when unknown (every
      worker ready).
    worker_exact: per worker, whether its busy time is exactly its emulated host's (its step
      was padded to the host's time with room to spare): a measurement without noise. Empty
      when unknown or not emulated.
    bytes: bytes one worker contributed to this step's collectives (0 when none).
    loss: the global mean loss: a device scalar on real runs (reading it waits for the step),
      NaN on the virtual clock.
    tokens: per worker, tokens pulled in a token step; empty otherwise.
    local: this worker's own breakdown of the step on real runs: a `WorkerTiming` (shares,
      tokens), a `hetjax.replicas.ReplicaStep` (a pipeline replica); None on the virtual clock
      and in SPMD steps.
  """

  step: int
  rows: tuple[int, ...]
  compute_s: tuple[float, ...]
  sync_s: float = 0.0
  iter_s: float = 0.0
  load: tuple[float, ...] = ()
  sampled: tuple[bool, ...] = ()
  compile_s: float = 0.0
  bytes: int = 0
  loss: Any = math.nan
  tokens: tuple[int, ...] = ()
  local: Any = None
  worker_compile_s: tuple[float, ...] = ()
  worker_ready: tuple[bool, ...] = ()
  worker_exact: tuple[bool, ...] = ()

  @property
  def workers(self) -> int:
    return len(self.rows)

  @property
  def wait_s(self) -> tuple[float, ...]:
    """Each worker's idle time before the combine: the slowest compute minus its own."""
    slowest = max(self.compute_s, default=0.0)
    return tuple(slowest - c for c in self.compute_s)
