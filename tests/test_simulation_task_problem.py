"""A task's model as the virtual clock's problem (`hetjax.simulation.TaskProblem`): its
gradients against the model's own, and synchronous SGD on the virtual clock against a plain
one-device loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import ConfigError, models
from hetjax.emulation import parse_links
from hetjax.simulation import TaskProblem, simulate_comm

BATCH = 32


@pytest.fixture(scope='module')
def task():
  return models.make_task('mlp', hidden=16, width=8)


def _model(task):
  with nnx.use_eager_sharding(False):
    return task.make_model(nnx.Rngs(0))


def test_gradients_are_the_models_own_on_each_workers_rows(task):
  problem = TaskProblem(task, BATCH, seed=3)
  model = _model(task)
  graphdef, params = nnx.graphdef(model), nnx.to_pure_dict(nnx.state(model))
  batch = task.data.global_batch(3, 5, BATCH)
  rows = problem.worker_rows(2, 4)
  assert rows == slice(16, 24)
  mine = {k: jnp.asarray(v[rows]) for k, v in batch.items()}
  want = jax.grad(lambda p: jnp.mean(task.loss(nnx.merge(graphdef, p), mine)))(params)
  want = np.concatenate([np.ravel(g) for g in jax.tree.leaves(want)])
  w = problem.start()
  got = problem.gradient(w, 5, rows)
  assert got.shape == want.shape and problem.model_bytes == 4 * w.size
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  # Each worker's gradient at its own parameters, all at once, row for row the same.
  stack = np.stack([w, w + 0.01, w - 0.01, w * 0.5])
  every = problem.worker_gradients(stack, 5)
  for i in range(4):
    np.testing.assert_allclose(every[i], problem.gradient(stack[i], 5, problem.worker_rows(i, 4)),
                               rtol=1e-5, atol=1e-7)


def test_synchronous_sgd_on_the_virtual_clock_is_a_plain_one_device_loop(task):
  loss_batch = task.data.global_batch(99, 0, 64)
  problem = TaskProblem(task, BATCH, seed=1, loss_batch=loss_batch)
  run = simulate_comm('allreduce-sync', 0.01, parse_links('link:1:100', 4), problem.model_bytes,
                      updates=6, lr=0.3, problem=problem)
  model = _model(task)
  optimizer = nnx.Optimizer(model, optax.sgd(0.3), wrt=nnx.Param)
  want = []
  for step in range(6):
    batch = {k: jnp.asarray(v) for k, v in task.data.global_batch(1, step, BATCH).items()}
    grads = nnx.grad(lambda m, b=batch: jnp.mean(task.loss(m, b)))(model)
    optimizer.update(model, grads)
    want.append(float(jnp.mean(task.loss(model, {k: jnp.asarray(v)
                                                 for k, v in loss_batch.items()}))))
  np.testing.assert_allclose(run.losses, want, rtol=1e-5)
  assert want[-1] < want[0]


def test_workers_must_divide_the_batch(task):
  problem = TaskProblem(task, BATCH)
  with pytest.raises(ConfigError, match='3 workers do not divide the global batch of 32 rows'):
    problem.worker_rows(0, 3)
  with pytest.raises(ConfigError, match='global_batch'):
    TaskProblem(task, 0)
