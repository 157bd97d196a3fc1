"""Byte-level decoder-only Transformer language model on the standard library's source."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hetjax import data as hdata
from hetjax._errors import ConfigError
from hetjax.models._lm import next_token_loss, token_chain
from hetjax.pipeline import Link
from hetjax.sharding import constrain, scope
from hetjax.train import Task

VOCAB = 256  # one token per byte value

RESIDUAL = ('batch', 'seq', 'embed')
HEADS = ('batch', 'seq', 'heads', 'head_dim')

_init = nnx.initializers.normal(0.02)  # GPT-2's: logits start near zero, so loss ≈ ln 256


def _param(init, shape: tuple[int, ...], names: tuple[str, ...], rngs: nnx.Rngs) -> nnx.Param:
  return nnx.Param(nnx.with_partitioning(init, names)(rngs.params(), shape))


def _norm(d_model: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
  return nnx.LayerNorm(
      d_model, rngs=rngs,
      scale_init=nnx.with_partitioning(nnx.initializers.ones_init(), ('embed',)),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ('embed',)))


def _dense(din: int, dout: int, names: tuple[str, str], init, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(
      din, dout, rngs=rngs,
      kernel_init=nnx.with_partitioning(init, names),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (names[1],)))


class Embed(nnx.Module):
  """Token plus learned position embeddings: ``int[B, T] → float32[B, T, d_model]``.

  ``T`` may be shorter than ``seq_len`` (the first ``T`` positions are used), e.g. when sampling.
  """

  def __init__(self, seq_len: int, d_model: int, *, rngs: nnx.Rngs):
    self.tokens = _param(_init, (VOCAB, d_model), ('vocab', 'embed'), rngs)
    self.positions = _param(_init, (seq_len, d_model), ('seq', 'embed'), rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    x = jnp.take(self.tokens[...], tokens, axis=0) + self.positions[:tokens.shape[1]]
    return constrain(x, RESIDUAL)


class Attention(nnx.Module):
  """Causal multi-head self-attention; heads are a weight dimension so tensor parallelism can
  split them (``'heads'``) without reshapes."""

  def __init__(self, d_model: int, heads: int, out_init, *, rngs: nnx.Rngs):
    shape, names = (d_model, heads, d_model // heads), ('embed', 'heads', 'head_dim')
    self.query = _param(_init, shape, names, rngs)
    self.key = _param(_init, shape, names, rngs)
    self.value = _param(_init, shape, names, rngs)
    self.out = _param(out_init, shape[1:] + shape[:1], ('heads', 'head_dim', 'embed'), rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    q = constrain(jnp.einsum('bte,ehd->bthd', x, self.query[...]), HEADS)
    k = constrain(jnp.einsum('bte,ehd->bthd', x, self.key[...]), HEADS)
    v = constrain(jnp.einsum('bte,ehd->bthd', x, self.value[...]), HEADS)
    scores = jnp.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(q.shape[-1])
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    mixed = constrain(jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(scores, axis=-1), v), HEADS)
    return jnp.einsum('bqhd,hde->bqe', mixed, self.out[...])


class Block(nnx.Module):
  """Pre-LayerNorm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

  def __init__(self, d_model: int, heads: int, mlp: int, out_init, *, rngs: nnx.Rngs):
    self.attn_norm = _norm(d_model, rngs)
    self.attn = Attention(d_model, heads, out_init, rngs=rngs)
    self.mlp_norm = _norm(d_model, rngs)
    self.up = _dense(d_model, mlp, ('embed', 'mlp'), _init, rngs)
    self.down = _dense(mlp, d_model, ('mlp', 'embed'), out_init, rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = constrain(x + self.attn(self.attn_norm(x)), RESIDUAL)
    h = constrain(jax.nn.gelu(self.up(self.mlp_norm(x))), ('batch', 'seq', 'mlp'))
    return constrain(x + self.down(h), RESIDUAL)


class Head(nnx.Module):
  """Final LayerNorm and the untied projection to byte logits."""

  def __init__(self, d_model: int, *, rngs: nnx.Rngs):
    self.norm = _norm(d_model, rngs)
    self.proj = _param(_init, (d_model, VOCAB), ('embed', 'vocab'), rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    logits = jnp.einsum('bte,ev->btv', self.norm(x), self.proj[...])
    return constrain(logits, ('batch', 'seq', 'vocab'))


class Transformer(nnx.Module):
  """``int[B, T]`` bytes → ``float32[B, T, 256]`` next-byte logits, position t seeing ≤ t.

  Example::

    model = Transformer(d_model=32, heads=4, layers=1, mlp=64, seq_len=16, rngs=nnx.Rngs(0))
    logits = model(jnp.zeros((2, 16), jnp.int32))   # (2, 16, 256)
  """

  def __init__(self, d_model: int, heads: int, layers: int, mlp: int, seq_len: int, *,
               rngs: nnx.Rngs):
    # GPT-2 scales the projections that write into the residual stream by 1/√(2·layers), so the
    # stream's variance does not grow with depth.
    out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * layers))
    self.embed = Embed(seq_len, d_model, rngs=rngs)
    self.blocks = nnx.List([Block(d_model, heads, mlp, out_init, rngs=rngs) for _ in range(layers)])
    self.head = Head(d_model, rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    with scope('embed'):
      x = self.embed(tokens)
    for i, block in enumerate(self.blocks):
      with scope(f'block_{i}'):
        x = block(x)
    with scope('head'):
      return self.head(x)

  def submodels(self) -> dict[str, nnx.Module]:
    """``embed``, ``block_0`` … ``block_{layers-1}``, ``head``, in forward order."""
    parts: dict[str, nnx.Module] = {'embed': self.embed}
    parts.update({f'block_{i}': block for i, block in enumerate(self.blocks)})
    parts['head'] = self.head
    return parts

  def chain(self) -> tuple[Link, ...]:
    """The `submodels` as a pipeline chain (`hetjax.pipeline.HasChain`): ``embed`` reads
    ``batch['tokens'][:, :-1]``, every block and the head map the carry ``x`` to the next."""
    return token_chain(self.submodels())

  def chain_loss(self, logits: jax.Array, batch: hdata.Batch) -> jax.Array:
    """`loss` from the head's logits: the last step of the chain (reads no parameters)."""
    return next_token_loss(logits, batch['tokens'])


def loss(model: Transformer, batch: hdata.Batch) -> jax.Array:
  """Next-byte cross-entropy of every example, averaged over its ``seq_len`` positions."""
  tokens = batch['tokens']
  return next_token_loss(model(tokens[:, :-1]), tokens)


def make_task(d_model: int = 128, heads: int = 8, layers: int = 2, mlp: int = 512,
              seq_len: int = 64) -> Task:
  """The byte-level LM on the stdlib corpus.

  The defaults keep ``'embed'`` (128), ``'mlp'`` (512), ``'heads'`` (8) and ``'vocab'`` (256)
  divisible by 8 so every tensor-parallel and FSDP strategy can split them over 8 devices.

  Raises:
    ConfigError: if ``d_model`` is not a multiple of ``heads``, or a size is not positive.
  """
  sizes = {'d_model': d_model, 'heads': heads, 'layers': layers, 'mlp': mlp, 'seq_len': seq_len}
  bad = {k: v for k, v in sizes.items() if v < 1}
  if bad:
    raise ConfigError(f'transformer sizes must be positive, got {bad}')
  if d_model % heads:
    raise ConfigError(f'd_model={d_model} is not divisible by heads={heads}')

  def make_model(rngs: nnx.Rngs) -> Transformer:
    return Transformer(d_model, heads, layers, mlp, seq_len, rngs=rngs)

  return Task('transformer', make_model, loss, hdata.stdlib_text(seq_len), config=sizes,
              tokens_per_example=seq_len)
