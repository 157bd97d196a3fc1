"""Tests of the wide & deep recommender."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax.models import wide_deep
from hetjax.sharding import abstract_model

#: Exactness tests that fit one device: `-m gpu` runs them on an accelerator (issue 27).
pytestmark = pytest.mark.gpu

SMALL = {'rows': 1000, 'dim': 8, 'fields': 4, 'dense': 8, 'hidden': 32, 'hidden2': 16}


@pytest.fixture(scope='module')
def task():
  return wide_deep.make_task(**SMALL)


def _model(task, seed: int = 0) -> wide_deep.WideDeep:
  with nnx.use_eager_sharding(False):
    return task.make_model(nnx.Rngs(seed))


def test_task_fields(task):
  assert task.name == 'wide_deep'
  assert task.config == {**SMALL, 'exponent': 1.1}
  assert task.data.rows == SMALL['rows']


def test_submodels_in_forward_order(task):
  assert list(_model(task).submodels()) == ['embedding', 'wide', 'tower']


def test_parameters_name_logical_axes_only(task):
  _, shapes, names = abstract_model(task.make_model)
  leaves = jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))
  assert leaves and all(set(n) <= {'table', 'embed', 'mlp', None} for n in leaves)
  assert names['embedding']['table'] == ('table', 'embed')
  assert names['wide']['table'] == ('table', None)
  assert names['tower']['up']['kernel'] == (None, 'mlp')
  assert shapes['embedding']['table'].shape == (SMALL['rows'], SMALL['dim'])
  assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(shapes))


def test_default_sizes_divide_by_eight():
  _, shapes, names = abstract_model(wide_deep.make_task().make_model)
  for shape, logical in zip(jax.tree.leaves(shapes), jax.tree.leaves(
      names, is_leaf=lambda x: isinstance(x, tuple)), strict=True):
    for size, name in zip(shape.shape, logical, strict=True):
      if name is not None:
        assert size % 8 == 0, (shape, logical)


def test_loss_at_init_is_about_ln2(task):
  batch = task.data.global_batch(seed=0, step=0, size=256)
  per_example = task.loss(_model(task), batch)
  assert per_example.shape == (256,) and per_example.dtype == jnp.float32
  assert np.all(np.isfinite(per_example))
  assert abs(float(per_example.mean()) - math.log(2)) < 0.2


def test_adam_reduces_the_loss(task):
  model = _model(task)
  batch = task.data.global_batch(seed=0, step=0, size=256)
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    value, grads = nnx.value_and_grad(lambda m: task.loss(m, batch).mean())(model)
    optimizer.update(model, grads)
    return value

  first = float(step(model, optimizer))
  for _ in range(20):
    last = float(step(model, optimizer))
  assert last < first - 0.1
