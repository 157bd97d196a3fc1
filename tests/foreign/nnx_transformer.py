"""A decoder-only language model as Flax's NNX examples write one (the miniGPT tutorial,
``docs_nnx/examples/minigpt.md``), with logical names on its parameters as Flax users annotate.

What hetjax must take as it is, unlike its own models:

- `nnx.MultiHeadAttention`'s query, key and value kernels are rank 3 (embed, heads, head_dim)
  and its output kernel (heads, head_dim, embed), but ``kernel_init`` carries two names, as in
  Flax's examples: JAX and Flax read a `PartitionSpec` shorter than the rank as "trailing
  dimensions replicated".
- ``'kv'`` (the head dimension) is a name no hetjax strategy maps: it stays replicated.
- ``deterministic`` and ``decode`` are attributes toggled with `nnx.Module.set_attributes` in the
  loss, the way Flax's training steps switch a model between training, evaluation and decoding.
  The attention has a dropout rate but keeps no random stream (``keep_rngs=False``: its masks
  would need ``rngs`` at each call), and the loss turns it off (``deterministic=True``);
  dropout's own test is the classifier of `tests.foreign.dropout_mlp`.

Data: sequences of a fixed random Markov chain (each token has a few likely successors), so a
few steps lower the loss.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hetjax.data import ArraySource
from hetjax.run import (
  CheckpointConfig,
  Config,
  DataConfig,
  LoggingConfig,
  ModelConfig,
  OptimizerConfig,
  ParallelismConfig,
)
from hetjax.train import Task

_xavier = nnx.initializers.xavier_uniform()
_zeros = nnx.initializers.zeros_init()


class TokenAndPositionEmbedding(nnx.Module):
  """Token embedding plus a learned position embedding."""

  def __init__(self, maxlen: int, vocab_size: int, embed_dim: int, *, rngs: nnx.Rngs):
    self.token_emb = nnx.Embed(
        vocab_size, embed_dim, rngs=rngs,
        embedding_init=nnx.with_partitioning(nnx.initializers.normal(0.02), ('vocab', 'embed')))
    self.pos_emb = nnx.Embed(
        maxlen, embed_dim, rngs=rngs,
        embedding_init=nnx.with_partitioning(nnx.initializers.normal(0.02), (None, 'embed')))

  def __call__(self, tokens):
    positions = jnp.arange(tokens.shape[1])[None, :]
    return self.token_emb(tokens) + self.pos_emb(positions)


class TransformerBlock(nnx.Module):
  """Pre-norm self-attention and an MLP, each with a residual."""

  def __init__(self, embed_dim: int, num_heads: int, ff_dim: int, *, rngs: nnx.Rngs,
               rate: float = 0.1):
    self.ln1 = nnx.LayerNorm(
        embed_dim, epsilon=1e-6, rngs=rngs,
        scale_init=nnx.with_partitioning(nnx.initializers.ones_init(), ('embed',)),
        bias_init=nnx.with_partitioning(_zeros, ('embed',)))
    self.mha = nnx.MultiHeadAttention(
        num_heads=num_heads, in_features=embed_dim, dropout_rate=rate, keep_rngs=False,
        kernel_init=nnx.with_partitioning(_xavier, ('embed', 'heads')),       # rank 3
        bias_init=nnx.with_partitioning(_zeros, ('heads', 'kv')),
        out_kernel_init=nnx.with_partitioning(_xavier, ('heads', 'kv')),      # rank 3
        out_bias_init=nnx.with_partitioning(_zeros, ('embed',)),
        decode=False, rngs=rngs)
    self.ln2 = nnx.LayerNorm(embed_dim, epsilon=1e-6, rngs=rngs)  # left unannotated
    self.mlp_in = nnx.Linear(embed_dim, ff_dim, rngs=rngs,
                             kernel_init=nnx.with_partitioning(_xavier, ('embed', 'mlp')),
                             bias_init=nnx.with_partitioning(_zeros, ('mlp',)))
    self.mlp_out = nnx.Linear(ff_dim, embed_dim, rngs=rngs,
                              kernel_init=nnx.with_partitioning(_xavier, ('mlp', 'embed')),
                              bias_init=nnx.with_partitioning(_zeros, ('embed',)))

  def __call__(self, x, mask):
    x = x + self.mha(self.ln1(x), mask=mask)
    return x + self.mlp_out(nnx.gelu(self.mlp_in(self.ln2(x))))


class MiniGPT(nnx.Module):
  """Embedding, ``num_blocks`` transformer blocks, a final norm and a vocabulary head."""

  def __init__(self, maxlen: int, vocab_size: int, embed_dim: int, num_heads: int,
               ff_dim: int, num_blocks: int, *, rngs: nnx.Rngs):
    self.embedding = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim, rngs=rngs)
    self.blocks = nnx.List([TransformerBlock(embed_dim, num_heads, ff_dim, rngs=rngs)
                            for _ in range(num_blocks)])
    self.ln_f = nnx.LayerNorm(embed_dim, epsilon=1e-6, rngs=rngs)
    self.head = nnx.Linear(embed_dim, vocab_size, rngs=rngs,
                           kernel_init=nnx.with_partitioning(_xavier, ('embed', 'vocab')),
                           bias_init=nnx.with_partitioning(_zeros, ('vocab',)))

  def __call__(self, tokens):
    mask = nnx.make_causal_mask(tokens)
    x = self.embedding(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.ln_f(x))


def markov_sequences(vocab_size: int, seq_len: int, examples: int, seed: int = 0) -> np.ndarray:
  """``int32[examples, seq_len + 1]`` from a fixed random chain: each token is followed by one
  of 3 successors drawn once per token (so the next token is partly predictable)."""
  rng = np.random.default_rng(seed)
  successors = rng.integers(0, vocab_size, (vocab_size, 3))
  out = np.empty((examples, seq_len + 1), np.int32)
  out[:, 0] = rng.integers(0, vocab_size, examples)
  for t in range(seq_len):
    out[:, t + 1] = successors[out[:, t], rng.integers(0, 3, examples)]
  return out


def make_task(vocab_size: int = 32, seq_len: int = 8, embed_dim: int = 16, num_heads: int = 8,
              ff_dim: int = 32, num_blocks: int = 1, examples: int = 512) -> Task:
  """The tiny LM on the Markov chain's sequences; per-example loss: mean next-token cross
  entropy over the sequence."""
  tokens = markov_sequences(vocab_size, seq_len, examples)

  def make_model(rngs: nnx.Rngs) -> MiniGPT:
    return MiniGPT(seq_len, vocab_size, embed_dim, num_heads, ff_dim, num_blocks, rngs=rngs)

  def loss(model: MiniGPT, batch):
    model.set_attributes(deterministic=True, decode=False)
    logits = model(batch['tokens'][:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, batch['tokens'][:, 1:]).mean(axis=-1)

  config = dict(vocab_size=vocab_size, seq_len=seq_len, embed_dim=embed_dim,
                num_heads=num_heads, ff_dim=ff_dim, num_blocks=num_blocks, examples=examples)
  return Task('nnx_transformer', make_model, loss, ArraySource({'tokens': tokens}),
              config=config, tokens_per_example=seq_len)


def get_config() -> Config:
  """SGD with momentum, not Adam: the key projection's bias has a zero gradient in exact
  arithmetic (it adds the same logit to every key of a query, which the softmax ignores), so
  its gradient is rounding noise, and Adam's per-coordinate normalisation would turn that noise
  into steps of the full learning rate whose sign depends on the summation order: the
  parameters of two layouts would then differ by noise, not by rounding."""
  return Config(
      model=ModelConfig('tests.foreign.nnx_transformer:make_task'),
      data=DataConfig(global_batch=16),
      optimizer=OptimizerConfig('momentum', learning_rate=0.3, steps=3),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=1, tensorboard=False, mfu=False),
      checkpoint=CheckpointConfig(every=100))
