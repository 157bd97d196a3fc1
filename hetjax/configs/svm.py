"""SchMP-SVM: a linear SVM (hinge loss, C = 0.01, no intercept) by scheduled parallel dual
coordinate descent (`hetjax.schmp._svm`): the dual's coordinates are the examples, picked by
their current step and kept apart by their rows' correlation. The default data is a synthetic
design of 1024 rows × 256 features in 8 correlated groups; ``--set model_args.c=0.1`` another
C, ``--set model_args.data="'breast_cancer'"`` scikit-learn's bundled data (569 rows: ``--set
model_args.pad_rows=True`` on devices that do not divide them), ``--set scheduler=shotgun``
(unscheduled parallel dual coordinate descent) or ``cyclic`` the baselines."""

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
      model=ModelConfig('svm'),
      optimizer=OptimizerConfig(steps=400),
      schmp=SchmpConfig(scheduler='schmp', staleness=1, objective_every=10),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=200))
