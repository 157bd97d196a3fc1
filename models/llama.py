"""Llama-family decoder-only language model: RMSNorm, a SwiGLU MLP, grouped-query attention and
rotary positions with Llama 3's frequency scaling.

The block is Llama's (and Qwen 2's, Mistral's, SmolLM's): ``x + attn(rms_norm(x))``, then
``x + down(silu(gate(h)) · up(h))`` with ``h = rms_norm(x)``; no biases, except the optional q, k
and v biases of Qwen 2 (``qkv_bias``). Attention has ``heads`` query heads and ``kv_heads`` key
and value heads (``kv_heads`` divides ``heads``: 1 is multi-query, ``heads`` is multi-head); each
group of ``heads / kv_heads`` query heads reads one key/value head (`jax.nn.dot_product_attention`
takes the grouped shapes as they are). Key and value heads carry a logical dimension of their own,
``'kv_heads'``, so a layout can split query heads without splitting the fewer key/value heads.

Rotary positions (`rope`) rotate each pair ``(x[i], x[i + head_dim/2])`` (the "rotate half" layout
that Hugging Face's Llama checkpoints are stored in) by ``t · inv_freq[i]``, with ``inv_freq =
rope_base^(-2i/head_dim)``; ``rope_scaling='llama3'`` stretches the long wavelengths as Llama 3.1
does (`rope_frequencies`). Precision, rematerialisation and the attention kernel are `gpt`'s
(``dtype`` over ``param_dtype``, float32 norms statistics, softmax and logits; ``remat``;
``attention``), and so are ``submodels()`` (``embed``, ``block_0`` …, ``head``) and ``chain()``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hetjax import data as hdata
from hetjax._errors import ConfigError, parse_choice
from hetjax.models._lm import (
  HEADS,
  RESIDUAL,
  CausalAttention,
  Decoder,
  DecoderBlock,
  decoder_loss,
  stdlib_splits,
  token_splits,
)
from hetjax.models.gpt import (
  BYTES,
  CUDNN_DTYPES,
  CUDNN_MAX_HEAD_DIM,
  DTYPES,
  EVAL_FRACTION,
  AttentionImpl,
  Remat,
  float32_logits,
)
from hetjax.sharding import constrain
from hetjax.train import Task

KV_HEADS = ('batch', 'seq', 'kv_heads', 'head_dim')
ROPE_SCALINGS = ('none', 'llama3')

_init = nnx.initializers.normal(0.02)  # Llama's initializer_range


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """The model's sizes and options, validated. ``kv_heads=None`` means ``heads`` (multi-head);
  ``mlp=None`` means Llama's ``8·d_model/3`` rounded up to a multiple of 8.

  Example::

    >>> LlamaConfig(d_model=64, heads=8, kv_heads=2).head_dim
    8
    >>> LlamaConfig(d_model=64, heads=8, kv_heads=3)
    Traceback (most recent call last):
    hetjax._errors.ConfigError: llama kv_heads=3 does not divide heads=8

  Attributes:
    rope_scaling: ``'none'`` or ``'llama3'``; with ``'llama3'`` the ``rope_factor``,
      ``rope_low_freq_factor``, ``rope_high_freq_factor`` and ``rope_original_seq_len`` of
      Llama 3.1's ``rope_scaling`` (`rope_frequencies`).

  Raises:
    ConfigError: a size that is not a positive integer, ``heads`` not dividing ``d_model``,
      ``kv_heads`` not dividing ``heads``, an odd ``head_dim``, or an unknown option; one line
      naming it.
  """

  vocab_size: int = BYTES
  d_model: int = 128
  heads: int = 4
  kv_heads: int | None = None
  layers: int = 2
  mlp: int | None = None
  seq_len: int = 128
  rope_base: float = 10_000.0
  rope_scaling: str = 'none'
  rope_factor: float = 8.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_seq_len: int = 8192
  norm_eps: float = 1e-5
  qkv_bias: bool = False
  tie_embeddings: bool = False
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  remat: Remat = Remat.NONE
  attention: AttentionImpl = AttentionImpl.AUTO

  def __post_init__(self):
    if self.kv_heads is None:
      object.__setattr__(self, 'kv_heads', self.heads)
    if self.mlp is None:
      object.__setattr__(self, 'mlp', 8 * math.ceil(8 * self.d_model / 3 / 8))
    for name in ('vocab_size', 'd_model', 'heads', 'kv_heads', 'layers', 'mlp', 'seq_len',
                 'rope_original_seq_len'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'llama {name} must be a positive integer, got {value!r}')
    for name in ('rope_base', 'rope_factor', 'rope_low_freq_factor', 'rope_high_freq_factor',
                 'norm_eps'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f'llama {name} must be a positive number, got {value!r}')
    if self.d_model % self.heads:
      raise ConfigError(f'llama d_model={self.d_model} is not divisible by heads={self.heads}')
    if self.heads % self.kv_heads:
      raise ConfigError(f'llama kv_heads={self.kv_heads} does not divide heads={self.heads}')
    if self.head_dim % 2:
      raise ConfigError(f'llama rotary positions need an even head_dim, got d_model/heads = '
                        f'{self.d_model}/{self.heads} = {self.head_dim}')
    if self.rope_scaling not in ROPE_SCALINGS:
      raise ConfigError(f'unknown llama rope_scaling {self.rope_scaling!r}; choose one of: '
                        f'{", ".join(ROPE_SCALINGS)}')
    if self.rope_scaling == 'llama3' and not self.rope_high_freq_factor > self.rope_low_freq_factor:
      raise ConfigError(f'llama rope_high_freq_factor={self.rope_high_freq_factor} must exceed '
                        f'rope_low_freq_factor={self.rope_low_freq_factor}')
    for name in ('qkv_bias', 'tie_embeddings'):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(f'llama {name} must be true or false, got {getattr(self, name)!r}')
    for name in ('dtype', 'param_dtype'):
      if not isinstance(getattr(self, name), str) or getattr(self, name) not in DTYPES:
        raise ConfigError(f'llama {name} must be one of {", ".join(DTYPES)}, got '
                          f'{getattr(self, name)!r}')
    object.__setattr__(self, 'remat', parse_choice(Remat, self.remat, 'llama remat'))
    object.__setattr__(self, 'attention',
                       parse_choice(AttentionImpl, self.attention, 'llama attention'))
    if self.attention is AttentionImpl.CUDNN and not self.cudnn_fits:
      raise ConfigError(f'llama attention=cudnn needs dtype {" or ".join(CUDNN_DTYPES)} and a '
                        f'head_dim that is a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}, got '
                        f'dtype={self.dtype}, head_dim={self.head_dim}')

  @classmethod
  def of(cls, args: LlamaConfig | Mapping[str, Any]) -> LlamaConfig:
    """A config from `make_task`'s keyword arguments (``task.config``); the ones it does not
    name take make_task's defaults, and ``data`` is ignored."""
    if isinstance(args, LlamaConfig):
      return args
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in {**_DEFAULTS, **args}.items() if k in fields})

  @property
  def head_dim(self) -> int:
    return self.d_model // self.heads

  @property
  def cudnn_fits(self) -> bool:
    return (self.dtype in CUDNN_DTYPES and self.head_dim % 8 == 0
            and self.head_dim <= CUDNN_MAX_HEAD_DIM)

  def attention_implementation(self, backend: str) -> str:
    """``'xla'`` or ``'cudnn'`` on JAX's ``backend`` (as `hetjax.models.gpt.GPTConfig`'s)."""
    if self.attention is AttentionImpl.CUDNN and backend != 'gpu':
      raise ConfigError(f'llama attention=cudnn needs an NVIDIA GPU, but JAX\'s backend is '
                        f'{backend} (attention=auto or xla runs anywhere)')
    if self.attention is AttentionImpl.AUTO:
      return 'cudnn' if backend == 'gpu' and self.cudnn_fits else 'xla'
    return self.attention.value

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(DTYPES[self.dtype])

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(DTYPES[self.param_dtype])


