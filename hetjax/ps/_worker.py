"""`PsWorker`: a worker of a parameter-server job, as a `StepProgram` of the one loop.

Its state is what it holds between steps (`PsWorkerState`): the parameters it last pulled, each
server's version of them, and how many of its pushes were accepted. A step computes this
worker's gradient on its rows of the step's global batch (an equal share: the global batch
split over the workers), pads it to its emulated host's time, and then:

* push-then-pull (``eager`` off): pushes, waits for the acks, pulls (under bsp the next
  version, once every worker has pushed; under ssp once the slowest worker is at most
  ``bound`` pushes behind) and returns the new parameters: compute + push + pull.
* eager pull: the push of this step's gradient and the pull that follows it at once run on a
  communication thread while the *next* step computes; a step waits for the previous step's
  communication only after its own compute, and adopts the parameters it pulled: max(compute,
  push + pull), for gradients one own step staler. `finish` waits for the last push.

The parameters and optimizer state live on the servers: checkpoints are theirs
(`hetjax.ps.ServerCheckpointer`); a worker restarts by pulling. The servers hold the float
parameters only (`hetjax.train.split_trainable`): model state that is not (a dropout stream's
key and count) is held fixed by each worker, at its initial value, and never sent.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hetjax._errors import ConfigError
from hetjax.core import Pace, ShareRules, StepStats, Work, host_load
from hetjax.data import Batch, StepBatch, slice_batch
from hetjax.ps._client import PsClient, PushResult
from hetjax.ps._config import Consistency, PsConfig
from hetjax.sharding import abstract_model, initial_params
from hetjax.train import (
  Task,
  merge_trainable,
  micro_rows_of,
  split_trainable,
  summed_value_and_grad,
  trainable_value_and_grad,
)

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PsWorkerState:
  """A worker's view: its steps done, the parameters it holds and each server's version of
  them, and its accepted pushes (its ssp clock)."""

  step: int = dataclasses.field(metadata={'static': True})
  params: PyTree
  versions: tuple[int, ...] = dataclasses.field(metadata={'static': True})
  clock: int = dataclasses.field(metadata={'static': True}, default=0)


@dataclasses.dataclass(frozen=True)
class PsStep:
  """This worker's breakdown of a step (`StepStats.local`).

  Attributes:
    step: steps done after it.
    worker: the worker id.
    compute_s: its gradient, measured; ``dilation_s``: the emulated host's padding.
    push_s / pull_s: the push and the pull of the communication that finished in this step
      (eager: the previous step's).
    wait_s: how long the step waited for that communication after its compute (eager only;
      push-then-pull: its whole communication).
    staleness: the servers' staleness of the push (max over servers).
    accepted: whether the push was accepted; ``reasons`` otherwise.
    versions: each server's version of the parameters the next step computes on.
  """

  step: int
  worker: int
  compute_s: float
  dilation_s: float
  push_s: float
  pull_s: float
  wait_s: float
  staleness: int
  accepted: bool
  reasons: tuple[str, ...]
  versions: tuple[int, ...]


class PsWorker:
  """A parameter-server worker (module docstring).

  Args:
    task: the model, loss and data (the same on the servers).
    global_batch: rows per step over all workers; each worker computes its equal share.
    config: the protocol (`PsConfig`).
    client: this worker's `PsClient` (its servers, channel, transport and links).
    workers: how many workers share the global batch.
    seed: selects the data (and, on the servers, the initial parameters).
    host: the pace of the emulated host this worker runs as (`hetjax.core.Pace`; None: the
      machine's own speed).
    accumulate: gradient accumulation: this worker's share in micro-batches of at most
      share / ``accumulate`` rows (`hetjax.train.summed_value_and_grad`), one push a step.
  """

  def __init__(self, task: Task, global_batch: int, config: PsConfig, client: PsClient, *,
               workers: int, seed: int = 0, host: Pace | None = None,
               accumulate: int = 1):
    if global_batch < workers:
      raise ConfigError(f'global batch {global_batch} is smaller than the {workers} workers')
    self.task, self.global_batch, self.config, self.client = task, global_batch, config, client
    self.worker, self.workers, self.seed, self.pace = client.worker, workers, seed, host
    self.shares = ShareRules(global_batch, workers).uniform().values  # X // n, remainder first
    self.micro_rows = micro_rows_of(self.shares[self.worker], accumulate)
    self.graphdef, self._abstract, _ = abstract_model(task.make_model, seed)
    self._fixed = _fixed_state(task, seed, self._abstract, client.transport.device)
    self.device = client.transport.device
    self._grad = jax.jit(self._loss_and_grad)
    self._evaluate = None
    self._comm = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='hetjax-ps-comm')
                  if config.eager else None)
    self._inflight: concurrent.futures.Future | None = None
    self.refused = 0
    self._accepted = 0  # pushes the servers accepted: this worker's ssp clock

  # -- the StepProgram ---------------------------------------------------------------------------

  def close(self) -> None:
    """Nothing to release here: `finish` tells the servers this worker is done."""

  def evaluate(self, state: PsWorkerState, batch: Batch) -> dict[str, float]:
    """Mean loss (and the task's metrics) of the host ``batch`` under the parameters this
    worker last pulled."""
    if self._evaluate is None:
      self._evaluate = jax.jit(lambda p, b: self.task.eval_means(nnx.merge(self.graphdef, p), b))
    found = self._evaluate(state.params, jax.device_put(dict(batch), self.device))
    return {k: float(v) for k, v in found.items()}

  def use_host(self, host: Pace | None) -> None:
    """Pads each step's gradient to ``host`` (`hetjax.core.Pace.pad`): this worker's rows take
    its time."""
    self.pace = host

  def init_state(self) -> PsWorkerState:
    """The servers' current parameters (version 0 on a fresh job), pulled; the step is the
    number of this worker's pushes the servers hold (0 on a fresh job; a restored server's
    count on a resumed one), so the data continues where it stopped."""
    params, versions, _ = self.client.pull()
    params = merge_trainable(params, self._fixed)
    self._accepted = self.client.last_clock
    return PsWorkerState(self.client.last_clock, params, versions, self.client.last_clock)

  def time_gradient(self, state: PsWorkerState, repeats: int = 3) -> tuple[float, ...]:
    """``repeats`` timed gradients of this worker's share (step 0's rows), after one untimed
    run that compiles it: what a host of known speed is calibrated from."""
    batch = jax.device_put(slice_batch(self.global_batch_at(0), self.shares, self.worker),
                           self.device)
    jax.block_until_ready(self._grad(state.params, batch))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(self._grad(state.params, batch))
      times.append(time.perf_counter() - start)
    return tuple(times)

  def whole_model(self, state: PsWorkerState) -> nnx.Module:
    """The model with the parameters this worker last pulled (`hetjax.core.HasModel`)."""
    return nnx.merge(self.graphdef, state.params)

  def abstract_state(self) -> PsWorkerState:
    return PsWorkerState(0, self._abstract, (0,) * self.client.layout.servers)

  def global_batch_at(self, step: int) -> StepBatch:
    """Step ``step``'s global batch, read lazily: a step reads this worker's share only."""
    return StepBatch(self.task.data, self.seed, step, self.global_batch)

  def step(self, state: PsWorkerState, work: Work, decision: Any = None
           ) -> tuple[PsWorkerState, StepStats]:
    if decision is not None:
      raise ConfigError('a parameter-server worker takes no share decision (its share is '
                        'global_batch / workers)')
    start = time.perf_counter()
    rows = self.shares[self.worker]
    batch = jax.device_put(slice_batch(work.batch, self.shares, self.worker), self.device)
    computed = time.perf_counter()
    loss, grads = jax.block_until_ready(self._grad(state.params, batch))
    compute_s = time.perf_counter() - computed
    slept = self.pace.pad(work.step, rows, compute_s)[0] if self.pace else 0.0
    loss = float(loss)
    waited = time.perf_counter()
    if self._comm is None:
      push, params, versions, pull_s = self._communicate(grads, state, rows, loss)
    else:
      previous, self._inflight = self._inflight, self._comm.submit(
          self._communicate, grads, state, rows, loss)
      if previous is None:  # the first step: nothing to adopt yet
        push, params, versions, pull_s = None, state.params, state.versions, 0.0
      else:
        push, params, versions, pull_s = previous.result()
    end = time.perf_counter()
    accepted = push is None or push.accepted
    self.refused += not accepted
    local = PsStep(state.step + 1, self.worker, compute_s, slept,
                   push.seconds if push else 0.0, pull_s, end - waited,
                   push.staleness if push else 0, accepted, push.reasons if push else (),
                   versions)
    stats = StepStats(work.step, (rows,), (compute_s + slept,), sync_s=end - waited,
                      iter_s=end - start, load=(host_load(self.pace, work.step),),
                      bytes=self.client.layout.nbytes(), loss=jnp.float32(loss), local=local)
    return PsWorkerState(state.step + 1, params, versions, self._accepted), stats

  def finish(self, state: PsWorkerState) -> PsWorkerState:
    """Waits for an eager worker's last push and pull, then tells the servers this worker is
    done. Call once, after the loop."""
    if self._inflight is not None:
      _, params, versions, _ = self._inflight.result()
      state, self._inflight = dataclasses.replace(state, params=params, versions=versions), None
    if self._comm is not None:
      self._comm.shutdown()
    self.client.stop()
    return state

  # -- internals ---------------------------------------------------------------------------------

  def _communicate(self, grads: PyTree, state: PsWorkerState, rows: int, loss: float
                   ) -> tuple[PushResult, PyTree, tuple[int, ...], float]:
    push = self.client.push(grads, state.versions, rows, loss)
    self._accepted += push.accepted  # only the communication thread (or the step) writes it
    min_version = max(state.versions) + 1 if self.config.consistency is Consistency.BSP else 0
    min_clock = self._accepted - self.config.bound if self.config.consistency is Consistency.SSP else 0
    params, versions, pull_s = self.client.pull(min_version, min_clock)
    return push, merge_trainable(params, self._fixed), versions, pull_s

  def _loss_and_grad(self, params: PyTree, batch: Batch):
    if self.micro_rows is not None:
      return summed_value_and_grad(
          lambda p, b: self.task.loss(nnx.merge(self.graphdef, p), b), params, batch,
          self.shares[self.worker], self.micro_rows)

    def mean_loss(p):
      return jnp.mean(self.task.loss(nnx.merge(self.graphdef, p), batch))
    return trainable_value_and_grad(mean_loss)(params)


def _fixed_state(task: Task, seed: int, abstract: PyTree, device: jax.Device) -> PyTree:
  """The initial model state that is not a float parameter, on ``device`` (``None`` at every
  float parameter; all ``None`` without tracing the model again when there is no such state)."""
  fixed = split_trainable(abstract)[1]
  if not jax.tree.leaves(fixed):
    return fixed

  params = initial_params(task.make_model, seed, weights=task.weights)
  return jax.device_put(split_trainable(params)[1], device)

