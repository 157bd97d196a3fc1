"""`partial_gradient`: one worker's part of a per-worker step, timed phase by phase.

A step of `WorkerTrainer` (and of `OverlapTrainer`) starts the same way on every worker: build
and place its rows of the global batch (``data_s``), compile the share size's program if it is
new (``compile_s``), compute ``Σ loss / X`` and ``Σ ∇loss / X`` over its rows and wait for them
(``compute_s``), and pad that compute to the emulated host's time (``dilation_s``). What
follows differs (a combine now, or a reduction overlapped with the next step), so this module
stops at the packed partial gradient and the numbers that ride in the combine's head.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import jax

from hetjax.core import Work, WorkerTiming, host_load
from hetjax.data import slice_batch

if TYPE_CHECKING:
  from hetjax.train._workers import WorkerTrainer


@dataclasses.dataclass(frozen=True)
class PartialGradient:
  """This worker's packed partial gradient of a step and how long its phases took.

  Attributes:
    packed: ``(fused, separate)`` as `WorkerTrainer.local_gradient` returns it (unstamped).
    step: the step (the batch's index).
    rows: rows this worker computed.
    start: ``time.perf_counter()`` when the step started.
    data_s, compute_s, compile_s: see `WorkerTiming`.
    slept: the host's padding (``dilation_s``); ``overrun_s``: see `WorkerTiming`.
    load: the host-load input given to the share policy.
    sampled: False when the time is not a speed sample: the step waited for a compile, ran
      pieces standing in for a size still compiling, or a background compile competed.
    slowdown: the emulated host's slowdown (1.0 without one).
    exact: the step was padded to its emulated host's time with room to spare: its busy time
      is the host's, whatever compiled beside it (a sample even then).
    compiled_s: seconds this worker compiled since its last step, waited for or in the
      background (a background compile counts when it finishes; before the first step, a
      speed probe's compile counts there).
    ready: this worker can run the share a policy prepared (`prepare_upcoming`) without
      waiting for a compile, or none was prepared.
  """

  packed: Any
  step: int
  rows: int
  start: float
  data_s: float
  compute_s: float
  compile_s: float
  slept: float
  overrun_s: float
  load: float
  sampled: bool
  slowdown: float
  compiled_s: float = 0.0
  exact: bool = False
  ready: bool = True

  @property
  def busy_s(self) -> float:
    """Compute and emulated padding: the worker's busy time that the head carries."""
    return self.compute_s + self.slept

  def head_values(self) -> dict[str, Any]:
    """`WorkerTrainer.combine`'s keyword arguments for this worker's slots of the head."""
    return {'busy_s': self.busy_s, 'load': self.load, 'rows': self.rows,
            'sampled': 2.0 if self.exact else float(self.sampled), 'compile_s': self.compiled_s,
            'ready': float(self.ready)}

  def timing(self, worker: int, collective_s: float, end: float) -> WorkerTiming:
    """This worker's `WorkerTiming` of the step, given its collective time and its end."""
    return WorkerTiming(
        step=self.step + 1, worker=worker, share=self.rows, slowdown=self.slowdown,
        data_s=self.data_s, compute_s=self.compute_s, dilation_s=self.slept,
        collective_s=collective_s, step_s=end - self.start, compile_s=self.compile_s,
        load=self.load, overrun_s=self.overrun_s, sampled=self.sampled)


def prepare_upcoming(trainer: WorkerTrainer, shares: Any) -> None:
  """Starts compiling, in the background, the programs this worker's share of the shares a
  policy expects to move to will need (`hetjax.core.Shares.upcoming`), if any."""
  upcoming = getattr(shares, 'upcoming', None)
  trainer.programs.prepare(None if upcoming is None else int(upcoming[trainer.worker]))


def partial_gradient(trainer: WorkerTrainer, state: Any, work: Work,
                     shares: tuple[int, ...]) -> PartialGradient:
  """This worker's rows of ``work`` with ``shares``, its gradient at ``state.params``, padded.

  Example::

    part = partial_gradient(trainer, state, work, (40, 24))
    state, head = trainer.combine(state, part.packed, **part.head_values())
  """
  trainer.check_shares(shares)
  step, rows, pace = work.step, shares[trainer.worker], trainer.pace
  start = time.perf_counter()
  batch = jax.block_until_ready(trainer.place(slice_batch(work.batch, shares, trainer.worker)))
  computed = time.perf_counter()
  programs = trainer.programs
  compiling = programs.compiling
  packed = jax.block_until_ready(trainer.local_gradient(state, batch))
  compile_s = trainer.last_compile_s
  compute_s = time.perf_counter() - computed - compile_s
  compiled_s = programs.take_compiled()
  # A compile waited for, pieces standing in for a size still compiling, or a compile
  # competing for the cores: a true time, but not this worker's speed.
  sampled = not (programs.last_ran_pieces or compiling or programs.compiling or compiled_s > 0)
  if sampled and rows:
    programs.observe(rows, compute_s)
  slept, overrun = pace.pad(step, rows, compute_s) if pace else (0.0, 0.0)
  # Padded to its host's time with room to spare, the step took exactly the host's time, a
  # compile beside it or not.
  exact = slept > 0 and overrun == 0
  return PartialGradient(
      packed, step, rows, start, data_s=computed - start, compute_s=compute_s,
      compile_s=compile_s, slept=slept, overrun_s=overrun, load=host_load(pace, step),
      sampled=sampled or exact, slowdown=pace.factor(step) if pace else 1.0,
      compiled_s=compiled_s, exact=exact, ready=programs.ready)
