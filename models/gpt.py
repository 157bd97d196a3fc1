"""GPT-2 style decoder-only language model, with mixed precision and rematerialisation.

Pre-LayerNorm blocks (``x + attn(norm(x))``, then ``x + mlp(norm(x))``) with a GELU MLP, learned
or rotary positions, and an optional head tied to the token embedding. Attention is
`jax.nn.dot_product_attention` with ``is_causal=True``, computed (``attention``) by XLA's fused
ops (``'xla'``: any backend and dtype; the full ``T × T`` scores in memory) or by cuDNN's fused
flash attention (``'cudnn'``: NVIDIA GPUs, 16-bit compute, ``head_dim`` a multiple of 8 up to
128; no scores in memory). ``'auto'``, the default, is cuDNN's where it applies and XLA's
elsewhere, so a CPU run and a float32 run compute what they always did.

Precision: parameters are stored in ``param_dtype`` and cast to the compute ``dtype`` where
they are used, so ``dtype='bfloat16', param_dtype='float32'`` is bfloat16 compute over float32
master weights (the optimizer updates the float32 copy). LayerNorm statistics, the attention
softmax and the logits are float32 whatever ``dtype`` is: the head's matmul accumulates into
float32 and the loss is taken on float32 logits. Its backward runs in the compute dtype, as
every other layer's does (`float32_logits`): the logits' gradient is rounded to it before the
two matmuls, which would otherwise multiply float32 operands (TF32 on an NVIDIA GPU, at half
the bfloat16 rate, over twice the bytes: a third of GPT-2 small's FLOPs are the head's).

Rematerialisation (``remat``) wraps each block's forward in `nnx.remat` (the lifted
`jax.checkpoint`): ``'full'`` keeps only the block's input and recomputes everything else in
the backward pass; ``'save_dots'`` keeps the outputs of matmuls without batch dimensions (the
projections and the MLP, `jax.checkpoint_policies.dots_with_no_batch_dims_saveable`) and
recomputes the attention scores, norms and activations. Gradients are those of ``'none'``.

Like `hetjax.models.transformer`, the model names logical axes only and exposes
``submodels()`` (``embed``, ``block_0`` …, ``head``) for the planner and ``chain()`` /
``chain_loss`` for pipelines.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
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
from hetjax.sharding import constrain
from hetjax.train import Task

BYTES = 256  # the stdlib corpus' vocabulary: one token per byte value
EVAL_FRACTION = 0.1  # the stdlib corpus' last tenth is the held-out split


#: Compute and parameter dtypes by name (`hetjax.run.ModelConfig` names the same ones).
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}

_init = nnx.initializers.normal(0.02)  # GPT-2's: logits start near zero, so loss ≈ ln vocab


class Positions(enum.Enum):
  """How a token's position enters the model."""

  LEARNED = 'learned'  # a learned ``[seq_len, d_model]`` table added to the token embedding
  ROTARY = 'rotary'  # RoPE: q and k rotated by position-dependent angles in every block


class Remat(enum.Enum):
  """What a block keeps for the backward pass (module docstring)."""

  NONE = 'none'
  FULL = 'full'
  SAVE_DOTS = 'save_dots'

  def policy(self):
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable if (
        self is Remat.SAVE_DOTS) else None


class AttentionImpl(enum.Enum):
  """Which kernel computes ``softmax(QKᵀ/√d)V`` (module docstring)."""

  XLA = 'xla'
  CUDNN = 'cudnn'
  AUTO = 'auto'


