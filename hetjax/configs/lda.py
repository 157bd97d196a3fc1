"""SchMP-LDA: collapsed Gibbs on the standard library's docstrings, vocabulary shards rotating
over the devices (`hetjax.schmp._lda`). A round is 1/P of a sweep; ``--set scheduler=unscheduled``
is the unscheduled parallel Gibbs baseline (a round is a whole sweep)."""

from hetjax.run import (
  CheckpointConfig,
  Config,
  LoggingConfig,
  ModelConfig,
  OptimizerConfig,
  SchmpConfig,
)


def get_config() -> Config:
  return Config(
      model=ModelConfig('lda', {'topics': 16, 'alpha': 0.1, 'beta': 0.01, 'documents': 256,
                                'vocabulary': 1000}),
      optimizer=OptimizerConfig(steps=40),
      schmp=SchmpConfig(scheduler='schmp', staleness=1, objective_every=4),
      logging=LoggingConfig(every=4), checkpoint=CheckpointConfig(every=20))
