"""A classifier with `nnx.Dropout` as Flax's NNX tutorials write one (``nnx.Dropout(rate,
rngs=rngs)`` keeps its own random stream in the model; ``__call__`` also takes ``rngs`` to use
instead), on seeded synthetic data.

How its dropout masks are drawn decides whether a parallel run can equal one device:

- ``masks='stream'``: the Flax default, the model's own stream (an `nnx.RngKey` and an
  `nnx.RngCount` in its state). A mask is drawn for the whole array the model sees: the same
  over one mesh however the batch is split among its devices (JAX's partitionable threefry),
  but a worker that computes its own share of rows (modes shares and tokens) draws masks of
  another shape from the same key, so those runs cannot equal one device's, only train.
- ``masks='example'``: one key per example, folded from the step and the example's id that the
  data carry, passed at call time (``model(x, rngs=key)`` under `jax.vmap`): a row's mask is
  the same whoever computes it, so every mode equals one device.
- ``masks='off'``: dropout turned off in the loss with ``set_attributes(deterministic=True)``,
  the model's stream still in its state.
"""

from __future__ import annotations

import jax
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

MASKS = ('stream', 'example', 'off')


class Classifier(nnx.Module):
  """Linear → ReLU → Dropout → Linear → ReLU → Dropout → Linear."""

  def __init__(self, features: int, hidden: int, classes: int, rate: float, *, rngs: nnx.Rngs):
    init = nnx.initializers.lecun_normal()
    zeros = nnx.initializers.zeros_init()
    self.linear1 = nnx.Linear(features, hidden, rngs=rngs,
                              kernel_init=nnx.with_partitioning(init, ('embed', 'mlp')),
                              bias_init=nnx.with_partitioning(zeros, ('mlp',)))
    self.dropout = nnx.Dropout(rate, rngs=rngs)
    self.linear2 = nnx.Linear(hidden, hidden, rngs=rngs,
                              kernel_init=nnx.with_partitioning(init, ('mlp', 'embed')))
    self.linear3 = nnx.Linear(hidden, classes, rngs=rngs,
                              kernel_init=nnx.with_partitioning(init, ('embed', None)))

  def __call__(self, x, *, rngs: jax.Array | None = None):
    """``rngs``: a key for this call's two masks (split in two), or None: the model's own
    stream."""
    keys = (None, None) if rngs is None else tuple(jax.random.split(rngs))
    x = self.dropout(nnx.relu(self.linear1(x)), rngs=keys[0])
    x = self.dropout(nnx.relu(self.linear2(x)), rngs=keys[1])
    return self.linear3(x)


class StepStamped(ArraySource):
  """An `ArraySource` whose batches also carry their step (``'step'``, one per row): with the
  example's ``'id'`` it names a row of one step, whoever computes it."""

  def global_batch(self, seed: int, step: int, size: int):
    return super().global_batch(seed, step, size) | {'step': np.full(size, step, np.int32)}

  def read_rows(self, seed: int, step: int, size: int, lo: int, hi: int):
    return super().read_rows(seed, step, size, lo, hi) | {'step': np.full(hi - lo, step,
                                                                           np.int32)}


def make_task(masks: str = 'example', rate: float = 0.1, features: int = 16, hidden: int = 32,
              classes: int = 4, examples: int = 1024, seed: int = 0) -> Task:
  """Classes of a fixed random linear teacher on Gaussian inputs (``masks``: module docstring;
  ``seed`` draws the per-example masks with ``masks='example'``)."""
  if masks not in MASKS:
    raise ValueError(f'masks must be one of {MASKS}, got {masks!r}')
  rng = np.random.default_rng(features)
  x = rng.standard_normal((examples, features)).astype(np.float32)
  y = np.argmax(x @ rng.standard_normal((features, classes)), axis=-1).astype(np.int32)
  data = StepStamped({'x': x, 'y': y, 'id': np.arange(examples, dtype=np.int32)})

  def make_model(rngs: nnx.Rngs) -> Classifier:
    return Classifier(features, hidden, classes, rate, rngs=rngs)

  def loss(model: Classifier, batch):
    if masks == 'off':
      model.set_attributes(deterministic=True)
      logits = model(batch['x'])
    elif masks == 'stream':
      logits = model(batch['x'])
    else:
      base = jax.random.key(seed)
      keys = jax.vmap(lambda s, i: jax.random.fold_in(jax.random.fold_in(base, s), i))(
          batch['step'], batch['id'])
      logits = jax.vmap(lambda row, key: model(row, rngs=key))(batch['x'], keys)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])

  config = dict(masks=masks, rate=rate, features=features, hidden=hidden, classes=classes,
                examples=examples, seed=seed)
  return Task('dropout_mlp', make_model, loss, data, config=config)


def get_config() -> Config:
  return Config(
      model=ModelConfig('tests.foreign.dropout_mlp:make_task'),
      data=DataConfig(global_batch=16),
      optimizer=OptimizerConfig('adam', learning_rate=3e-2, steps=3),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=1, tensorboard=False, mfu=False),
      checkpoint=CheckpointConfig(every=100))
