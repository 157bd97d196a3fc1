"""The GPT model: shapes, causality, both position kinds train, tied embeddings, remat and mixed
precision against the plain float32 program, its pipeline chain and planner view, bad input."""

from __future__ import annotations

import doctest
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import data as hdata
from hetjax import models, run
from hetjax._errors import ConfigError
from hetjax.models import gpt
from hetjax.pipeline import HasChain
from hetjax.pipeline._chain import check_chain
from hetjax.planner._profile import submodel_calls
from hetjax.sharding import LogicalRules, ShardingRules, abstract_model, make_mesh
from hetjax.train import Trainer, training_steps
from tests.conftest import require_devices

#: Exactness tests that fit one device: `-m gpu` runs them on an accelerator (issue 27).
pytestmark = pytest.mark.gpu

SMALL = {'d_model': 32, 'heads': 4, 'layers': 1, 'seq_len': 16}
ALLOWED = {'vocab', 'embed', 'seq', 'heads', 'head_dim', 'mlp'}


@functools.cache
def initial(**kwargs) -> tuple[nnx.GraphDef, nnx.State]:
  """``(graphdef, state)`` of ``SMALL`` with ``kwargs``, initialised once, jitted (eager init
  compiles op by op)."""
  task = gpt.make_task(**SMALL, **kwargs)
  with nnx.use_eager_sharding(False):
    return nnx.split(nnx.jit(lambda: task.make_model(nnx.Rngs(0)))())


def variant(**kwargs) -> gpt.GPT:
  """``SMALL`` with ``kwargs`` (remat, dtype: options that leave the parameters alone) over
  the parameters of plain ``SMALL``: the same weights in another program."""
  task = gpt.make_task(**SMALL, **kwargs)
  with nnx.use_eager_sharding(False):
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: task.make_model(nnx.Rngs(0))))
  return nnx.merge(graphdef, initial()[1])


def _batch(size: int = 4) -> dict:
  return gpt.make_task(**SMALL).data.global_batch(seed=0, step=0, size=size)


# Jitted once for the module: each compile is most of a test's time.
_forward = nnx.jit(lambda model, tokens: model(tokens))
_loss = nnx.jit(gpt.loss)
_value_and_grad = nnx.jit(lambda model, loss, batch: nnx.value_and_grad(
    lambda m: jnp.mean(loss(m, batch)))(model), static_argnums=1)


def test_docstring_examples():
  assert doctest.testmod(gpt, raise_on_error=True).attempted >= 4


def test_task_records_every_argument_and_is_registered():
  task = models.make_task('gpt', **SMALL)
  assert task.name == 'gpt'
  assert task.config == {'vocab_size': 256, 'mlp': None, 'positions': 'learned',
                         'tie_embeddings': False, 'dtype': 'float32', 'param_dtype': 'float32',
                         'remat': 'none', 'attention': 'auto', 'data': None, **SMALL}
  tokens = task.data.global_batch(seed=0, step=0, size=3)['tokens']
  held_out = task.eval_data.global_batch(seed=0, step=0, size=3)['tokens']
  assert tokens.shape == held_out.shape == (3, 17) and tokens.dtype == np.int32
  # The held-out windows come from the corpus' last tenth, the training windows from the rest.
  assert task.data.num_bytes + task.eval_data.num_bytes == hdata.stdlib_text(16).num_bytes
  assert task.eval_data.num_bytes == int(0.1 * hdata.stdlib_text(16).num_bytes)


def test_shapes_and_loss_near_uniform_at_init():
  model = nnx.merge(*initial())
  batch = _batch()
  logits = _forward(model, batch['tokens'][:, :-1])
  assert logits.shape == (4, 16, 256) and logits.dtype == jnp.float32
  losses = _loss(model, batch)
  assert losses.shape == (4,) and losses.dtype == jnp.float32
  assert abs(float(jnp.mean(losses)) - math.log(256)) < 0.5


@pytest.mark.parametrize('kwargs', [{}, {'positions': 'rotary'}])
def test_causal(kwargs):
  model = nnx.merge(*initial(**kwargs))
  tokens = _batch(2)['tokens'][:, :-1]
  t = 10
  changed = tokens.copy()
  changed[:, t:] = (changed[:, t:] + 7) % 256
  before, after = _forward(model, tokens), _forward(model, changed)
  np.testing.assert_array_equal(before[:, :t], after[:, :t])
  assert not np.allclose(before[:, t:], after[:, t:])


