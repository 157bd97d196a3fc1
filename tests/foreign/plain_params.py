"""A small convolutional classifier written as Flax's NNX basics guide writes its first
modules: no logical names anywhere (a hand-made layer of plain `nnx.Param`, `nnx.Conv` and
`nnx.Linear` with their default initializers) and bias-free layers (``use_bias=False``).

hetjax must lay such a model out from shapes alone: replicated under data and tensor
parallelism (nothing names ``mlp`` or ``heads``), and under FSDP each parameter split along its
largest dimension that the device count divides (`hetjax.sharding.LogicalRules.fallback`).

Data: seeded 8×8 "images" labelled by a fixed random linear teacher.
"""

from __future__ import annotations

import jax
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


class Linear(nnx.Module):
  """The NNX guide's first module: ``x @ w + b`` from two plain `nnx.Param`."""

  def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (din, dout)) / din ** 0.5)
    self.b = nnx.Param(jnp.zeros((dout,)))

  def __call__(self, x):
    return x @ self.w[...] + self.b[...]


class ConvNet(nnx.Module):
  """Bias-free 3×3 convolution → ReLU → plain `Linear` → ReLU → bias-free `nnx.Linear`."""

  def __init__(self, channels: int, hidden: int, classes: int, *, rngs: nnx.Rngs):
    self.conv = nnx.Conv(1, channels, kernel_size=(3, 3), padding='VALID', use_bias=False,
                         rngs=rngs)
    self.linear = Linear(6 * 6 * channels, hidden, rngs=rngs)
    self.out = nnx.Linear(hidden, classes, use_bias=False, rngs=rngs)

  def __call__(self, images):
    x = nnx.relu(self.conv(images[..., None]))
    x = nnx.relu(self.linear(x.reshape(x.shape[0], -1)))
    return self.out(x)


def make_task(channels: int = 4, hidden: int = 16, classes: int = 4,
              examples: int = 1024) -> Task:
  """The classifier on seeded images; per-example loss: cross entropy."""
  rng = np.random.default_rng(classes)
  images = rng.standard_normal((examples, 8, 8)).astype(np.float32)
  labels = np.argmax(images.reshape(examples, -1) @ rng.standard_normal((64, classes)),
                     axis=-1).astype(np.int32)

  def loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch['image']),
                                                           batch['label'])

  config = dict(channels=channels, hidden=hidden, classes=classes, examples=examples)
  return Task('plain_params', lambda rngs: ConvNet(channels, hidden, classes, rngs=rngs), loss,
              ArraySource({'image': images, 'label': labels}), config=config)


def get_config() -> Config:
  return Config(
      model=ModelConfig('tests.foreign.plain_params:make_task'),
      data=DataConfig(global_batch=16),
      optimizer=OptimizerConfig('adam', learning_rate=1e-2, steps=3),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=1, tensorboard=False, mfu=False),
      checkpoint=CheckpointConfig(every=100))