#: What cuDNN's fused attention takes (`jax.nn.dot_product_attention`, implementation='cudnn').
CUDNN_DTYPES = ('bfloat16', 'float16')
CUDNN_MAX_HEAD_DIM = 128


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """The model's sizes and options, validated; ``mlp=None`` means ``4 · d_model``.

  Example::

    >>> GPTConfig(d_model=64, heads=4, positions='rotary').head_dim
    16
    >>> GPTConfig(d_model=64, heads=5)
    Traceback (most recent call last):
    hetjax._errors.ConfigError: gpt d_model=64 is not divisible by heads=5

  Raises:
    ConfigError: a size that is not a positive integer, ``d_model`` not divisible by ``heads``,
      an odd ``head_dim`` with rotary positions, or an unknown option; one line naming it.
  """

  vocab_size: int = BYTES
  d_model: int = 128
  heads: int = 4
  layers: int = 2
  mlp: int | None = None
  seq_len: int = 128
  positions: Positions = Positions.LEARNED
  tie_embeddings: bool = False
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  remat: Remat = Remat.NONE
  attention: AttentionImpl = AttentionImpl.AUTO

  def __post_init__(self):
    if self.mlp is None:
      object.__setattr__(self, 'mlp', 4 * self.d_model)
    for name in ('vocab_size', 'd_model', 'heads', 'layers', 'mlp', 'seq_len'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'gpt {name} must be a positive integer, got {value!r}')
    if self.d_model % self.heads:
      raise ConfigError(f'gpt d_model={self.d_model} is not divisible by heads={self.heads}')
    object.__setattr__(self, 'positions', parse_choice(Positions, self.positions, 'gpt positions'))
    object.__setattr__(self, 'remat', parse_choice(Remat, self.remat, 'gpt remat'))
    object.__setattr__(self, 'attention',
                       parse_choice(AttentionImpl, self.attention, 'gpt attention'))
    if self.positions is Positions.ROTARY and self.head_dim % 2:
      raise ConfigError(f'gpt positions=rotary needs an even head_dim, got d_model/heads = '
                        f'{self.d_model}/{self.heads} = {self.head_dim}')
    if not isinstance(self.tie_embeddings, bool):
      raise ConfigError(f'gpt tie_embeddings must be true or false, got {self.tie_embeddings!r}')
    for name in ('dtype', 'param_dtype'):
      if not isinstance(getattr(self, name), str) or getattr(self, name) not in DTYPES:
        raise ConfigError(f'gpt {name} must be one of {", ".join(DTYPES)}, got '
                          f'{getattr(self, name)!r}')
    if self.attention is AttentionImpl.CUDNN and not self.cudnn_fits:
      raise ConfigError(f'gpt attention=cudnn needs dtype {" or ".join(CUDNN_DTYPES)} and a '
                        f'head_dim that is a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}, got '
                        f'dtype={self.dtype}, head_dim={self.head_dim} (attention=auto picks '
                        'XLA\'s where cuDNN\'s does not apply)')

  @classmethod
  def of(cls, args: GPTConfig | Mapping[str, Any]) -> GPTConfig:
    """A config from `make_task`'s keyword arguments (``task.config``, ``model.args``); the
    ones it does not name take make_task's defaults, and ``data`` is ignored."""
    if isinstance(args, GPTConfig):
      return args
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in {**_DEFAULTS, **args}.items() if k in fields})

  @property
  def head_dim(self) -> int:
    return self.d_model // self.heads

  @property
  def cudnn_fits(self) -> bool:
    """Whether cuDNN's fused attention takes this model's dtype and head_dim."""
    return (self.dtype in CUDNN_DTYPES and self.head_dim % 8 == 0
            and self.head_dim <= CUDNN_MAX_HEAD_DIM)

  def attention_implementation(self, backend: str) -> str:
    """``'xla'`` or ``'cudnn'``: what ``attention`` means on JAX's ``backend``.

    Raises:
      ConfigError: ``attention='cudnn'`` on a backend other than ``'gpu'``.
    """
    if self.attention is AttentionImpl.CUDNN and backend != 'gpu':
      raise ConfigError(f'gpt attention=cudnn needs an NVIDIA GPU, but JAX\'s backend is '
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


def _param(config: GPTConfig, init, shape: tuple[int, ...], names: tuple[str, ...],
           rngs: nnx.Rngs) -> nnx.Param:
  return nnx.Param(nnx.with_partitioning(init, names)(
      rngs.params(), shape, config.weight_dtype))


def _norm(config: GPTConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
  return nnx.LayerNorm(
      config.d_model, epsilon=1e-5, dtype=config.compute_dtype, param_dtype=config.weight_dtype,
      rngs=rngs,
      scale_init=nnx.with_partitioning(nnx.initializers.ones_init(), ('embed',)),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ('embed',)))


def _dense(config: GPTConfig, din: int, dout: int, names: tuple[str, str], init,
           rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(
      din, dout, dtype=config.compute_dtype, param_dtype=config.weight_dtype, rngs=rngs,
      kernel_init=nnx.with_partitioning(init, names),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (names[1],)))


class Embed(nnx.Module):
  """Token embedding (plus learned positions): ``int[B, T] → dtype[B, T, d_model]``.

  ``T`` may be shorter than ``seq_len`` (the first ``T`` positions are used), e.g. when sampling.
  """

  def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
    self.dtype = config.compute_dtype
    self.tokens = _param(config, _init, (config.vocab_size, config.d_model), ('vocab', 'embed'),
                         rngs)
    self.positions = (_param(config, _init, (config.seq_len, config.d_model), ('seq', 'embed'),
                             rngs) if config.positions is Positions.LEARNED else None)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    x = jnp.take(self.tokens[...], tokens, axis=0)
    if self.positions is not None:
      x = x + self.positions[:tokens.shape[1]]
    return constrain(x.astype(self.dtype), RESIDUAL)

  @property
  def max_positions(self) -> int | None:
    """The position table's length (``seq_len``); None with rotary positions (no table)."""
    return None if self.positions is None else self.positions.shape[0]

  def decode(self, tokens: jax.Array, pos: jax.Array | int) -> jax.Array:
    """`__call__` for ``tokens`` at positions ``pos … pos + T - 1`` (``pos`` may be traced);
    the caller keeps ``pos + T <= max_positions``."""
    x = jnp.take(self.tokens[...], tokens, axis=0)
    if self.positions is not None:
      x = x + jax.lax.dynamic_slice_in_dim(self.positions[...], pos, tokens.shape[1])
    return constrain(x.astype(self.dtype), RESIDUAL)


def rotary(x: jax.Array, base: float = 10_000.0, offset: jax.Array | int = 0) -> jax.Array:
  """RoPE on ``x: [B, T, heads, head_dim]``: the pair ``(x[i], x[i + head_dim/2])`` at position
  t is rotated by ``t · base^(-2i/head_dim)`` (the "rotate half" layout of GPT-NeoX and Llama),
  so ``q·k`` depends on positions only through their difference. Angles in float32. ``x[:, j]``
  is at position ``offset + j`` (``offset`` may be traced: the decoding path).

  Example::

    q = jnp.ones((1, 4, 2, 8))   # [B, T, heads, head_dim]
    rotary(q)[:, 0] == q[:, 0]   # position 0 is not rotated; the norms never change
  """
  half = x.shape[-1] // 2
  frequencies = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  t = jnp.arange(x.shape[1], dtype=jnp.float32)
  if not (isinstance(offset, int) and offset == 0):  # else the training forward's program
    t = t + jnp.asarray(offset, jnp.float32)
  angles = t[:, None] * frequencies  # [T, half]
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(CausalAttention):
  """Causal multi-head self-attention; heads are a weight dimension so tensor parallelism can
  split them (``'heads'``) without reshapes. No biases on the projections (nanoGPT's
  ``bias=False``)."""

  def __init__(self, config: GPTConfig, out_init, *, rngs: nnx.Rngs):
    self.dtype = config.compute_dtype
    self.rotary = config.positions is Positions.ROTARY
    self.implementation = config.attention_implementation(jax.default_backend())
    shape, names = (config.d_model, config.heads, config.head_dim), ('embed', 'heads', 'head_dim')
    self.query = _param(config, _init, shape, names, rngs)
    self.key = _param(config, _init, shape, names, rngs)
    self.value = _param(config, _init, shape, names, rngs)
    self.out = _param(config, out_init, shape[1:] + shape[:1], ('heads', 'head_dim', 'embed'),
                      rngs)

  def _qkv(self, x: jax.Array, pos: jax.Array | int) -> tuple[jax.Array, jax.Array, jax.Array]:
    def project(w: nnx.Param) -> jax.Array:
      return constrain(jnp.einsum('bte,ehd->bthd', x, w[...].astype(self.dtype)), HEADS)

    q, k, v = project(self.query), project(self.key), project(self.value)
    if self.rotary:
      q, k = constrain(rotary(q, offset=pos), HEADS), constrain(rotary(k, offset=pos), HEADS)
    return q, k, v


class Block(DecoderBlock):
  """Pre-LayerNorm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``, its forward
  rematerialised as ``remat`` says."""

  def __init__(self, config: GPTConfig, out_init, *, rngs: nnx.Rngs):
    self.remat = config.remat
    self.attn_norm = _norm(config, rngs)
    self.attn = Attention(config, out_init, rngs=rngs)
    self.mlp_norm = _norm(config, rngs)
    self.up = _dense(config, config.d_model, config.mlp, ('embed', 'mlp'), _init, rngs)
    self.down = _dense(config, config.mlp, config.d_model, ('mlp', 'embed'), out_init, rngs)

  def _mlp(self, x: jax.Array) -> jax.Array:
    h = constrain(jax.nn.gelu(self.up(self.mlp_norm(x))), ('batch', 'seq', 'mlp'))
    return constrain(x + self.down(h), RESIDUAL)


class Head(nnx.Module):
  """Final LayerNorm and the projection to float32 logits; tied, the projection is the token
  embedding's own parameter (transposed), so the model holds it once."""

  def __init__(self, config: GPTConfig, tied: nnx.Param | None, *, rngs: nnx.Rngs):
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
    if self.tied:
      w, spec = self.tokens[...], 'bte,ve->btv'
    else:
      w, spec = self.proj[...], 'bte,ev->btv'
    return constrain(float32_logits(spec, h, w.astype(self.dtype)), ('batch', 'seq', 'vocab'))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def float32_logits(spec: str, h: jax.Array, w: jax.Array) -> jax.Array:
  """``einsum(spec, h, w)`` accumulated and returned in float32; its gradients are those of the
  einsum in ``h``'s dtype, fed the float32 cotangent rounded to that dtype (the module
  docstring's precision note). In float32 they are the plain einsum's."""
  return jnp.einsum(spec, h, w, preferred_element_type=jnp.float32)


def _float32_logits_forward(spec, h, w):
  return float32_logits(spec, h, w), (h, w)


def _float32_logits_backward(spec, saved, cotangent):
  # The einsum's transposes in each operand, not `jax.vjp`, which would trace its forward
  # again: a dead matmul that lowering drops but that a jaxpr's matmul count would see.
  h, w = saved
  cotangent = cotangent.astype(h.dtype)
  (dh,) = jax.linear_transpose(lambda h: jnp.einsum(spec, h, w), h)(cotangent)
  (dw,) = jax.linear_transpose(lambda w: jnp.einsum(spec, h, w), w)(cotangent)
  return dh, dw


float32_logits.defvjp(_float32_logits_forward, _float32_logits_backward)


class GPT(Decoder):
  """``int[B, T]`` tokens → ``float32[B, T, vocab_size]`` next-token logits, position t
  seeing ≤ t.

  Example::

    model = GPT(GPTConfig(d_model=32, heads=4, layers=1, seq_len=16), rngs=nnx.Rngs(0))
    logits = model(jnp.zeros((2, 16), jnp.int32))   # (2, 16, 256)
  """

  NAME = 'gpt'

  def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
    self.tied = config.tie_embeddings
    # GPT-2 scales the projections that write into the residual stream by 1/√(2·layers), so the
    # stream's variance does not grow with depth.
    out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * config.layers))
    self.embed = Embed(config, rngs=rngs)
    self.blocks = nnx.List([Block(config, out_init, rngs=rngs) for _ in range(config.layers)])
    self.head = Head(config, self.embed.tokens if self.tied else None, rngs=rngs)


