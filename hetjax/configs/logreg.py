"""SchMP L1 logistic regression: Σ log(1 + exp(−yᵢ xᵢᵀβ)) + λ‖β‖₁ by scheduled parallel
coordinate descent (`hetjax.schmp._logreg`) on its default synthetic design (a group of 512
columns correlated at 0.9 among 1024);
``--set model_args.data="'breast_cancer'"`` scikit-learn's bundled breast-cancer data (569 rows:
``--set model_args.pad_rows=True`` on devices that do not divide them), ``--set
scheduler=shotgun`` or ``cyclic`` the baselines."""

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
      model=ModelConfig('logreg'),
      optimizer=OptimizerConfig(steps=200),
      schmp=SchmpConfig(scheduler='schmp', staleness=1, objective_every=10),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=100))