def rope_frequencies(config: LlamaConfig) -> np.ndarray:
  """``inv_freq[i] = rope_base^(-2i/head_dim)`` for i < head_dim/2 (float64), stretched under
  ``rope_scaling='llama3'`` as Llama 3.1 does: wavelengths ``2π/inv_freq`` longer than
  ``rope_original_seq_len / rope_low_freq_factor`` are divided by ``rope_factor``, those shorter
  than ``rope_original_seq_len / rope_high_freq_factor`` are kept, and those between are blended,
  linearly in ``rope_original_seq_len / wavelength``.

  Example::

    >>> rope_frequencies(LlamaConfig(d_model=16, heads=2))   # head_dim 8
    array([1.   , 0.1  , 0.01 , 0.001])
  """
  c = config
  inv_freq = c.rope_base ** (-np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim)
  if c.rope_scaling == 'none':
    return inv_freq
  wavelength = 2 * math.pi / inv_freq
  low_wavelength = c.rope_original_seq_len / c.rope_low_freq_factor
  high_wavelength = c.rope_original_seq_len / c.rope_high_freq_factor
  smooth = ((c.rope_original_seq_len / wavelength - c.rope_low_freq_factor)
            / (c.rope_high_freq_factor - c.rope_low_freq_factor))
  blended = (1 - smooth) * inv_freq / c.rope_factor + smooth * inv_freq
  return np.where(wavelength > low_wavelength, inv_freq / c.rope_factor,
                  np.where(wavelength < high_wavelength, inv_freq, blended))