loss = decoder_loss



def num_params(config: GPTConfig | Mapping[str, Any]) -> int:
  """The model's parameter count, from its config alone (a tied table counts once).

  Per block: two LayerNorms (``4·d``), q, k, v and out (``4·d²``), the MLP
  (``2·d·mlp + mlp + d``); plus the token table ``vocab·d``, learned positions ``seq_len·d``,
  the final LayerNorm ``2·d`` and, untied, the head's ``d·vocab``.

  Example::

    >>> num_params({'vocab_size': 50304, 'd_model': 768, 'heads': 12, 'layers': 12,
    ...             'seq_len': 1024, 'tie_embeddings': True})
    124439040
  """
  c = GPTConfig.of(config)
  d, v = c.d_model, c.vocab_size
  embed = v * d + (c.seq_len * d if c.positions is Positions.LEARNED else 0)
  head = 2 * d + (0 if c.tie_embeddings else d * v)
  return embed + c.layers * _block_params(c) + head


def flops_per_token(config: GPTConfig | Mapping[str, Any]) -> int:
  """Training FLOPs per token (forward and backward): ``6·N + 12·layers·seq_len·d_model``.

  ``N`` counts the parameters that multiply activations in a matmul: every block's and the
  head's ``d_model·vocab`` projection (tied or not) with its LayerNorm. The token and position
  tables are lookups, not matmuls, so they are left out (unless tied, when the table is the
  head's projection). A weight costs 2 FLOPs per token forward and 4 backward (the gradients of
  its input and of itself): ``6·N``. Attention adds ``QKᵀ`` and the weighted sum of ``V``, each
  ``2·seq_len·d_model`` FLOPs per token and layer forward, times 3 with the backward:
  ``12·layers·seq_len·d_model`` (PaLM's appendix B; the causal mask is not discounted because
  XLA computes the full ``T × T`` scores). Elementwise work (norms, GELU, softmax) is left out.

  It is the check on a model-FLOPs utilisation (MFU) computed from XLA's cost analysis:
  ``flops_per_token · tokens_per_s / peak_flops``.

  Example::

    >>> flops_per_token({'vocab_size': 50304, 'd_model': 768, 'heads': 12, 'layers': 12,
    ...                  'seq_len': 1024, 'tie_embeddings': True})
    855161856
  """
  c = GPTConfig.of(config)
  matmul_params = c.layers * _block_params(c) + 2 * c.d_model + c.d_model * c.vocab_size
  return 6 * matmul_params + 12 * c.layers * c.seq_len * c.d_model


