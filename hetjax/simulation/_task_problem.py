"""Any `hetjax.train.Task` as a `CommProblem`: the virtual clock's schemes on the user's model.

`simulate_comm` trains a `CommProblem` by plain SGD on a flat parameter vector. `TaskProblem`
makes that vector the task's model parameters (`jax.flatten_util.ravel_pytree` of the NNX state,
float32 leaves), takes step ``k``'s global batch from the task's data source
(``task.data.global_batch(seed, k, global_batch)``, the same batches a trainer of that seed
reads), gives worker i of n the i-th of n equal slices of it, and measures the loss as the mean
over one fixed ``loss_batch``. Gradients and losses run jitted on the default device; the
schemes' event order and clocks stay numpy.

Example::

  problem = TaskProblem(models.make_task('mlp', hidden=64, width=32), global_batch=128)
  run = simulate_comm('ps-eager-stale-lr', (0.04,) * 4, parse_links('link:1:100', 4),
                      problem.model_bytes, updates=240, lr=0.3, problem=problem)
  run.losses[-1], run.time_to(0.5)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.flatten_util import ravel_pytree

from hetjax._checks import positive_int
from hetjax.data import Batch
from hetjax.simulation._comm_problem import equal_rows
from hetjax.train import Task

#: Rows of the default loss batch.
LOSS_ROWS = 1024
#: Global batches kept on the device.
CACHED = 64


class TaskProblem:
  """``task``'s model as a `CommProblem` (module docstring).

  Args:
    task: the model, its per-example loss and its data.
    global_batch: B, rows a step (n workers must divide it).
    seed: the data order (and the default loss batch's draw).
    loss_batch: the rows the loss averages over; default `LOSS_ROWS` rows of the task's
      held-out split, or of its training data at ``seed + 1`` where it has none.
    model_seed: the parameters' initialisation.
  """

  def __init__(self, task: Task, global_batch: int, seed: int = 0,
               loss_batch: Batch | None = None, model_seed: int = 0):
    self.global_batch = positive_int(global_batch, 'global_batch')
    self.task, self.seed = task, seed
    self._batches: dict[int, dict[str, jax.Array]] = {}
    with nnx.use_eager_sharding(False):
      model = task.make_model(nnx.Rngs(model_seed))
    graphdef = nnx.graphdef(model)
    flat, unravel = ravel_pytree(nnx.to_pure_dict(nnx.state(model)))
    self._start = np.asarray(flat, np.float32)
    self._start.setflags(write=False)
    if loss_batch is None:
      source, at = (task.eval_data, seed) if task.eval_data is not None else (task.data, seed + 1)
      loss_batch = source.global_batch(at, 0, LOSS_ROWS)
    self._loss_batch = {k: jnp.asarray(v) for k, v in loss_batch.items()}

    def mean_loss(w, batch):
      return jnp.mean(task.loss(nnx.merge(graphdef, unravel(w)), batch))

    self._loss = jax.jit(mean_loss)
    self._grad = jax.jit(jax.grad(mean_loss))
    self._worker_grads = jax.jit(jax.vmap(jax.grad(mean_loss)))

  @property
  def model_bytes(self) -> int:
    """b: the bytes of the parameters (float32), what a push or a pull moves."""
    return self._start.nbytes

  def start(self) -> np.ndarray:
    return self._start.copy()

  def loss(self, params: np.ndarray) -> float:
    return float(self._loss(jnp.asarray(params, jnp.float32), self._loss_batch))

  def worker_rows(self, worker: int, workers: int) -> slice:
    return equal_rows(self.global_batch, worker, workers)

  def gradient(self, params: np.ndarray, step: int, rows: slice) -> np.ndarray:
    batch = {k: v[rows] for k, v in self._batch(step).items()}
    return np.asarray(self._grad(jnp.asarray(params, jnp.float32), batch))

  def worker_gradients(self, params: np.ndarray, step: int) -> np.ndarray:
    n = len(params)
    self.worker_rows(0, n)
    batch = {k: v.reshape(n, -1, *v.shape[1:]) for k, v in self._batch(step).items()}
    return np.asarray(self._worker_grads(jnp.asarray(params, jnp.float32), batch))

  def _batch(self, step: int) -> dict[str, jax.Array]:
    """Step ``step``'s global batch on the device, the last `CACHED` of them kept (workers
    of one step ask for it several times, and asynchronous ones a few steps apart)."""
    if step not in self._batches:
      if len(self._batches) >= CACHED:
        self._batches.pop(next(iter(self._batches)))
      host = self.task.data.global_batch(self.seed, step, self.global_batch)
      self._batches[step] = {k: jnp.asarray(v) for k, v in host.items()}
    return self._batches[step]