def rope(x: jax.Array, inv_freq, offset: jax.Array | int = 0) -> jax.Array:
  """``x: [B, T, heads, head_dim]`` with the pair ``(x[i], x[i + head_dim/2])`` at position t
  rotated by ``t · inv_freq[i]`` (angles in float32): q·k then depends on positions only through
  their difference. ``x[:, j]`` is at position ``offset + j`` (``offset`` may be traced: the
  decoding path, `Attention.decode`)."""
  angles = _positions(x.shape[1], offset)[:, None] * jnp.asarray(inv_freq, jnp.float32)
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _positions(length: int, offset: jax.Array | int) -> jax.Array:
  """float32 ``offset … offset + length - 1``; with the default offset 0 the plain ``arange``
  (the training forward's program, unchanged)."""
  t = jnp.arange(length, dtype=jnp.float32)
  return t if isinstance(offset, int) and offset == 0 else t + jnp.asarray(offset, jnp.float32)


def _param(config: LlamaConfig, init, shape: tuple[int, ...], names: tuple[str, ...],
           rngs: nnx.Rngs) -> nnx.Param:
  return nnx.Param(nnx.with_partitioning(init, names)(rngs.params(), shape, config.weight_dtype))


def _norm(config: LlamaConfig, rngs: nnx.Rngs) -> nnx.RMSNorm:
  return nnx.RMSNorm(
      config.d_model, epsilon=config.norm_eps, dtype=config.compute_dtype,
      param_dtype=config.weight_dtype, rngs=rngs,
      scale_init=nnx.with_partitioning(nnx.initializers.ones_init(), ('embed',)))


