"""SchMP matrix factorisation: SGD on P × P blocks of Zipf ratings, the column factors rotating
over the devices (`hetjax.schmp._mf`). P rounds are an epoch (one device's SGD over every
rating, exactly); ``--set scheduler=unscheduled`` is the baseline (parallel SGD whose copies of
the column factors are averaged after every round, P rounds an epoch too). The objective is the
training RMSE. The app runs on every device of the job, so ``model_args`` names no device
count; ``model_args.row_shares`` gives faster devices more users."""

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
      model=ModelConfig('mf', {'rank': 8, 'lam': 0.05, 'lr': 0.1, 'users': 1000, 'items': 500,
                               'ratings': 20_000}),
      optimizer=OptimizerConfig(steps=40),
      schmp=SchmpConfig(scheduler='schmp', staleness=1, objective_every=4),
      logging=LoggingConfig(every=4), checkpoint=CheckpointConfig(every=20))
