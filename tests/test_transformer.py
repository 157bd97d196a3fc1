"""The byte-level Transformer LM: shapes, causality, logical names, and that it learns."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax._errors import ConfigError
from hetjax.models import transformer
from hetjax.sharding import abstract_model

#: Exactness tests that fit one device: `-m gpu` runs them on an accelerator (issue 27).
pytestmark = pytest.mark.gpu

SMALL = {'d_model': 32, 'heads': 4, 'layers': 1, 'mlp': 64, 'seq_len': 16}
ALLOWED = {'vocab', 'embed', 'seq', 'heads', 'head_dim', 'mlp'}

_forward = nnx.jit(lambda model, tokens: model(tokens))  # eager would compile op by op


@pytest.fixture(scope='module')
def task():
  return transformer.make_task(**SMALL)


@pytest.fixture(scope='module')
def initial(task):
  """``(graphdef, state)`` of one initialisation, jitted: eager init compiles op by op (~2 s)."""
  with nnx.use_eager_sharding(False):
    return nnx.split(nnx.jit(lambda: task.make_model(nnx.Rngs(0)))())


@pytest.fixture
def model(initial):
  return nnx.merge(*initial)  # fresh Variables per test; the arrays are immutable


def test_config_and_name(task):
  assert task.name == 'transformer'
  assert task.config == SMALL


def test_loss_shape_finite_and_near_uniform_at_init(task, model):
  batch = task.data.global_batch(seed=0, step=0, size=8)
  losses = nnx.jit(task.loss)(model, batch)
  assert losses.shape == (8,)
  assert losses.dtype == jnp.float32
  assert np.all(np.isfinite(losses))
  assert abs(float(jnp.mean(losses)) - math.log(256)) < 0.5


def test_logits_shape(task, model):
  tokens = task.data.global_batch(seed=0, step=0, size=2)['tokens'][:, :-1]
  logits = _forward(model, tokens)
  assert logits.shape == (2, SMALL['seq_len'], 256)
  assert logits.dtype == jnp.float32


def test_causal(task, model):
  tokens = task.data.global_batch(seed=0, step=0, size=2)['tokens'][:, :-1]
  t = 10
  changed = tokens.copy()
  changed[:, t:] = (changed[:, t:] + 7) % 256
  before, after = _forward(model, tokens), _forward(model, changed)
  np.testing.assert_array_equal(before[:, :t], after[:, :t])
  assert not np.allclose(before[:, t:], after[:, t:])


def test_submodels(model):
  parts = model.submodels()
  assert list(parts) == ['embed', 'block_0', 'head']
  assert isinstance(parts['embed'], transformer.Embed)
  assert isinstance(parts['head'], transformer.Head)
  three = transformer.make_task(**{**SMALL, 'layers': 3})
  with nnx.use_eager_sharding(False):
    abstract = nnx.eval_shape(lambda: three.make_model(nnx.Rngs(0)))  # names need no arrays
  assert list(abstract.submodels()) == ['embed', 'block_0', 'block_1', 'block_2', 'head']


def test_every_parameter_has_allowed_logical_names(task):
  _, shapes, names = abstract_model(task.make_model)
  shape_leaves = jax.tree.leaves(shapes)
  name_leaves = jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))
  assert len(name_leaves) == len(shape_leaves) > 0
  for shape, logical in zip(shape_leaves, name_leaves, strict=True):
    assert len(logical) == len(shape.shape)
    assert set(logical) <= ALLOWED, logical
    assert shape.dtype == jnp.float32


def test_only_state_is_params(model):
  everything = jax.tree.leaves(nnx.state(model))
  assert len(jax.tree.leaves(nnx.state(model, nnx.Param))) == len(everything) > 0


def test_adam_reduces_loss_on_a_fixed_batch(task, model):
  optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
  batch = task.data.global_batch(seed=0, step=0, size=8)

  @nnx.jit
  def step(model, optimizer):
    value, grads = nnx.value_and_grad(lambda m: jnp.mean(task.loss(m, batch)))(model)
    optimizer.update(model, grads)
    return value

  first = float(step(model, optimizer))
  for _ in range(20):
    last = float(step(model, optimizer))
  assert last < first - 0.5


def test_heads_must_divide_d_model():
  with pytest.raises(ConfigError, match=r'd_model=30.*heads=4'):
    transformer.make_task(**{**SMALL, 'd_model': 30})
