"""Hugging Face's Llama layout (`hetjax.models.hf`): a checkpoint's tensors, loaded into hetjax's
`llama`, give the logits of Hugging Face's Llama forward pass written here in numpy from its
modelling code (names, ``[out, in]`` weights, rotate-half RoPE, repeated key/value heads, RMSNorm
weights after the normalisation); export then import is bit-identical; the config round-trips;
what is not read is one line."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx

from hetjax._errors import ConfigError
from hetjax.models import hf, llama
from hetjax.sharding import abstract_model

pytestmark = pytest.mark.gpu

ARGS = {'vocab_size': 256, 'd_model': 32, 'heads': 4, 'kv_heads': 2, 'layers': 2, 'mlp': 48,
        'seq_len': 16, 'rope_base': 10_000.0, 'rope_scaling': 'llama3', 'rope_factor': 8.0,
        'rope_low_freq_factor': 1.0, 'rope_high_freq_factor': 4.0, 'rope_original_seq_len': 8,
        'norm_eps': 1e-5}


def _hf_tensors(args, seed=0) -> dict[str, np.ndarray]:
  """A random checkpoint in Hugging Face's names and shapes (float32)."""
  rng = np.random.default_rng(seed)
  shapes = abstract_model(llama.make_task(**args).make_model)[1]
  return {name: rng.normal(0, 0.2, hf._hf_shape(_shape(shapes, path), how)).astype(np.float32)
          for name, (path, how) in hf._names(args).items()}


def _shape(tree, path):
  for key in path:
    tree = tree[key]
  return tuple(tree.shape)


def _reference_logits(args, t: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
  """Hugging Face's LlamaForCausalLM forward (float32), in numpy."""
  c = llama.LlamaConfig.of(args)
  hd, group = c.head_dim, c.heads // c.kv_heads

  def norm(x, w):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.norm_eps))

  def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)

  inv_freq = _published_inv_freq(c)
  freqs = np.arange(tokens.shape[1])[:, None] * inv_freq[None]  # [T, hd/2]
  emb = np.concatenate([freqs, freqs], axis=-1)
  cos, sin = np.cos(emb)[None, None], np.sin(emb)[None, None]  # [1, 1, T, hd]
  x = t['model.embed_tokens.weight'][tokens]
  b, n = tokens.shape
  mask = np.triu(np.full((n, n), -np.inf), 1)
  for i in range(c.layers):
    p = f'model.layers.{i}.'
    h = norm(x, t[p + 'input_layernorm.weight'])

    def proj(name, heads, h=h, p=p):
      y = h @ t[p + f'self_attn.{name}_proj.weight'].T
      if c.qkv_bias:
        y = y + t[p + f'self_attn.{name}_proj.bias']
      return y.reshape(b, n, heads, hd).transpose(0, 2, 1, 3)  # [B, heads, T, hd]

    q, k, v = proj('q', c.heads), proj('k', c.kv_heads), proj('v', c.kv_heads)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + mask
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attn = (weights @ v).transpose(0, 2, 1, 3).reshape(b, n, -1)
    x = x + attn @ t[p + 'self_attn.o_proj.weight'].T
    h = norm(x, t[p + 'post_attention_layernorm.weight'])
    gate, up = h @ t[p + 'mlp.gate_proj.weight'].T, h @ t[p + 'mlp.up_proj.weight'].T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + 'mlp.down_proj.weight'].T
  head = t['model.embed_tokens.weight'] if c.tie_embeddings else t['lm_head.weight']
  return norm(x, t['model.norm.weight']) @ head.T


def _published_inv_freq(c) -> np.ndarray:
  base = 1.0 / c.rope_base ** (np.arange(0, c.head_dim, 2) / c.head_dim)
  if c.rope_scaling == 'none':
    return base
  out = []
  for freq in base:
    wavelen = 2 * math.pi / freq
    low, high = c.rope_original_seq_len / c.rope_low_freq_factor, \
        c.rope_original_seq_len / c.rope_high_freq_factor
    if wavelen < high:
      out.append(freq)
    elif wavelen > low:
      out.append(freq / c.rope_factor)
    else:
      smooth = (c.rope_original_seq_len / wavelen - c.rope_low_freq_factor) / (
          c.rope_high_freq_factor - c.rope_low_freq_factor)
      out.append((1 - smooth) * freq / c.rope_factor + smooth * freq)
  return np.array(out)