def test_rotary_keeps_norms_and_depends_on_relative_position():
  x = np.random.default_rng(0).normal(size=(1, 6, 2, 8)).astype(np.float32)
  rotary = jax.jit(gpt.rotary)
  rotated = np.asarray(rotary(x))
  np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1),
                             rtol=1e-5)
  np.testing.assert_array_equal(rotated[:, 0], x[:, 0])
  # The same q and k at positions (1, 3) and (3, 5) score the same: only the offset counts.
  rq = np.asarray(rotary(np.broadcast_to(x[:, :1], x.shape)))
  rk = np.asarray(rotary(np.broadcast_to(x[:, 1:2], x.shape)))
  np.testing.assert_allclose(np.sum(rq[:, 1] * rk[:, 3]), np.sum(rq[:, 3] * rk[:, 5]),
                             rtol=1e-5)


@pytest.mark.parametrize('kwargs', [{}, {'positions': 'rotary', 'tie_embeddings': True}])
def test_trains_with_the_trainer(kwargs):
  task = gpt.make_task(**SMALL, **kwargs)
  trainer = Trainer(task, optax.adam(1e-2), 16, make_mesh((1, 1), devices=require_devices(1)),
                    ShardingRules(LogicalRules(), LogicalRules()), seed=0)
  losses = [float(info.metrics['loss'])
            for info in training_steps(trainer, trainer.init_state(), 15)]
  assert all(math.isfinite(v) for v in losses)
  assert np.mean(losses[-3:]) < losses[0] - 1.0, losses  # ln 256 ≈ 5.5 → the bytes' unigram


def test_tied_embeddings_share_one_parameter():
  # Abstract: the Trainer test above trains a tied model.
  task = gpt.make_task(**SMALL, tie_embeddings=True)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(0)))
  assert model.head.tokens is model.embed.tokens
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert 'tokens' not in params['head'] and 'proj' not in params['head']
  count = sum(p.size for p in jax.tree.leaves(params))
  untied = sum(p.size for p in jax.tree.leaves(nnx.state(nnx.merge(*initial()), nnx.Param)))
  assert count == untied - 256 * 32 == gpt.num_params(task.config)
  # One gradient for the table, the sum of what the embedding and the head contribute.
  grads = nnx.eval_shape(lambda m: nnx.grad(lambda m: jnp.mean(gpt.loss(m, _batch())))(m), model)
  grads = nnx.to_pure_dict(grads)
  assert grads['embed']['tokens'].shape == (256, 32) and 'tokens' not in grads['head']
  with pytest.raises(ConfigError, match='tie_embeddings=true cannot be cut into pipeline'):
    model.chain()


@pytest.mark.parametrize('remat', ['full', 'save_dots'])
def test_remat_gradients_equal_none(remat):
  """The same loss, and the same gradients to float32 rounding: the rematerialised backward
  pass is another program, which XLA fuses and rounds its own way (at XLA's default, as users
  compile, elements differ by up to 6e-11 on gradients of up to ~1e-3; bit for bit only at the
  suite's old setting, by chance). Tolerance: 1e-5 relative, 1e-6 of the leaf's largest
  gradient absolute (BUILD_NOTES, "Tolerance policy")."""
  plain = nnx.merge(*initial())
  model = variant(remat=remat)
  assert model.blocks[0].remat is gpt.Remat(remat)
  value, grads = _value_and_grad(plain, gpt.loss, _batch())
  remat_value, remat_grads = _value_and_grad(model, gpt.loss, _batch())
  assert float(remat_value) == float(value)

  def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(want))))
  jax.tree.map(close, nnx.to_pure_dict(remat_grads), nnx.to_pure_dict(grads))


def test_remat_is_in_the_backward_program():
  graphdef, state = nnx.split(variant(remat='full'))
  jaxpr = jax.make_jaxpr(jax.grad(lambda s: jnp.mean(gpt.loss(nnx.merge(graphdef, s),
                                                               _batch()))))(state)
  assert str(jaxpr).count('remat') == SMALL['layers']


def test_bfloat16_compute_keeps_float32_parameters():
  model = variant(dtype='bfloat16')
  assert {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype('float32')}
  batch = _batch()
  logits = nnx.eval_shape(lambda m: m(jnp.asarray(batch['tokens'][:, :-1])), model)
  assert logits.dtype == jnp.float32  # the head accumulates into float32
  low = _loss(model, batch)
  full = _loss(nnx.merge(*initial()), batch)
  assert low.dtype == jnp.float32
  np.testing.assert_allclose(low, full, atol=1e-2)
  assert not np.array_equal(low, full)  # it did compute in bfloat16


