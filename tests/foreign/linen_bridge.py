"""A Linen model brought into NNX through `flax.nnx.bridge`, annotated the way Flax's lm1b
example annotates its Linen layers (``nn.with_logical_partitioning`` on initializers).

``nnx.bridge.ToNNX(module, rngs=rngs)`` then ``nnx.bridge.lazy_init(model, sample)`` is how the
bridge guide (``docs_nnx/guides/bridge_guide.md``) turns a Linen ``init`` into an NNX model. The
result differs from a native NNX model in what hetjax finds in its state: parameters named by
Linen (``Dense_0``, ``MlpBlock_0``), logical names kept as ``LogicallyPartitioned`` metadata,
some parameters left unannotated, and the wrapper's own `nnx.Rngs` (an `nnx.RngKey` and an
`nnx.RngCount`) beside the parameters.

The task: whether fewer than half of a sequence's tokens are in the lower half of the
vocabulary (a mean-pooled bag of tokens is enough to learn it).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
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


class MlpBlock(nn.Module):
  """lm1b's feed-forward block: Dense → ReLU → Dense, kernels named ('embed', 'mlp')."""

  mlp_dim: int

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.xavier_uniform()
    y = nn.Dense(self.mlp_dim,
                 kernel_init=nn.with_logical_partitioning(init, ('embed', 'mlp')),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('mlp',)))(x)
    y = nn.relu(y)
    return nn.Dense(x.shape[-1],
                    kernel_init=nn.with_logical_partitioning(init, ('mlp', 'embed')),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)))(y)


class BagOfTokens(nn.Module):
  """Embed, mean-pool, LayerNorm, a residual `MlpBlock`, a classifier head."""

  vocab_size: int
  embed_dim: int
  mlp_dim: int
  classes: int

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab_size, self.embed_dim,
                 embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0),
                                                             ('vocab', 'embed')))(tokens)
    x = nn.LayerNorm(
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)))(x.mean(1))
    x = x + MlpBlock(self.mlp_dim)(x)
    x = nn.LayerNorm()(x)  # unannotated, as much Linen code leaves its norms
    return nn.Dense(self.classes)(x)  # unannotated head


def make_task(vocab_size: int = 32, seq_len: int = 8, embed_dim: int = 16, mlp_dim: int = 32,
              classes: int = 2, examples: int = 1024) -> Task:
  """The Linen `BagOfTokens` as an NNX model; per-example loss: cross entropy."""
  rng = np.random.default_rng(seq_len)
  tokens = rng.integers(0, vocab_size, (examples, seq_len)).astype(np.int32)
  labels = ((tokens < vocab_size // 2).sum(axis=1) < seq_len / 2).astype(np.int32)
  linen = BagOfTokens(vocab_size, embed_dim, mlp_dim, classes)

  def make_model(rngs: nnx.Rngs) -> nnx.bridge.ToNNX:
    model = nnx.bridge.ToNNX(linen, rngs=rngs)
    nnx.bridge.lazy_init(model, jnp.zeros((1, seq_len), jnp.int32))
    return model

  def loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch['tokens']),
                                                           batch['label'])

  config = dict(vocab_size=vocab_size, seq_len=seq_len, embed_dim=embed_dim, mlp_dim=mlp_dim,
                classes=classes, examples=examples)
  return Task('linen_bridge', make_model, loss,
              ArraySource({'tokens': tokens, 'label': labels}), config=config)


def get_config() -> Config:
  return Config(
      model=ModelConfig('tests.foreign.linen_bridge:make_task'),
      data=DataConfig(global_batch=16),
      optimizer=OptimizerConfig('adam', learning_rate=1e-2, steps=3),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=1, tensorboard=False, mfu=False),
      checkpoint=CheckpointConfig(every=100))