class Embed(nnx.Module):
  """Token embedding: ``int[B, T] → dtype[B, T, d_model]`` (no position table: RoPE)."""

  def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
    self.dtype = config.compute_dtype
    self.tokens = _param(config, _init, (config.vocab_size, config.d_model), ('vocab', 'embed'),
                         rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    return constrain(jnp.take(self.tokens[...], tokens, axis=0).astype(self.dtype), RESIDUAL)

  #: Rotary positions: no table bounds the length (`hetjax.models._lm.Decoder.max_positions`).
  max_positions = None

  def decode(self, tokens: jax.Array, pos: jax.Array | int) -> jax.Array:
    """``tokens`` at positions from ``pos``: the same lookup (positions enter in attention)."""
    del pos
    return self(tokens)


class Attention(CausalAttention):
  """Causal grouped-query self-attention with rotary positions (module docstring); q, k, v and
  out are weights with a head dimension, so layouts split heads without reshapes."""

  def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
    self.dtype = config.compute_dtype
    self.inv_freq = tuple(float(f) for f in rope_frequencies(config))  # static, not a leaf
    self.implementation = config.attention_implementation(jax.default_backend())
    d, h, k, hd = config.d_model, config.heads, config.kv_heads, config.head_dim
    self.query = _param(config, _init, (d, h, hd), ('embed', 'heads', 'head_dim'), rngs)
    self.key = _param(config, _init, (d, k, hd), ('embed', 'kv_heads', 'head_dim'), rngs)
    self.value = _param(config, _init, (d, k, hd), ('embed', 'kv_heads', 'head_dim'), rngs)
    self.out = _param(config, _init, (h, hd, d), ('heads', 'head_dim', 'embed'), rngs)
    def bias(n: int, names: str) -> nnx.Param | None:  # Qwen 2's q, k and v biases
      return _param(config, nnx.initializers.zeros_init(), (n, hd), (names, 'head_dim'),
                    rngs) if config.qkv_bias else None

    self.query_bias, self.key_bias, self.value_bias = (
        bias(h, 'heads'), bias(k, 'kv_heads'), bias(k, 'kv_heads'))

  def _qkv(self, x: jax.Array, pos: jax.Array | int) -> tuple[jax.Array, jax.Array, jax.Array]:
    def project(w: nnx.Param, b: nnx.Param | None, names: tuple[str, ...]) -> jax.Array:
      y = jnp.einsum('bte,ehd->bthd', x, w[...].astype(self.dtype))
      return constrain(y if b is None else y + b[...].astype(self.dtype), names)

    q = constrain(rope(project(self.query, self.query_bias, HEADS), self.inv_freq, pos), HEADS)
    k = constrain(rope(project(self.key, self.key_bias, KV_HEADS), self.inv_freq, pos),
                  KV_HEADS)
    return q, k, project(self.value, self.value_bias, KV_HEADS)


class Block(DecoderBlock):
  """``x + attn(rms_norm(x))``, then ``x + down(silu(gate(h)) · up(h))``, ``h = rms_norm(x)``;
  its forward rematerialised as ``remat`` says."""

  def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
    self.remat, self.dtype = config.remat, config.compute_dtype
    self.attn_norm = _norm(config, rngs)
    self.attn = Attention(config, rngs=rngs)
    self.mlp_norm = _norm(config, rngs)
    d, m = config.d_model, config.mlp
    self.gate = _param(config, _init, (d, m), ('embed', 'mlp'), rngs)
    self.up = _param(config, _init, (d, m), ('embed', 'mlp'), rngs)
    self.down = _param(config, _init, (m, d), ('mlp', 'embed'), rngs)

  def _mlp(self, x: jax.Array) -> jax.Array:
    h = self.mlp_norm(x)
    gate = jnp.einsum('bte,em->btm', h, self.gate[...].astype(self.dtype))
    up = jnp.einsum('bte,em->btm', h, self.up[...].astype(self.dtype))
    hidden = constrain(jax.nn.silu(gate) * up, ('batch', 'seq', 'mlp'))
    return constrain(x + jnp.einsum('btm,me->bte', hidden, self.down[...].astype(self.dtype)),
                     RESIDUAL)


class Head(nnx.Module):
  """Final RMSNorm and the projection to float32 logits; tied, the projection is the token
  embedding's own parameter (transposed)."""

  def __init__(self, config: LlamaConfig, tied: nnx.Param | None, *, rngs: nnx.Rngs):
    self.dtype = config.compute_dtype
    self.tied = tied is not None
    self.norm = _norm(config, rngs)
    if self.tied:
      self.tokens = tied  # the `Embed`'s Variable: one parameter, read by both
    else:
      self.proj = _param(config, _init, (config.d_model, config.vocab_size), ('embed', 'vocab'),
                         rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    h = self.norm(x)
    w, spec = (self.tokens[...], 'bte,ve->btv') if self.tied else (self.proj[...], 'bte,ev->btv')
    return constrain(float32_logits(spec, h, w.astype(self.dtype)), ('batch', 'seq', 'vocab'))


class Llama(Decoder):
  """``int[B, T]`` tokens → ``float32[B, T, vocab_size]`` next-token logits, position t seeing
  ≤ t.

  Example::

    model = Llama(LlamaConfig(d_model=32, heads=4, kv_heads=2, layers=1), rngs=nnx.Rngs(0))
    logits = model(jnp.zeros((2, 16), jnp.int32))   # (2, 16, 256)
  """

  NAME = 'llama'

  def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
    self.tied = config.tie_embeddings
    self.embed = Embed(config, rngs=rngs)
    self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.layers)])
    self.head = Head(config, self.embed.tokens if self.tied else None, rngs=rngs)


loss = decoder_loss



def num_params(config: LlamaConfig | Mapping[str, Any]) -> int:
  """The model's parameter count, from its config alone (a tied table counts once).

  Per block: two RMSNorms (``2·d``), q and out (``2·d²``), k and v (``2·d·kv_heads·head_dim``),
  their biases with ``qkv_bias`` (``(heads + 2·kv_heads)·head_dim``), the SwiGLU MLP
  (``3·d·mlp``); plus the token table ``vocab·d``, the final RMSNorm ``d`` and, untied, the
  head's ``d·vocab``.

  Example (Llama 3.2 1B's shape, the ``llama_1b`` config)::

    >>> num_params({'vocab_size': 128256, 'd_model': 2048, 'heads': 32, 'kv_heads': 8,
    ...             'layers': 16, 'mlp': 8192, 'tie_embeddings': True})
    1235814400
  """
  c = LlamaConfig.of(config)
  d, v = c.d_model, c.vocab_size
  head = d + (0 if c.tie_embeddings else d * v)
  return v * d + c.layers * (2 * d + _block_matmul_params(c) + _bias_params(c)) + head


