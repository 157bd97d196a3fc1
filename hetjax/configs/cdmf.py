"""SchMP CD-MF: CCD++ matrix factorisation (rank-one coordinate updates of W's and H's columns)
on SGD-MF's Zipf ratings, P × P blocks and rotation of the column factors (`hetjax.schmp._cdmf`).
P rounds are a sweep over every rating, 2 × rank sweeps an outer iteration (every column of W
and H once). The objective is SGD-MF's regularised loss; ``--app=mf --set
model_args.metric="'loss'"`` runs SGD-MF on the same data with the same objective."""

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
      model=ModelConfig('cdmf', {'rank': 8, 'lam': 0.05, 'users': 1000, 'items': 500,
                                 'ratings': 20_000}),
      optimizer=OptimizerConfig(steps=256),
      schmp=SchmpConfig(scheduler='schmp', staleness=1, objective_every=16),
      logging=LoggingConfig(every=16), checkpoint=CheckpointConfig(every=128))
