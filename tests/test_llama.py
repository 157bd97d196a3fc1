"""The Llama model against references written here, not against itself: grouped-query attention
equals multi-head attention with the key/value heads repeated, Llama 3.1's rotary frequencies
equal the published formula evaluated frequency by frequency, position t sees only ≤ t, and a
hybrid 4x2 layout trains like one device; bad sizes are one line."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import models
from hetjax._errors import ConfigError
from hetjax.models import llama
from hetjax.sharding import LogicalRules, ShardingRules, make_mesh
from hetjax.train import Strategy, Trainer, training_steps
from tests.conftest import require_devices

pytestmark = pytest.mark.gpu

SMALL = {'d_model': 32, 'heads': 4, 'layers': 2, 'seq_len': 16}


def _model(**kwargs) -> llama.Llama:
  task = llama.make_task(**SMALL, **kwargs)
  with nnx.use_eager_sharding(False):
    return nnx.jit(lambda: task.make_model(nnx.Rngs(0)))()


def _tokens(size: int = 2) -> jax.Array:
  return jnp.asarray(llama.make_task(**SMALL).data.global_batch(0, 0, size)['tokens'][:, :-1])


_forward = nnx.jit(lambda model, tokens: model(tokens))


@pytest.mark.parametrize('kv_heads', [1, 2])
def test_grouped_query_attention_is_multi_head_attention_with_repeated_key_value_heads(kv_heads):
  grouped = _model(kv_heads=kv_heads, qkv_bias=True)
  full = _model(kv_heads=SMALL['heads'], qkv_bias=True)
  group = SMALL['heads'] // kv_heads
  params = nnx.to_pure_dict(nnx.state(grouped, nnx.Param))
  for block in params['blocks'].values():
    attn = block['attn']
    for name in ('key', 'value'):
      attn[name] = jnp.repeat(attn[name], group, axis=1)  # query head h reads kv head h // group
      attn[f'{name}_bias'] = jnp.repeat(attn[f'{name}_bias'], group, axis=0)
  state = nnx.state(full, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(full, state)
  tokens = _tokens()
  np.testing.assert_allclose(_forward(grouped, tokens), _forward(full, tokens), rtol=1e-5,
                             atol=1e-6)


def _published_llama3_inv_freq(head_dim, base, factor, low, high, original):
  """Llama 3.1's ``apply_scaling``, one frequency at a time as Meta's reference code writes it."""
  out = []
  for i in range(0, head_dim, 2):
    freq = 1.0 / base ** (i / head_dim)
    wavelen = 2 * math.pi / freq
    if wavelen < original / high:
      out.append(freq)
    elif wavelen > original / low:
      out.append(freq / factor)
    else:
      smooth = (original / wavelen - low) / (high - low)
      out.append((1 - smooth) * freq / factor + smooth * freq)
  return np.array(out)


def test_llama3_rope_frequencies_are_the_published_ones():
  config = llama.LlamaConfig(d_model=4096, heads=32, rope_base=500_000.0, rope_scaling='llama3',
                             rope_factor=8.0, rope_low_freq_factor=1.0,
                             rope_high_freq_factor=4.0, rope_original_seq_len=8192)
  expected = _published_llama3_inv_freq(128, 500_000.0, 8.0, 1.0, 4.0, 8192)
  np.testing.assert_allclose(llama.rope_frequencies(config), expected, rtol=1e-12)
  plain = llama.rope_frequencies(llama.LlamaConfig(d_model=4096, heads=32, rope_base=500_000.0))
  assert np.sum(plain != expected) > 0 and plain[0] == expected[0]  # long wavelengths stretched


def test_rotation_keeps_norms_and_makes_scores_depend_on_offsets_only():
  inv_freq = llama.rope_frequencies(llama.LlamaConfig(d_model=16, heads=2))
  x = jax.random.normal(jax.random.key(0), (1, 6, 1, 8))
  same = jnp.broadcast_to(x[:, :1], x.shape)  # one vector at every position
  rotated = llama.rope(same, inv_freq)
  np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(same, axis=-1),
                             rtol=1e-6)
  scores = jnp.einsum('bqhd,bkhd->qk', rotated, rotated)
  np.testing.assert_allclose(scores[1, 0], scores[5, 4], rtol=1e-5)
  np.testing.assert_allclose(scores[3, 1], scores[4, 2], rtol=1e-5)


def test_position_t_sees_only_positions_up_to_t():
  model = _model(kv_heads=2)
  tokens = _tokens(1)
  changed = tokens.at[0, 9].set((tokens[0, 9] + 1) % 256)
  before, after = _forward(model, tokens), _forward(model, changed)
  np.testing.assert_array_equal(before[0, :9], after[0, :9])
  assert not np.allclose(before[0, 9:], after[0, 9:])


@pytest.mark.parametrize('strategy, shape, kv_split', [
    (Strategy.HYBRID, (4, 2), True),             # 2 key/value heads over 'model' of 2: split
    (Strategy.TENSOR_PARALLEL, (1, 8), False),   # 2 over 8 devices: left whole, not an error
], ids=['hybrid-4x2', 'tensor_parallel-1x8'])
def test_a_tensor_parallel_layout_trains_like_one_device(strategy, shape, kv_split):
  kwargs = {'d_model': 64, 'heads': 8, 'kv_heads': 2, 'layers': 2, 'mlp': 128, 'seq_len': 32}

  def run(shape, rules):
    trainer = Trainer(models.make_task('llama', **kwargs), optax.sgd(0.05, momentum=0.9), 16,
                      make_mesh(shape, devices=require_devices(math.prod(shape))), rules, seed=0)
    losses, state = [], trainer.init_state()
    for info in training_steps(trainer, state, 4):
      losses.append(float(info.metrics['loss']))
      state = info.state
    key = state.params['blocks'][0]['attn']['key']
    return np.asarray(losses), jax.device_get(state.params), key.sharding.spec

  one_losses, one_params, _ = run((1, 1), ShardingRules(LogicalRules(), LogicalRules()))
  losses, params, key_spec = run(shape, strategy.rules())
  assert ('model' in str(key_spec)) == kv_split, key_spec
  assert losses[-1] < losses[0]
  np.testing.assert_allclose(losses, one_losses, rtol=1e-5, atol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params,
               one_params)


@pytest.mark.parametrize('args, message', [
    ({'heads': 8, 'kv_heads': 3}, 'llama kv_heads=3 does not divide heads=8'),
    ({'d_model': 27, 'heads': 3}, 'llama rotary positions need an even head_dim'),
    ({'rope_scaling': 'yarn'}, "unknown llama rope_scaling 'yarn'"),
    ({'rope_scaling': 'llama3', 'rope_low_freq_factor': 4.0, 'rope_high_freq_factor': 1.0},
     'llama rope_high_freq_factor=1.0 must exceed rope_low_freq_factor=4.0'),
    ({'qkv_bias': 'yes'}, "llama qkv_bias must be true or false, got 'yes'"),
])
def test_bad_sizes_are_one_line(args, message):
  with pytest.raises(ConfigError, match=message) as raised:
    llama.LlamaConfig(**args)
  assert '\n' not in str(raised.value)


@pytest.mark.parametrize('kwargs', [{'kv_heads': 2}, {'kv_heads': 1, 'qkv_bias': True},
                                    {'tie_embeddings': True}])
def test_the_parameter_count_is_the_models(kwargs):
  from hetjax.sharding import abstract_model

  task = llama.make_task(**SMALL, **kwargs)
  _, shapes, _ = abstract_model(task.make_model)
  counted = sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))
  assert llama.num_params(task.config) == counted
  assert llama.flops_per_token(task.config) > 6 * (counted - 256 * SMALL['d_model'])


def test_the_doctests_run():
  import doctest

  assert doctest.testmod(llama, optionflags=doctest.ELLIPSIS).failed == 0


def test_the_pipeline_chain_is_the_model_and_the_planner_sees_every_block():
  from hetjax.pipeline import HasChain
  from hetjax.pipeline._chain import check_chain
  from hetjax.planner._profile import submodel_calls

  model = _model(kv_heads=2)
  assert isinstance(model, HasChain)
  links, paths = check_chain(model)
  assert [link.name for link in links] == ['embed', 'block_0', 'block_1', 'head']
  assert paths == (('embed',), ('blocks', 0), ('blocks', 1), ('head',))

  def chained(model, batch):
    carry = None
    for link in model.chain():
      carry = link.apply(link.module, carry, batch)
    return model.chain_loss(carry, batch)

  batch = llama.make_task(**SMALL).data.global_batch(0, 0, 4)
  np.testing.assert_array_equal(nnx.jit(chained)(model, batch), nnx.jit(llama.loss)(model, batch))
  calls = submodel_calls(llama.make_task(**SMALL, kv_heads=2), batch_size=8)
  assert list(calls) == ['embed', 'block_0', 'block_1', 'head']
  assert calls['head'].out.shape == (8, 16, 256)
  with pytest.raises(ConfigError, match='tie_embeddings=true cannot be cut into pipeline stages'):
    _model(tie_embeddings=True).chain()


def test_the_configs_are_consistent_with_make_task():
  from hetjax import run

  for name in ('llama_tiny', 'llama_1b'):
    args = run.load_config(name).model.task_args()
    assert set(args) == set(llama._DEFAULTS), name
    llama.LlamaConfig.of(args)
  assert llama.num_params(run.load_config('llama_1b').model.args) == 1_235_814_400