def test_float32_logits_backward_is_the_einsums_in_the_compute_dtype():
  """The head's logits are float32; its gradients are the bfloat16 einsum's, fed the
  cotangent rounded to bfloat16, and its backward holds two matmuls, not a third (a dead
  forward that a jaxpr's matmul count would see)."""
  from hetjax.bench import matmul_flops

  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((8, 5)), jnp.bfloat16)
  cotangent = jnp.asarray(rng.standard_normal((2, 3, 5)), jnp.float32)
  logits, pullback = jax.vjp(functools.partial(gpt.float32_logits, 'btd,dv->btv'), h, w)
  assert logits.dtype == jnp.float32
  _, reference = jax.vjp(lambda h, w: jnp.einsum('btd,dv->btv', h, w), h, w)
  for got, want in zip(pullback(cotangent), reference(cotangent.astype(jnp.bfloat16)),
                       strict=True):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got, want)
  grad = jax.make_jaxpr(jax.grad(lambda h, w: jnp.sum(gpt.float32_logits('btd,dv->btv', h, w)),
                                 argnums=(0, 1)))(h, w)
  assert matmul_flops(grad) == 3 * 2 * (2 * 3 * 5 * 8)  # forward, and one per operand


def test_attention_auto_is_cudnn_only_where_it_applies():
  def resolved(backend, **kwargs):
    return gpt.GPTConfig.of({**SMALL, **kwargs}).attention_implementation(backend)

  assert resolved('gpu', dtype='bfloat16') == resolved('gpu', dtype='float16') == 'cudnn'
  assert resolved('gpu') == 'xla'  # float32: cuDNN's kernel takes 16-bit inputs only
  assert resolved('gpu', dtype='bfloat16', d_model=24, heads=2) == 'xla'  # head_dim 12
  assert resolved('cpu', dtype='bfloat16') == resolved('tpu', dtype='bfloat16') == 'xla'
  assert resolved('cpu', dtype='bfloat16', attention='xla') == 'xla'
  assert resolved('gpu', dtype='bfloat16', attention='xla') == 'xla'
  with pytest.raises(ConfigError, match=r'attention=cudnn needs an NVIDIA GPU, but JAX\'s '
                                        r'backend is cpu'):
    resolved('cpu', dtype='bfloat16', attention='cudnn')


@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='cuDNN attention needs a GPU')
def test_cudnn_attention_matches_xla_on_gpu():
  batch = _batch()
  cudnn = _value_and_grad(variant(dtype='bfloat16', attention='cudnn'), gpt.loss, batch)
  xla = _value_and_grad(variant(dtype='bfloat16', attention='xla'), gpt.loss, batch)
  # Two bfloat16 programs (8 mantissa bits) that sum in different orders.
  np.testing.assert_allclose(cudnn[0], xla[0], rtol=1e-2)
  for got, want in zip(jax.tree.leaves(cudnn[1]), jax.tree.leaves(xla[1]), strict=True):
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05 * float(np.abs(want).max()))


def test_bfloat16_parameters():
  task = gpt.make_task(**SMALL, param_dtype='bfloat16')
  _, shapes, _ = abstract_model(task.make_model)
  assert {s.dtype for s in jax.tree.leaves(shapes)} == {jnp.dtype('bfloat16')}


def test_chain_loss_equals_the_model_loss():
  model = nnx.merge(*initial())
  assert isinstance(model, HasChain)
  links, paths = check_chain(model)
  assert [link.name for link in links] == list(model.submodels()) == ['embed', 'block_0', 'head']
  assert paths == (('embed',), ('blocks', 0), ('head',))

  def chained(model, batch):
    carry = None
    for link in model.chain():
      carry = link.apply(link.module, carry, batch)
    return model.chain_loss(carry, batch)

  batch = _batch()
  np.testing.assert_array_equal(nnx.jit(chained)(model, batch), _loss(model, batch))


