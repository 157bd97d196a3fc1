"""What a mode's builder returns: `Built`, everything the runner drives for one mode on one
worker, so that the runner reads no mode and probes no program."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from hetjax import checkpoint
from hetjax.run._config import Config, Mode

#: ``checkpoints(workdir, resume) -> checkpointer`` (`hetjax.checkpoint.CheckpointerProtocol`).
Checkpoints = Callable[[pathlib.Path, bool], checkpoint.CheckpointerProtocol]


@dataclasses.dataclass(frozen=True)
class Built:
  """Everything the runner (`hetjax.run.train`) drives, for one mode on this worker: the one
  value each mode's builder returns, so that the runner reads no mode and probes no program.

  Attributes:
    program: the `hetjax.core.StepProgram`.
    policy: the policy that decides its steps (shares, tokens, a sync or SchMP scheduler), or
      None.
    devices: where it runs, for the first line a run prints.
    mode: the mode it runs in.
    host: this worker's host of a known cost per row (``--slowdown``, a
      `hetjax.emulation.KnownSpeedHost`: ``run.json`` records its costs), or None (no
      slowdown, or a plan's stages, paced per action).
    describe: the run's first line after the model's name (mode, layout and devices).
    worker: this process's index among the training workers (a ps job's servers not counted).
    workers: the training workers of the job.
    checkpoints: this worker's checkpointer under the run directory (a resume restores its
      newest good checkpoint); `default_checkpoints` for one state saved by `Checkpointer`.
    restore_target: the abstract state a checkpoint of a step restores into.
    start: ``start(resume) -> (state, policy state)`` when the state is not this worker's to
      restore (a parameter-server worker pulls it from the servers); None: from ``checkpoints``.
    measure_speed: the share and token modes: ``measure_speed(state, the policy's first
      decision) -> samples/s`` of this worker on its first share or a token, padded to its
      host (``cluster.json``; its telemetry then goes to ``telemetry.jsonl``); None: no probe.
    warm_up: run once before the first step (pipeline replicas compile and connect their
      groups before the scheduler's clock starts), or None.
    finish: ``finish(state or None on failure) -> summary fields``, always called after the
      loop (the replicas' scheduler stops and reports; a ps worker says it is done).
    serve: ``serve(workdir)``: a parameter server's process serves instead of training; None
      for a worker.
    run_info: ``run.json``'s fields beyond the common ones.
  """

  program: Any
  policy: Any
  devices: str
  mode: Mode
  host: Any = None
  describe: str = ''
  worker: int = 0
  workers: int = 1
  checkpoints: Checkpoints | None = None
  restore_target: Callable[[int], Any] | None = None
  start: Callable[[bool], tuple[Any, Any]] | None = None
  measure_speed: Callable[[Any, Any], float] | None = None
  warm_up: Callable[[Any], Any] | None = None
  finish: Callable[[Any], dict] = lambda state: {}
  serve: Callable[[pathlib.Path], None] | None = None
  run_info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def default_checkpoints(config: Config) -> Checkpoints:
  """One `hetjax.checkpoint.Checkpointer` in ``WORKDIR/checkpoints``."""
  return lambda workdir, resume: checkpoint.Checkpointer(
      workdir / 'checkpoints', asynchronous=config.checkpoint.asynchronous)
