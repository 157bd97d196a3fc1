"""Pipeline replicas in the one loop: the sync policy as the loop's policy, and replica checkpoints.

`hetjax.train.training_steps` runs a `ReplicaDriver` like any step program. What the loop needs
besides is here:

- `ReplicaPolicy`, the loop's policy for a replica (a `hetjax.core.Policy`). A
  replica step takes no decision (the group scheduler forms the groups as replicas arrive), but
  the scheduler's state is the policy state the loop carries and a checkpoint saves: ``{'step':
  the replica's step, 'sync': the sync policy's state}``, taken from the running `SyncService`
  on worker 0 after each of its replica's steps. On the first ``update(state, None)`` of a run
  segment worker 0 starts the service from that state, cut at the step the replicas resume from
  (`resume_state`): a resumed run keeps SDPipe's windows, its staleness epoch, the random
  pairing's RNG and the group numbers. `close` waits for the service's report.
- `ReplicaCheckpointer`: each replica's parameters and optimizer state differ, and replicas
  step at their own pace, so each process saves its own checkpoints, in its own directory,
  with no barrier across processes.

Example (every process; ``channel`` the job's key-value channel)::

  sync = ReplicaPolicy(SyncPolicy('sdpipe', ctx.workers), channel, 'run0/sync', serve=ctx.is_chief)
  driver = ReplicaDriver(trainer, SyncClient(channel, 'run0/sync', ctx.worker), ctx.workers)
  ckpt = ReplicaCheckpointer(workdir / 'checkpoints' / f'replica-{ctx.worker}')
  for info in training_steps(driver, state, 100, [ckpt.hook(meta, 50)], sync):
    state = info.state
  driver.close()
  report = sync.close()
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
from collections.abc import Mapping
from typing import Any

from hetjax._errors import ConfigError
from hetjax.checkpoint import ArraysCheckpointer
from hetjax.core import StepStats
from hetjax.pipeline import PipelineState
from hetjax.replicas._driver import ServiceThread, start_service
from hetjax.replicas._policy import SyncPolicy, resume_state
from hetjax.replicas._service import Board, ServiceReport

AGREE_TIMEOUT_S = 300.0  # how long a replica waits for the others' proposals when restoring


class ReplicaPolicy:
  """The loop's policy for a pipeline replica (module docstring): ``init()``, ``update(state,
  stats) -> (None, state)`` after each of its steps, ``close()`` for the service's report.

  Args:
    policy: the sync policy (name, workers, options).
    board: the channel the service and the replicas' `SyncClient`s share.
    prefix: the service's key namespace (new for every run segment).
    serve: run the service here (worker 0).
    stop_after_s: the service gives up after this long (None: when every replica left).
  """

  def __init__(self, policy: SyncPolicy, board: Board, prefix: str, serve: bool,
               stop_after_s: float | None = None):
    self.policy, self.board, self.prefix, self.serve = policy, board, prefix, serve
    self.stop_after_s = stop_after_s
    self.thread: ServiceThread | None = None

  @property
  def name(self) -> str:
    return self.policy.name

  def init(self) -> dict[str, Any]:
    return {'step': 0, 'sync': self.policy.init()}

  def update(self, state: dict[str, Any], stats: StepStats | None) -> tuple[None, dict]:
    """No decision; the state after a step is the service's (worker 0) or kept (others)."""
    if stats is None:
      if self.serve and self.thread is None:
        sync = state['sync'] if state['step'] == 0 else resume_state(state['sync'],
                                                                     state['step'])
        self.thread = start_service(self.board, self.policy, self.prefix, self.stop_after_s,
                                    state=sync)
      return None, state
    sync = self.thread.service.policy_state() if self.thread is not None else state['sync']
    return None, {'step': int(stats.step) + 1, 'sync': sync}

  def close(self, timeout_s: float = 120.0) -> ServiceReport | None:
    """Waits for the service to stop once every replica has left; its report (None if this
    worker runs no service)."""
    if self.thread is None:
      return None
    thread, self.thread = self.thread, None
    return thread.join(timeout_s)