@pytest.mark.parametrize('kwargs', [{}, {'positions': 'rotary', 'tie_embeddings': True}])
def test_logical_names_and_parameter_count(kwargs):
  task = gpt.make_task(**SMALL, **kwargs)
  _, shapes, names = abstract_model(task.make_model)
  shape_leaves = jax.tree.leaves(shapes)
  name_leaves = jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))
  assert len(name_leaves) == len(shape_leaves) > 0
  for shape, logical in zip(shape_leaves, name_leaves, strict=True):
    assert len(logical) == len(shape.shape) and set(logical) <= ALLOWED, logical
  assert sum(s.size for s in shape_leaves) == gpt.num_params(task.config)


def test_planner_sees_every_submodel():
  task = gpt.make_task(**{**SMALL, 'layers': 3})
  calls = submodel_calls(task, batch_size=8)
  assert list(calls) == ['embed', 'block_0', 'block_1', 'block_2', 'head']
  assert calls['block_1'].args[0].shape == (8, 16, 32)
  assert calls['head'].out.shape == (8, 16, 256)


def test_flops_per_token_formula():
  # GPT-2 small: N = 12 blocks of 7,084,800 + the head's LayerNorm and 768 × 50304 projection.
  config = run.load_config('gpt2_small').model.args
  assert gpt.num_params(config) == 124_439_040
  assert run.load_config('gpt2_small').model.dtype == 'bfloat16'
  n = 12 * 7_084_800 + 2 * 768 + 768 * 50_304
  assert gpt.flops_per_token(config) == 6 * n + 12 * 12 * 1024 * 768
  assert gpt.num_params(run.load_config('gpt').model.args) == 1_252_352


def test_configs_are_consistent_with_make_task():
  for name in ('gpt', 'gpt2_small'):
    args = run.load_config(name).model.task_args()  # model.args with dtype, param_dtype, remat
    assert set(args) == set(gpt._DEFAULTS), name
    gpt.GPTConfig.of(args)  # validates
  gpt.make_task(**{**run.load_config('gpt').model.task_args(), 'layers': 1})


def test_token_dataset(tmp_path):
  rng = np.random.default_rng(0)
  for split in ('train', 'val'):
    hdata.write_token_split(tmp_path, split, rng.integers(0, 256, 500).astype(np.uint16),
                            documents=[0, 200], vocab_size=256, tokenizer='bytes')
  task = gpt.make_task(**SMALL, vocab_size=320, data=str(tmp_path))
  assert task.data.global_batch(0, 0, 2)['tokens'].shape == (2, 17)
  assert task.eval_data.split == 'val'
  with pytest.raises(ConfigError, match="vocab_size 256, more than the model's 128"):
    gpt.make_task(**SMALL, vocab_size=128, data=str(tmp_path))


@pytest.mark.parametrize('kwargs, message', [
    ({'d_model': 30}, r'gpt d_model=30 is not divisible by heads=4'),
    ({'layers': 0}, r'gpt layers must be a positive integer, got 0'),
    ({'mlp': -4}, r'gpt mlp must be a positive integer, got -4'),
    ({'seq_len': 2.5}, r'gpt seq_len must be a positive integer, got 2.5'),
    ({'heads': 8, 'd_model': 24, 'positions': 'rotary'}, r'rotary needs an even head_dim.*= 3'),
    ({'positions': 'alibi'}, r"unknown gpt positions 'alibi'; choose one of: learned, rotary"),
    ({'remat': 'some'}, r"unknown gpt remat 'some'; choose one of: none, full, save_dots"),
    ({'attention': 'flash'}, r"unknown gpt attention 'flash'; choose one of: xla, cudnn, auto"),
    ({'attention': 'cudnn'}, r'attention=cudnn needs dtype bfloat16 or float16 .* '
                             r'dtype=float32, head_dim=8'),
    ({'attention': 'cudnn', 'dtype': 'bfloat16', 'd_model': 24, 'heads': 2},
     r'multiple of 8 up to 128, got dtype=bfloat16, head_dim=12'),
    ({'dtype': 'float64'}, r"gpt dtype must be one of float32, bfloat16, float16, got 'float64'"),
    ({'param_dtype': 'int8'}, r'gpt param_dtype must be one of'),
    ({'tie_embeddings': 'yes'}, r"gpt tie_embeddings must be true or false, got 'yes'"),
    ({'vocab_size': 100}, r'gpt vocab_size=100 is smaller than the 256 byte values'),
    ({'data': 3}, r'gpt data must be a token dataset directory or None, got 3'),
])
def test_bad_arguments_are_one_line(kwargs, message):
  with pytest.raises(ConfigError, match=message) as error:
    gpt.make_task(**{**SMALL, **kwargs})
  assert '\n' not in str(error.value)
