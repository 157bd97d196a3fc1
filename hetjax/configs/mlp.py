"""MLP classifier on scikit-learn's digits, 2-D hybrid on 4x2 devices."""

from hetjax.run import (
  CheckpointConfig,
  Config,
  DataConfig,
  LoggingConfig,
  ModelConfig,
  OptimizerConfig,
  ParallelismConfig,
)


def get_config() -> Config:
  return Config(
      model=ModelConfig('mlp', {'hidden': 256, 'width': 128}),
      data=DataConfig(global_batch=256),
      optimizer=OptimizerConfig('adam', learning_rate=3e-3, steps=200),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=20), checkpoint=CheckpointConfig(every=100))
