"""Wide & deep recommender on synthetic Zipf clicks: a 10^5-row table, 2-D hybrid on 4x2."""

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
      model=ModelConfig('wide_deep', {'rows': 100_000, 'dim': 64, 'fields': 4}),
      data=DataConfig(global_batch=512),
      optimizer=OptimizerConfig('adam', learning_rate=2e-3, steps=200),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=20), checkpoint=CheckpointConfig(every=100))
