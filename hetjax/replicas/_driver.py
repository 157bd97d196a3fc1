"""SDPipe on real workers: pipeline replicas that average each stage within scheduler-made groups.

A *replica* is one process running a whole pipeline (`PipelineTrainer` over its own devices,
one device group per stage). After every step it reports to the group scheduler
(`SyncClient.arrive`), waits for its group, and averages each stage's parameters with the
group's members (`GroupAverager`, one per stage: a collective over a mesh of exactly the members'
devices of that stage). Groups of disjoint replicas average at the same time; a replica never
waits for one outside its group. Optimizer states stay local (SDPipe averages parameters).

Why a replica is one process: a pipeline whose stages sit in different processes moves carries
with cross-process `jax.device_put`, and JAX keys those transfers by a counter that *every*
process advances (`hetjax.pipeline._transfer`), so all processes would have to walk one global
order of transfers: the replicas would run in lock step, and decentralised groups would be moot.
With a replica per process, stage s of every replica sits on the same local device positions,
and stage s's groups average over exactly those devices of the members.

Overlap (``overlap=True``, our option; SDPipe waits for its group). A replica does not wait
for step t's group: it reports, hands the group wait and the averaging of a copy of its
parameters x_t to a background thread, and computes step t + 1 from x_t at once. When that step
is done it takes the group's mean x̄_t and keeps its own progress: x_{t+1} ← x̄_t + (x_{t+1} −
x_t), then reports step t + 1. Every replica still averages in its groups, in the scheduler's
order, once per step; the averages are one step late, and the group wait and the collective
run during the next step's compute instead of after it.

Local SGD (``outer=``, ``steps_per_round=`` H; our option): the replicas sync on the
periodic-average schedule every H steps, and each stage's group mean makes the round's outer
step from the stage's parameters at the round's start (`hetjax.replicas._outer`: DiLoCo's outer
optimizer, whose state the replica's state carries and its checkpoints save).

Data: replica r's step t (t = 0, 1, …) trains on position ``t × replicas + r`` of the task's data
stream, so replicas see disjoint batches while their step counts stay close.

Example (every process; worker 0 also runs the scheduler, see `start_service`)::

  trainer = PipelineTrainer(task, optax.sgd(0.1), 64, stages=2, devices=jax.local_devices())
  client = SyncClient(channel, 'run0', jax.process_index())
  driver = ReplicaDriver(trainer, client, replicas=jax.process_count())
  state, steps = driver.run(trainer.init_state(), steps=100)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._checks import positive_int
from hetjax._errors import ConfigError
from hetjax.core import Pace, StepStats, Work
from hetjax.pipeline import PipelineState, PipelineTrainer
from hetjax.replicas._averaging import GroupAverager
from hetjax.replicas._outer import OuterSteps
from hetjax.replicas._policy import SyncPolicy
from hetjax.replicas._service import Board, ServiceReport, SyncClient, SyncService
from hetjax.train import training_steps


@dataclasses.dataclass(frozen=True)
class ReplicaStep:
  """One step of one replica (seconds on this replica's clock, from the start of `run`).

  Attributes:
    step: the step completed (1, 2, …; the optimizer's step count after it).
    loss: the mean training loss of the step's batch (before the update).
    start_s: when the step began.
    compute_s: forward, backward and update, until the parameters were ready.
    pause_s: emulated slowness slept after the compute (the replica's host).
    wait_s: from reporting to the scheduler until the group was known.
    sync_s: averaging with the group (0 for a group of one), and under local SGD the outer
      step at a round's end.
    members: the group, in increasing order (this replica included).
    global_sync: whether the group was a global synchronisation.
    seq: the group's number in the scheduler's order (`SyncGroup.seq`).

  With ``overlap``, ``wait_s`` is how long the replica blocked for the previous step's group
  mean, ``sync_s`` the time to apply it and hand this step's averaging off, and ``members``,
  ``global_sync`` and ``seq`` are that previous step's group (``()``, False and -1 at step 1).
  """

  step: int
  loss: float
  start_s: float
  compute_s: float
  pause_s: float
  wait_s: float
  sync_s: float
  members: tuple[int, ...]
  global_sync: bool
  seq: int

  @property
  def end_s(self) -> float:
    return self.start_s + self.compute_s + self.pause_s + self.wait_s + self.sync_s


class _PastDeadline(Exception):
  """`ReplicaDriver.step` refusing to start past `ReplicaDriver.run`'s ``until_s``."""


class ReplicaDriver:
  """Trains this process's pipeline replica under a group scheduler (module docstring).

  Args:
    trainer: a `PipelineTrainer` whose stages are all on this process's devices.
    client: this replica's `SyncClient`; its worker id must be this process's index.
    replicas: how many replicas the job has (one per process).
    host: the pace of this replica's emulated host (`hetjax.core.Pace`): each step's compute
      of the batch's rows is padded to it (a slower host or a straggler); None: the machine's
      own speed (`use_host`).
    group_timeout_s: the longest wait for a group before giving up with a `TimeoutError`.
    overlap: average one step late, overlapped with the next step (module docstring).
    outer: local SGD's outer optimizer (`hetjax.train.outer_optimizer`): at every
      ``steps_per_round``-th step the group's mean makes an outer step (module docstring); the
      sync policy must group every replica at those steps (``'periodic-average'`` with
      ``every`` = ``steps_per_round``). None: the group's mean is taken as it is.
    steps_per_round: the steps of a round under ``outer``.

  Raises:
    ConfigError: a stage on another process, a worker id that is not this process's, or
      ``outer`` with ``overlap``.
  """

  def __init__(self, trainer: PipelineTrainer, client: SyncClient, replicas: int,
               host: Pace | None = None, group_timeout_s: float = 120.0,
               overlap: bool = False, outer: optax.GradientTransformation | None = None,
               steps_per_round: int = 1):
    self.trainer, self.client, self.pace, self.overlap = trainer, client, host, overlap
    if outer is not None and overlap:
      raise ConfigError('local SGD\'s outer step takes the round\'s mean before the next round '
                        'starts from it: a replica with an outer optimizer does not overlap')
    self.rounds = None if outer is None else OuterSteps(trainer, outer, steps_per_round)
    self.replicas = positive_int(replicas, 'replicas')
    self.group_timeout_s = group_timeout_s
    remote = [s for s in range(trainer.stages) if s not in trainer.local_stages]
    if remote:
      raise ConfigError(f'stages {remote} are on other processes; a replica runs its whole '
                        'pipeline on its own devices (devices=jax.local_devices())')
    self.replica = jax.process_index()
    if client.worker != self.replica or not self.replica < self.replicas:
      raise ConfigError(f'the client speaks for worker {client.worker}, but this is process '
                        f'{self.replica} of {self.replicas} replicas')
    self.averagers: tuple[GroupAverager, ...] = ()  # per stage, made on first use
    self._t0: float | None = None  # when the first step began (`ReplicaStep.start_s`)
    self._stop_at: float | None = None  # `run`'s deadline: no step starts at or after it
    self._background: concurrent.futures.ThreadPoolExecutor | None = None  # overlap only
    self._pending = None  # overlap: (the copy x_t, the future of (its group, the group's mean))

  def batch_at(self, step: int):
    """The host batch of this replica's step ``step`` (module docstring)."""
    t = self.trainer
    return t.task.data.global_batch(t.seed, step * self.replicas + self.replica, t.global_batch)

  def _averagers(self, state: PipelineState) -> tuple[GroupAverager, ...]:
    if not self.averagers:
      self.averagers = tuple(GroupAverager(list(mesh.devices.flat), params)
                             for mesh, params in zip(self.trainer.meshes, state.params,
                                                     strict=True))
    return self.averagers

  def warm_up(self, state: PipelineState, max_groups: int = 64) -> float:
    """Pays before training what the first steps would otherwise pay: the stage programs'
    compiles (one step on a copy of ``state``) and, if there are at most
    ``max_groups`` groups holding this replica, every such group's averaging program, compiled
    and run once on zeros (gloo connects a group's processes on its first collective). Every
    replica must call it (the groups run in one global order); ``state`` is not changed.
    Returns the seconds it took."""
    start = time.monotonic()
    copy = jax.tree.map(jnp.copy, (state.params, state.opt_state))  # train_step donates
    jax.block_until_ready(self.trainer.train_step(
        dataclasses.replace(state, params=copy[0], opt_state=copy[1]), self.batch_at(state.step)))
    if self.rounds is not None:
      self.rounds.warm_up(state)
    groups = [g for k in range(2, self.replicas + 1)
              for g in itertools.combinations(range(self.replicas), k)]
    if sum(self.replica in g for g in groups) <= max_groups:
      zeros = dataclasses.replace(state, params=jax.tree.map(jnp.zeros_like, state.params))
      for group in groups:
        if self.replica in group:
          jax.block_until_ready(self.average(zeros, group).params)
    return time.monotonic() - start

  def average(self, state: PipelineState, members: tuple[int, ...]) -> PipelineState:
    """``state`` with every stage's parameters averaged over ``members`` (all must call)."""
    params = tuple(avg.average(p, members) for avg, p in zip(self._averagers(state),
                                                             state.params, strict=True))
    return dataclasses.replace(state, params=self.place(params))

  def place(self, params: tuple) -> tuple:
    """Per-stage trees (arrays or host values) replicated on their stages' own shardings.

    Arrays already on a stage's devices are not copied. Averaged parameters come back on the
    averager's mesh, an equal sharding of another mesh, which would make the stage programs
    compile again; placing them here avoids that."""
    return tuple(jax.device_put(p, NamedSharding(mesh, PartitionSpec()))
                 for p, mesh in zip(params, self.trainer.meshes, strict=True))

  # -- the StepProgram shape: one replica step, run by `hetjax.train.training_steps` ----------

  @property
  def global_batch(self) -> int:
    return self.trainer.global_batch

  @property
  def task(self):
    return self.trainer.task

  def init_state(self) -> PipelineState:
    """The pipeline's fresh state; under local SGD with a fresh outer state too."""
    state = self.trainer.init_state()
    return state if self.rounds is None else self.rounds.init(state)

  def abstract_state(self, step: int = 0) -> PipelineState:
    abstract = self.trainer.abstract_state(step)
    return abstract if self.rounds is None else self.rounds.abstract(abstract)

  def global_batch_at(self, step: int):
    """This replica's batch of its step ``step`` (`batch_at`)."""
    return self.batch_at(step)

  def step(self, state: PipelineState, work: Work, decision: None = None
           ) -> tuple[PipelineState, StepStats]:
    """One replica step: compute, pause (emulated slowness), then report to the scheduler and
    average within the group it forms (or, with ``overlap``, catch up with the previous step's
    group and hand this one off); under local SGD, a round's last step then takes the outer
    step. ``stats.local`` is the step's `ReplicaStep`."""
    if decision is not None:
      raise ConfigError(f'a replica step takes no decision (the scheduler forms the groups), '
                        f'got {decision!r}')
    if self._t0 is None:
      self._t0 = time.monotonic()
    t0 = time.monotonic()
    if self._stop_at is not None and t0 >= self._stop_at:
      raise _PastDeadline   # `run`'s until_s passed since its last check: start nothing
    if self.rounds is not None:
      self.rounds.begin(state)
    stepped, loss = self.trainer.train_step(state, work.batch)
    state = dataclasses.replace(state, step=stepped.step, params=stepped.params,
                                opt_state=stepped.opt_state)  # what else it carries, kept
    jax.block_until_ready(state.params)
    loss = float(loss)
    t1 = time.monotonic()
    paused = (self.pace.pad(state.step, self.trainer.global_batch, t1 - t0)[0]
              if self.pace is not None else 0.0)
    t2 = time.monotonic()
    if not self.overlap:
      self.client.arrive(state.step)
      group = self.client.group(state.step, self.group_timeout_s)
      t3 = time.monotonic()
      synced = len(group.members) > 1
      if synced:
        state = self.average(state, tuple(sorted(group.members)))
      if self.rounds is not None and self.rounds.ends(state.step):
        state, synced = self.rounds.apply(state), True
      if synced:
        jax.block_until_ready(state.params)
      else:
        t3 = None  # no sync: sync_s is 0
    else:
      if self._background is None:
        self._background = concurrent.futures.ThreadPoolExecutor(1)
      group = None
      if self._pending is not None:  # the last step's group, averaged meanwhile
        group, state = self._catch_up(state, *self._pending)
      t3 = time.monotonic()
      jax.block_until_ready(state.params)
      self._pending = self._hand_off(self._background, state)
    t4 = time.monotonic()
    t3 = t4 if t3 is None else t3
    record = ReplicaStep(state.step, loss, t0 - self._t0, t1 - t0, paused, t3 - t2, t4 - t3,
                         *_group_fields(group))
    return state, StepStats(work.step, (self.global_batch,), (t1 - t0 + paused,),
                            sync_s=t4 - t3, iter_s=t4 - t0, loss=loss, local=record)

  def finish(self, state: PipelineState) -> PipelineState:
    """Ends a run of steps: with ``overlap``, moves ``state`` onto its last step's group mean
    and stops the background thread. Call it once the steps are done."""
    try:
      if self._pending is not None:
        _, state = self._catch_up(state, *self._pending)
    finally:
      self._pending = None
      if self._background is not None:
        self._background.shutdown(wait=True)
        self._background = None
    return state

  def close(self) -> None:
    """Ends steps run by `hetjax.train.training_steps` itself (not `run`): stops the overlap
    thread and leaves the scheduler, so nobody waits for this replica any more."""
    if self._background is not None:
      self._background.shutdown(wait=True)
      self._background, self._pending = None, None
    self.client.leave()

  def evaluate(self, state: PipelineState, batch) -> dict[str, float] | None:
    """Mean loss of ``batch`` under this replica's parameters (its pipeline's `evaluate`)."""
    return self.trainer.evaluate(state, batch)

  def use_host(self, host: Pace | None) -> None:
    """Pads each step's compute of the batch's rows to ``host`` (`hetjax.core.Pace.pad`: a
    host of known speed, or a replica's host priced per step); None: no padding."""
    self.pace = host

  def run(self, state: PipelineState, steps: int | None = None, until_s: float | None = None,
          on_step: Callable[[ReplicaStep, PipelineState], None] | None = None,
          leave: bool = True
          ) -> tuple[PipelineState, list[ReplicaStep]]:
    """Trains until ``state.step`` reaches ``steps`` or ``until_s`` seconds have passed (no new
    step starts after that), then leaves the scheduler (unless ``leave`` is False: then the
    caller must call ``client.leave()`` later, or the others wait for it until it is dropped).
    ``on_step(record, state)`` is called after every step, with the state after its averaging.
    The steps run in `hetjax.train.training_steps`, the loop every mode shares.

    Returns:
      The final state and one `ReplicaStep` per step taken.
    """
    if steps is None and until_s is None:
      raise ConfigError('give steps, until_s or both')
    records: list[ReplicaStep] = []
    self._t0 = start = time.monotonic()
    # The check after each step saves loading the next batch; the one at the step's own start
    # (`step`, the same clock reading its start_s is) makes "no step starts after" exact.
    self._stop_at = None if until_s is None else start + until_s
    try:
      if until_s is None or until_s > 0:
        try:
          for info in training_steps(self, state, sys.maxsize if steps is None else steps):
            state = info.state
            records.append(info.stats.local)
            if on_step:
              on_step(info.stats.local, state)
            if until_s is not None and time.monotonic() - start >= until_s:
              break
        except _PastDeadline:
          pass   # the step that would have started late did nothing: state is the last one
      state = self.finish(state)
    finally:
      self._stop_at = None
      if self._background is not None:  # stopped by an error: end the thread, keep the error
        self._background.shutdown(wait=True)
        self._background, self._pending = None, None
      if leave:
        self.client.leave()
    return state, records

  def _hand_off(self, background, state: PipelineState):
    """Reports ``state.step`` and averages a copy of ``state``'s parameters in the background.

    Only the parameters are copied and read there: the optimizer state is the next step's to
    donate."""
    copy = jax.tree.map(jnp.copy, state.params)
    step = state.step
    self.client.arrive(step)

    def average():
      group = self.client.group(step, self.group_timeout_s)
      members = tuple(sorted(group.members))
      if len(members) == 1:
        return group, copy
      mean = self.average(dataclasses.replace(state, params=copy, opt_state=None), members)
      return group, jax.block_until_ready(mean.params)

    return copy, background.submit(average)

  def _catch_up(self, state: PipelineState, copy, future) -> tuple:
    """``state`` moved onto its last report's group mean: x̄ + (x − copy)."""
    group, mean = future.result()
    if len(group.members) == 1:  # nothing to move onto
      return group, state
    moved = tuple(_add_progress(m, n, o) for m, n, o in zip(mean, state.params, copy,
                                                             strict=True))
    return group, dataclasses.replace(state, params=self.place(moved))


@jax.jit
def _add_progress(mean, new, old):
  """One stage's x̄ + (x − copy)."""
  return jax.tree.map(lambda m, n, o: m + (n - o), mean, new, old)


def _group_fields(group) -> tuple:
  """``(members, global_sync, seq)`` for a `ReplicaStep` (``((), False, -1)`` for none)."""
  if group is None:
    return (), False, -1
  return tuple(sorted(group.members)), group.global_sync, group.seq


@dataclasses.dataclass
class ServiceThread:
  """A `SyncService` running in a daemon thread (`start_service`)."""

  service: SyncService
  thread: threading.Thread
  result: dict[str, Any]

  def join(self, timeout_s: float | None = None) -> ServiceReport:
    """Waits for the service to stop; its report (re-raises what stopped it, if anything)."""
    self.thread.join(timeout_s)
    if self.thread.is_alive():
      raise TimeoutError(f'the group scheduler at {self.service.prefix!r} is still running')
    if 'error' in self.result:
      raise self.result['error']
    return self.result['report']


def start_service(board: Board, policy: SyncPolicy, prefix: str,
                  stop_after_s: float | None = None, **options) -> ServiceThread:
  """Runs ``SyncService(board, policy, prefix, **options).run(stop_after_s)`` in a daemon
  thread (the coordination service's blocking reads release the GIL, so the replica beside it
  keeps its core); ``options`` may hold the ``state`` to continue from.

  Example (worker 0)::

    thread = start_service(channel, SyncPolicy('sdpipe', ctx.workers), 'run0')
    ...
    report = thread.join(60)
  """
  service = SyncService(board, policy, prefix, **options)
  result: dict[str, Any] = {}

  def serve():
    try:
      result['report'] = service.run(stop_after_s)
    except BaseException as e:  # handed to join()
      result['error'] = e

  thread = threading.Thread(target=serve, name=f'sync-service:{prefix}', daemon=True)
  thread.start()
  return ServiceThread(service, thread, result)
