"""Your own model in hetjax: a Task (model, per-example loss, data) and a Config that trains it.

Every mode, the launcher, LB-BSP and the report take it like a shipped model:

  .venv/bin/python experiments/train.py --config=examples.regression:get_config
  .venv/bin/python -m hetjax.launch --workers 2 --slowdown static:1,3 --timeout 300 -- \\
      .venv/bin/python experiments/train.py --config=examples.regression:get_config \\
      --policy=lbbsp --workdir=runs/regression
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
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
  """y = x·w + b, its parameters named by logical axes only (never mesh axes)."""

  def __init__(self, features: int, rngs: nnx.Rngs):
    init = nnx.with_partitioning(nnx.initializers.zeros_init(), ('embed', None))
    self.w = nnx.Param(init(rngs.params(), (features, 1)))
    self.b = nnx.Param(jnp.zeros((1,)))

  def __call__(self, x):
    return (x @ self.w.value + self.b.value)[:, 0]


def make_task(features: int = 8, examples: int = 4096) -> Task:
  """A seeded synthetic regression: y = x·w* + noise, w* fixed by ``features``."""
  rng = np.random.default_rng(features)
  x = rng.standard_normal((examples, features)).astype(np.float32)
  y = (x @ rng.standard_normal(features) + 0.1 * rng.standard_normal(examples)).astype(np.float32)

  def loss(model, batch):
    return (model(batch['x']) - batch['y']) ** 2

  return Task('regression', lambda rngs: Linear(features, rngs), loss,
              ArraySource({'x': x, 'y': y}), config={'features': features, 'examples': examples})


def get_config() -> Config:
  return Config(
      model=ModelConfig('examples.regression:make_task', {'features': 8}),
      data=DataConfig(global_batch=128),
      optimizer=OptimizerConfig('sgd', learning_rate=0.05, steps=20),
      parallelism=ParallelismConfig(strategy='data_parallel', mesh='1x1'),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=10))
