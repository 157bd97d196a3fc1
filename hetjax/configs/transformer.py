"""Byte-level Transformer LM on the Python standard library's source, 2-D hybrid on 4x2."""

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
      model=ModelConfig('transformer',
                        {'d_model': 128, 'heads': 8, 'layers': 2, 'mlp': 512, 'seq_len': 64}),
      data=DataConfig(global_batch=64),
      optimizer=OptimizerConfig('adamw', learning_rate=3e-3, steps=200),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=100))