def flops_per_token(config: LlamaConfig | Mapping[str, Any]) -> int:
  """Training FLOPs per token (forward and backward), as `hetjax.models.gpt.flops_per_token`
  counts them: ``6·N + 12·layers·seq_len·d_model``, ``N`` the weights that multiply
  activations (every block's projections and MLP, and the head's ``d_model·vocab``; the token
  lookup, norms and biases left out); attention's two ``T × T`` products per layer over the query
  heads' ``d_model`` (grouped key/value heads are read, not multiplied, more often)."""
  c = LlamaConfig.of(config)
  matmul = c.layers * _block_matmul_params(c) + c.d_model * c.vocab_size
  return 6 * matmul + 12 * c.layers * c.seq_len * c.d_model


def _block_matmul_params(c: LlamaConfig) -> int:
  d, kv = c.d_model, c.kv_heads * c.head_dim
  return 2 * d * d + 2 * d * kv + 3 * d * c.mlp


def _bias_params(c: LlamaConfig) -> int:
  return (c.heads + 2 * c.kv_heads) * c.head_dim if c.qkv_bias else 0


def make_task(vocab_size: int = BYTES, d_model: int = 128, heads: int = 4,
              kv_heads: int | None = None, layers: int = 2, mlp: int | None = None,
              seq_len: int = 128, rope_base: float = 10_000.0, rope_scaling: str = 'none',
              rope_factor: float = 8.0, rope_low_freq_factor: float = 1.0,
              rope_high_freq_factor: float = 4.0, rope_original_seq_len: int = 8192,
              norm_eps: float = 1e-5, qkv_bias: bool = False, tie_embeddings: bool = False,
              dtype: str = 'float32', param_dtype: str = 'float32', remat: str = 'none',
              attention: str = 'auto', data: str | os.PathLike | None = None) -> Task:
  """The Llama language model on the stdlib bytes (``data=None``) or a token dataset.

  Example::

    task = make_task(d_model=64, heads=4, kv_heads=2, layers=2, seq_len=64)
    task.data.global_batch(seed=0, step=0, size=8)['tokens'].shape   # (8, 65)

  Args:
    vocab_size, d_model, heads, layers, seq_len, tie_embeddings, dtype, param_dtype, remat,
      attention, data: as `hetjax.models.gpt.make_task`'s.
    kv_heads: key/value heads, dividing ``heads`` (None: ``heads``; 1: multi-query).
    mlp: the SwiGLU hidden width; None: ``8·d_model/3`` rounded up to a multiple of 8.
    rope_base, rope_scaling, rope_factor, rope_low_freq_factor, rope_high_freq_factor,
      rope_original_seq_len: the rotary frequencies (`rope_frequencies`).
    norm_eps: the RMSNorms' epsilon.
    qkv_bias: biases on q, k and v (Qwen 2).

  Raises:
    ConfigError: a bad size or option (`LlamaConfig`), a vocabulary smaller than the data's, or
      a dataset that cannot be read.
  """
  if data is not None and not isinstance(data, (str, os.PathLike)):
    raise ConfigError(f'llama data must be a token dataset directory or None, got {data!r}')
  args = dict(vocab_size=vocab_size, d_model=d_model, heads=heads, kv_heads=kv_heads,
              layers=layers, mlp=mlp, seq_len=seq_len, rope_base=rope_base,
              rope_scaling=rope_scaling, rope_factor=rope_factor,
              rope_low_freq_factor=rope_low_freq_factor,
              rope_high_freq_factor=rope_high_freq_factor,
              rope_original_seq_len=rope_original_seq_len, norm_eps=norm_eps, qkv_bias=qkv_bias,
              tie_embeddings=tie_embeddings, dtype=dtype, param_dtype=param_dtype, remat=remat,
              attention=attention, data=None if data is None else os.fspath(data))
  config = LlamaConfig.of(args)
  if data is None and vocab_size < BYTES:
    raise ConfigError(f'llama vocab_size={vocab_size} is smaller than the {BYTES} byte values '
                      'of the stdlib corpus (data=None)')
  train, held_out = (stdlib_splits(seq_len, EVAL_FRACTION) if data is None else
                     token_splits(data, seq_len, 'llama'))
  if data is not None:
    hdata.check_vocab(train, vocab_size)

  def make_model(rngs: nnx.Rngs) -> Llama:
    return Llama(config, rngs=rngs)

  return Task('llama', make_model, loss, train, eval_data=held_out, config=args,
              tokens_per_example=seq_len)


_DEFAULTS = {name: p.default for name, p in inspect.signature(make_task).parameters.items()}