def _loaded(args, tensors) -> llama.Llama:
  task = llama.make_task(**args)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(0)))
  shapes = abstract_model(task.make_model)[1]
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(np.asarray, hf.from_hf(args, tensors, shapes)))
  nnx.update(model, state)
  return model


@pytest.mark.parametrize('extra', [{}, {'qkv_bias': True, 'kv_heads': 1},
                                   {'tie_embeddings': True, 'rope_scaling': 'none'}],
                         ids=['llama3-rope', 'qwen2-mqa', 'tied'])
def test_imported_weights_give_hugging_faces_logits(extra):
  args = {**ARGS, **extra}
  tensors = _hf_tensors(args)
  tokens = np.random.default_rng(1).integers(0, 256, (2, 16))
  ours = nnx.jit(lambda m, x: m(x))(_loaded(args, tensors), tokens)
  np.testing.assert_allclose(np.asarray(ours), _reference_logits(args, tensors, tokens),
                             rtol=1e-5, atol=1e-5)


def test_export_then_import_is_bit_identical_and_the_config_round_trips():
  args = {**ARGS, 'qkv_bias': True}
  tensors = _hf_tensors(args, seed=3)
  shapes = abstract_model(llama.make_task(**args).make_model)[1]
  again = hf.to_hf(args, hf.from_hf(args, tensors, shapes))
  assert set(again) == set(tensors)
  for name, array in tensors.items():
    np.testing.assert_array_equal(again[name], array)
    assert again[name].flags.c_contiguous
  config = hf.hf_config(args)
  assert config['model_type'] == 'qwen2'
  assert hf.llama_args(config, seq_len=16) == {k: v for k, v in llama.LlamaConfig.of(
      args).__dict__.items() if k in hf.llama_args(config, seq_len=16)}


@pytest.mark.parametrize('change, message', [
    ({'model_type': 'qwen3'}, "model_type 'qwen3' is not read"),
    ({'rope_scaling': {'rope_type': 'yarn', 'factor': 4.0}}, "rope type 'yarn' is not read"),
    ({'rope_parameters': {'rope_type': 'yarn', 'rope_theta': 1e4}}, "rope type 'yarn' is not"),
    ({'rope_scaling': {'rope_type': 'llama3', 'factor': 8.0}}, "llama3 rope settings lack "
                                                                "'low_freq_factor'"),
    ({'head_dim': 16}, 'head_dim 16 is not hidden_size / num_attention_heads = 8'),
    ({'hidden_act': 'gelu'}, "hidden_act 'gelu' is not read"),
    ({'attention_bias': True}, 'attention_bias=true is not read'),
    ({'model_type': 'mistral', 'sliding_window': 8}, 'sliding_window 8 is shorter than seq_len'),
])
def test_what_is_not_read_is_one_line(change, message):
  config = {**hf.hf_config(ARGS), **change}
  with pytest.raises(ConfigError, match=message) as raised:
    hf.llama_args(config, seq_len=16)
  assert '\n' not in str(raised.value)


def test_a_missing_extra_or_misshapen_tensor_is_one_line():
  tensors = _hf_tensors(ARGS)
  shapes = abstract_model(llama.make_task(**ARGS).make_model)[1]
  name = 'model.layers.1.self_attn.k_proj.weight'
  with pytest.raises(ConfigError, match=f"tensor '{name}' is missing"):
    hf.from_hf(ARGS, {k: v for k, v in tensors.items() if k != name}, shapes)
  with pytest.raises(ConfigError, match=r"1 tensor\(s\) the model does not have, e.g. 'x'"):
    hf.from_hf(ARGS, {**tensors, 'x': np.zeros(1)}, shapes)
  with pytest.raises(ConfigError, match=r"has shape \(8, 32\), the model needs \(16, 32\)"):
    hf.from_hf(ARGS, {**tensors, name: np.zeros((8, 32))}, shapes)
