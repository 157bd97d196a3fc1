"""`App`: a model trained by scheduled model parallelism, as the executor needs it.

An app owns its data and the update of a round. The executor (`SchmpProgram`) shards the data's
rows over every device of the job (axis ``'rows'``), keeps the parameters on the same devices
(as `param_specs` says: replicated, or one block per device for static rotations), and runs
`round` inside one `jax.shard_map`: each device sees its rows, computes partial sums, combines
them with one collective (`lax.psum` over ``axis``) or passes blocks on (`lax.ppermute`), and
applies the update. The schedule's slots are fixed in number, so `round` is compiled once.

An app may also define ``round_work(offset) -> int[devices]``: the real work units (ratings,
tokens; padding excluded) of each device in a round of that offset, which hosts of known speed
are timed by (`SchmpProgram.local_work`); without it a device's work is its rows.

Example (Lasso, one coordinate per slot)::

  def round(self, params, shard, blocks, mask, offset, key, axis):
    beta, r = params['beta'], params['residual']              # r sharded by rows
    x = shard['x'][:, blocks]                                  # [rows, slots]
    g = lax.psum(x.T @ r, axis) + self.col_sq[blocks] * beta[blocks]
    new = soft_threshold(g, lam) / self.col_sq[blocks]
    delta = jnp.where(mask, new - beta[blocks], 0.0)
    return {'beta': beta.at[blocks].add(delta), 'residual': r - x @ delta}, delta
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from hetjax.schmp._schedule import Scheduler

PyTree = Any


@runtime_checkable
class App(Protocol):
  """A model whose parameter blocks a scheduler picks each round.

  Attributes:
    name: the app's name (``'lasso'``, ``'mf'`` …), recorded in checkpoints.
    blocks: how many schedulable blocks it has (coordinates, column blocks, vocabulary shards).
    config: the arguments it was made with (JSON), recorded in checkpoints.
    scheduler: the scheduler it runs with (``'schmp'``, or a baseline's name: the app was made
      for it, since a baseline may also change the round — unscheduled Gibbs samples every word
      against stale counts).
  """

  name: str
  blocks: int
  config: dict
  scheduler: str

  def policy(self, schedule_size: int, seed: int) -> Scheduler:
    """The loop's scheduler (a `Scheduler`: a `hetjax.core.Policy` deciding `Schedule`s) for
    ``scheduler``."""
    ...

  def default_schedule_size(self, devices: int) -> int:
    """Slots per round when the config says 0 (automatic), on ``devices`` devices."""
    ...

  def reference_objective(self) -> float | None:
    """The optimum computed independently where one exists (scikit-learn's solution of the
    same problem, its objective scaled to this app's), else None: what a benchmark's target
    is measured against."""
    ...

  def host_data(self, shards: int) -> dict[str, np.ndarray]:
    """The data as host arrays whose leading axis is split evenly over ``shards`` devices (the
    app pads or refuses, in one line, a row count that does not divide)."""
    ...

  def init_params(self, data: dict[str, jax.Array], axis: str) -> PyTree:
    """The initial parameters, traced inside the executor's `jax.shard_map` like `round` (so a
    residual can start from the data)."""
    ...

  def param_specs(self, axis: str) -> PyTree:
    """`jax.sharding.PartitionSpec` per parameter over the device axis ``axis``."""
    ...

  def round(self, params: PyTree, shard: dict[str, jax.Array], blocks: jax.Array,
            mask: jax.Array, offset: jax.Array, key: jax.Array, axis: str
            ) -> tuple[PyTree, jax.Array]:
    """One round on this device's rows: ``(new params, delta per slot)`` (traced in
    `jax.shard_map`; ``delta`` replicated over ``axis``)."""
    ...

  def objective(self, params: PyTree, shard: dict[str, jax.Array], axis: str) -> jax.Array:
    """The objective the run reports (replicated over ``axis``; lower is better, e.g. the
    negative log-likelihood for LDA)."""
    ...