def _block_params(c: GPTConfig) -> int:
  d, m = c.d_model, c.mlp
  return 4 * d + 4 * d * d + 2 * d * m + m + d


def make_task(vocab_size: int = BYTES, d_model: int = 128, heads: int = 4, layers: int = 2,
              mlp: int | None = None, seq_len: int = 128, positions: str = 'learned',
              tie_embeddings: bool = False, dtype: str = 'float32', param_dtype: str = 'float32',
              remat: str = 'none', attention: str = 'auto',
              data: str | os.PathLike | None = None) -> Task:
  """The GPT language model on the stdlib bytes (``data=None``) or a token dataset.

  Example::

    task = make_task(d_model=64, heads=4, layers=2, seq_len=64, positions='rotary')
    task.data.global_batch(seed=0, step=0, size=8)['tokens'].shape   # (8, 65)

  Args:
    vocab_size: token ids lie in ``[0, vocab_size)``; at least 256 for the stdlib bytes, at
      least the dataset's vocabulary otherwise (GPT-2's BPE: 50257, rounded up to 50304).
    d_model, heads, layers: the residual width, attention heads (``d_model / heads`` each) and
      blocks.
    mlp: the MLP's hidden width; None: ``4 · d_model``.
    seq_len: context length; batches hold ``seq_len + 1`` tokens a row.
    positions: ``'learned'`` (a position table) or ``'rotary'`` (RoPE on q and k).
    tie_embeddings: the head projects with the token table transposed (no head matrix of its
      own); such a model cannot be pipelined (`GPT.chain`).
    dtype: the compute dtype, ``'float32'``, ``'bfloat16'`` or ``'float16'``.
    param_dtype: the dtype parameters (and so the optimizer's update) are kept in.
    remat: ``'none'``, ``'full'`` or ``'save_dots'`` (module docstring).
    attention: ``'auto'``, ``'xla'`` or ``'cudnn'``: the attention kernel (module docstring);
      ``'cudnn'`` is checked against the dtype and head_dim here and against JAX's backend when
      the model is built.
    data: None: the stdlib's source bytes, the first 90% for training and the last 10% held out
      (``eval_data``); else a token dataset directory (``experiments/prepare_text.py``), its
      ``train`` split for training and its ``val`` split held out.

  Raises:
    ConfigError: a bad size or option (`GPTConfig`), a vocabulary smaller than the data's, or a
      dataset that cannot be read.
  """
  if data is not None and not isinstance(data, (str, os.PathLike)):
    raise ConfigError(f'gpt data must be a token dataset directory or None, got {data!r}')
  args = dict(vocab_size=vocab_size, d_model=d_model, heads=heads, layers=layers, mlp=mlp,
              seq_len=seq_len, positions=positions, tie_embeddings=tie_embeddings, dtype=dtype,
              param_dtype=param_dtype, remat=remat, attention=attention,
              data=None if data is None else os.fspath(data))
  config = GPTConfig.of(args)
  if data is None and vocab_size < BYTES:
    raise ConfigError(f'gpt vocab_size={vocab_size} is smaller than the {BYTES} byte values of '
                      'the stdlib corpus (data=None)')
  train, held_out = (stdlib_splits(seq_len, EVAL_FRACTION) if data is None else
                     token_splits(data, seq_len, 'gpt'))
  if data is not None:
    hdata.check_vocab(train, vocab_size)

  def make_model(rngs: nnx.Rngs) -> GPT:
    return GPT(config, rngs=rngs)

  return Task('gpt', make_model, loss, train, eval_data=held_out, config=args,
              tokens_per_example=seq_len)


_DEFAULTS = {name: p.default for name, p in inspect.signature(make_task).parameters.items()}
