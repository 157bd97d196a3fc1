"""Pipeline replicas in the one loop: the sync policy as the loop's policy, and replica checkpoints.

`hetjax.train.training_steps` runs a `ReplicaDriver` like any step program. What the loop needs
besides is here:

- `ReplicaSync`, the loop's policy for a replica. A replica step takes no decision (the group
  scheduler forms the groups as replicas arrive), but the scheduler's state is the policy state
  the loop carries and a checkpoint saves: ``{'step': the replica's step, 'sync': the sync
  policy's state}`` (`SyncValuePolicy`), taken from the running `SyncService` on worker 0 after
  each of its replica's steps. On the first ``update(state, None)`` of a run segment worker 0
  starts the service from that state, cut at the step the replicas resume from
  (`resume_state`): a resumed run keeps SDPipe's windows, its staleness epoch, the random
  pairing's RNG and the group numbers. `close` waits for the service's report.
- `ReplicaCheckpointer`: each replica's parameters and optimizer state differ, and replicas
  step at their own pace, so each process saves its own checkpoints, in its own directory,
  with no barrier across processes.

Example (every process; ``channel`` the job's key-value channel)::

  sync = ReplicaSync(SyncValuePolicy('sdpipe', ctx.workers), channel, 'run0/sync',
                     serve=ctx.is_chief)
  driver = ReplicaDriver(trainer, SyncClient(channel, 'run0/sync', ctx.worker), ctx.workers)
  ckpt = ReplicaCheckpointer(workdir / 'checkpoints' / f'replica-{ctx.worker}')
  for info in training_steps(driver, state, 100, [ckpt.hook(meta, 50)], sync):
    state = info.state
  driver.close()
  report = sync.close()
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from hetjax._errors import ConfigError
from hetjax.core import StepStats, encode_state
from hetjax.pipeline._replicated import ServiceThread, start_service
from hetjax.pipeline._step_directories import StepDirectories
from hetjax.pipeline._sync_service import Board, ServiceReport
from hetjax.pipeline._sync_values import SyncValuePolicy, resume_state


class ReplicaSync:
  """The loop's policy for a pipeline replica (module docstring).

  Args:
    value: the sync policy (name, workers, options).
    board: the channel the service and the replicas' `SyncClient`s share.
    prefix: the service's key namespace (new for every run segment).
    serve: run the service here (worker 0).
    stop_after_s: the service gives up after this long (None: when every replica left).
  """

  def __init__(self, value: SyncValuePolicy, board: Board, prefix: str, serve: bool,
               stop_after_s: float | None = None):
    self.value, self.board, self.prefix, self.serve = value, board, prefix, serve
    self.stop_after_s = stop_after_s
    self.thread: ServiceThread | None = None

  @property
  def name(self) -> str:
    return self.value.name

  def init(self) -> dict[str, Any]:
    return {'step': 0, 'sync': self.value.init()}

  def update(self, state: dict[str, Any], stats: StepStats | None) -> tuple[None, dict]:
    """No decision; the state after a step is the service's (worker 0) or kept (others)."""
    if stats is None:
      if self.serve and self.thread is None:
        sync = state['sync'] if state['step'] == 0 else resume_state(state['sync'],
                                                                     state['step'])
        self.thread = start_service(self.board, self.value.make(sync), self.prefix,
                                    self.stop_after_s)
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


class ReplicaCheckpointer(StepDirectories):
  """`hetjax.checkpoint.Checkpointer`'s interface for one replica's checkpoints, in its own
  directory, written by this process alone.

  A replica's arrays live on this process only and differ from the other replicas': orbax
  serializes neither (it refuses process-local arrays under several processes, and writes host
  arrays from process 0 only), and its saves would wait on the other processes, which step at
  their own pace. So a checkpoint here is ``STEP/state.npz`` (host copies of the state's
  leaves, in `jax.tree` order) and ``STEP/meta.json`` (the same record as `Checkpointer`'s,
  the policy state under ``'policy'``), written to a temporary directory and renamed when
  complete; `restore` puts the leaves back on the restore target's shardings.
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3):
    super().__init__(directory, max_to_keep)

  def save(self, state: Any, meta: Mapping[str, Any], policy_state: Any = None) -> None:
    step = int(state.step)
    record = {**meta, 'step': step}
    if policy_state is not None:
      record['policy'] = encode_state(policy_state)
    final = os.path.join(self.directory, str(step))
    temporary = tempfile.mkdtemp(prefix=f'.{step}-', dir=self.directory)
    leaves = jax.device_get(jax.tree.leaves(state))
    np.savez(os.path.join(temporary, 'state.npz'), *leaves)
    with open(os.path.join(temporary, 'meta.json'), 'w') as f:
      json.dump(record, f)
    if os.path.exists(final):
      shutil.rmtree(final)
    os.rename(temporary, final)
    for old in self.all_steps()[:-self.max_to_keep]:
      shutil.rmtree(os.path.join(self.directory, str(old)))

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict]:
    """Checkpoint ``step`` (default: the latest) on the shardings of ``abstract_state``."""
    step = self._require(step)
    leaves, treedef = jax.tree.flatten(abstract_state)
    with np.load(os.path.join(self.directory, str(step), 'state.npz'), allow_pickle=False) as saved:
      host = [saved[f'arr_{i}'] for i in range(len(saved.files))]
    if len(host) != len(leaves) or any(h.shape != a.shape for h, a in zip(host, leaves, strict=True)):
      raise ConfigError(f'checkpoint {step} in {self.directory} does not fit this pipeline '
                        f'({len(host)} arrays saved, {len(leaves)} expected)')
    placed = [jax.device_put(h.astype(a.dtype), a.sharding)
              for h, a in zip(host, leaves, strict=True)]
    return treedef.unflatten(placed), self.read_meta(step)
