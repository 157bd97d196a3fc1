"""`StepProgram`: the one shape of every way of running a training step.

SPMD on one mesh, per-worker shares, tokens and a pipeline replica all implement it, so one
loop (`hetjax.train.training_steps`), one checkpoint format, one telemetry stream and the
emulated hosts (`Pace`) are written once. A program owns its compiled functions; the loop owns
the step counter, the policy state and the hooks.

``work`` is what a step consumes: the step index and the host global batch of that step (a
function of the seed and the step only, never of how it is split). ``decision`` is the
policy's answer for the step (`Shares`, a token decision, …; None for programs without one).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from hetjax.core._pace import Pace
from hetjax.core._stats import StepStats

Batch = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Work:
  """The work of one step: its index and its host global batch (numpy arrays by name)."""

  step: int
  batch: Batch


@runtime_checkable
class StepProgram(Protocol):
  """A compiled way of running one training step.

  Constructors share one argument order: ``(task, optimizer, global_batch, <layout…>, *,
  seed=…)``.
  """

  global_batch: int
  #: The model, loss and data (`hetjax.train.Task`; a SchMP app): its ``name`` and ``config``
  #: identify a checkpoint's model.
  task: Any

  def init_state(self) -> Any:
    """A fresh training state, created directly in its layout."""
    ...

  def abstract_state(self) -> Any:
    """Shapes, dtypes and shardings of the state: the restore target of a checkpoint."""
    ...

  def global_batch_at(self, step: int) -> Batch:
    """The host global batch of ``step``."""
    ...

  def step(self, state: Any, work: Work, decision: Any) -> tuple[Any, StepStats]:
    """Runs one step on ``work`` as ``decision`` says; ``state`` is donated."""
    ...

  def close(self) -> None:
    """Releases what the program holds beyond its arrays (threads, connections, a replica's
    group membership); called once when the run ends, however it ends."""
    ...

  def evaluate(self, state: Any, batch: Batch) -> dict[str, float] | None:
    """``{'loss': mean loss, …}`` of a host ``batch`` (held-out rows) under ``state``'s
    parameters, with the means of the task's metrics (a classifier's accuracy) where the
    program holds the model's outputs; changes nothing: what periodic evaluation reads.
    Every process of the job calls it (the parameters may span them); a process that does not
    get the value returns None (process 0 always gets it)."""
    ...

  def use_host(self, host: Pace | None) -> None:
    """Runs its steps at the pace of ``host`` from now on: an emulated host and links
    (`Pace`, built by `hetjax.emulation`), called at the program's phase boundaries; None: the
    machine's own speed. A host is calibrated on the program's own computation, so a program
    takes it after it is built. The program asks nothing of ``host`` but the `Pace` calls (a
    share step pads its rows and its exchange, a plan's stages each action, a replica its
    step); a program that cannot be paced (one SPMD program over every device) refuses any
    host in one line."""
    ...


@runtime_checkable
class HasModel(Protocol):
  """A program that can give its model whole to this process: what a sample of a language
  model during training is drawn from (``eval.sample``)."""

  def whole_model(self, state: Any) -> Any | None:
    """The task's model (an ``nnx.Module``) with ``state``'s parameters, every one of them on
    this process's devices; None where they are not (split over processes). Changes nothing."""
    ...