class ReplicaCheckpointer(ArraysCheckpointer):
  """One replica's checkpoints, in its own directory, written and restored by this process
  alone (the `hetjax.checkpoint.CheckpointerProtocol`).

  A replica's arrays live on this process only and differ from the other replicas', and
  replicas step at their own pace: orbax's array format refuses process-local arrays, and a
  save of the job's processes together would wait for the others. So each checkpoint is an
  orbax step directory written by this process alone (`hetjax.checkpoint.ArraysCheckpointer`:
  ``STEP/state/arrays.npz`` and the record ``STEP/meta``, checksums included). A restore
  verifies them. The restored state's step is the checkpoint's.

  The replicas of a job must resume from one step. Given the job's ``board`` (every replica
  passes its own ``replica`` index), ``restore(abstract_state)`` finds the newest step that
  every replica holds good: each proposes its newest good checkpoint (skipping a bad one with
  one warning line), all go down to the oldest proposal, and a replica that does not hold that
  step good proposes an older one, until they agree. Asked for by step, a bad checkpoint is a
  one-line `ConfigError`; without a board, a bad latest checkpoint is skipped for the one
  before it.

  Args:
    directory: this replica's step directories.
    max_to_keep: complete steps kept.
    board: the job's key-value channel (`hetjax.runtime.Channel`), or None.
    replica: this replica's index (with ``board``).
    replicas: how many replicas restore together (with ``board``).

  Example (every replica; ``channel`` the job's)::

    ckpt = ReplicaCheckpointer(workdir / 'checkpoints' / f'replica-{w}', board=channel,
                               replica=w, replicas=workers)
    state, meta = ckpt.restore(driver.abstract_state())   # the same step in every replica
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
               board: Board | None = None, replica: int = 0, replicas: int = 1):
    super().__init__(directory, alone=True, max_to_keep=max_to_keep)
    self._board, self._replica, self._replicas = board, replica, replicas
    self._restores = 0  # the same count in every replica: they restore together

  def restore(self, abstract_state: PipelineState, step: int | None = None
              ) -> tuple[PipelineState, dict[str, Any]]:
    """Checkpoint ``step`` (default: the newest good in every replica, with a ``board``) on
    ``abstract_state``'s shardings, and its record (class docstring).

    Raises:
      ConfigError: the asked step bad, or a replica with no good checkpoint at or before the
        others' (one line).
    """
    if step is not None or self._board is None or self._replicas == 1:
      return super().restore(abstract_state, step)
    self._restores += 1
    bound, found = None, None
    for agreement in itertools.count():
      if found is None or (bound is not None and found[0] > bound):
        found = self._newest_good(abstract_state, bound)
      key = f'checkpoints/restore{self._restores}/{agreement}'
      self._board.set(f'{key}/{self._replica}', 0 if found is None else found[0])
      steps = [self._proposal(key, r) for r in range(self._replicas)]
      if 0 in steps:
        raise ConfigError(f'replica {steps.index(0)} has no good checkpoint'
                          f'{"" if bound is None else f" at or before step {bound}"} (this '
                          f'replica\'s are in {self.directory})')
      if len(set(steps)) == 1:
        restored = found[1]
        return self._finish(restored.state, restored.meta, abstract_state), restored.meta
      bound = min(steps)
    raise AssertionError('unreachable')

  def _newest_good(self, abstract_state: PipelineState, bound: int | None
                   ) -> tuple[int, Any] | None:
    """This replica's newest checkpoint at or before ``bound`` that reads back and verifies,
    as (step, what was read), or None; each bad one skipped with one warning line."""
    candidates = [s for s in sorted(self.all_steps(), reverse=True) if bound is None or s <= bound]
    for i, step in enumerate(candidates):
      restored, problem = self._read(step, abstract_state)
      if problem is None:
        problem = self._verify(restored.state, restored.meta, abstract_state)
      if problem is None:
        return step, restored
      self._refuse_other_tree(step, abstract_state)  # another model's: older ones too
      then = f'using step {candidates[i + 1]}' if i + 1 < len(candidates) else \
          'no older one is good'
      print(f'warning: checkpoint step {step} in {self.directory} {problem}; {then}',
            file=sys.stderr, flush=True)
    return None

  def _proposal(self, key: str, replica: int) -> int:
    proposal = self._board.wait(f'{key}/{replica}', AGREE_TIMEOUT_S)
    if proposal is None:
      raise ConfigError(f'restoring replica {self._replica}: replica {replica} did not say '
                        f'which checkpoint it holds within {AGREE_TIMEOUT_S:.0f} s')
    return int(proposal)

  def _join(self, parts: Mapping[str, Any], abstract_state: PipelineState,
            meta: Mapping[str, Any]) -> PipelineState:
    return dataclasses.replace(parts['arrays'], step=int(meta['step']))
