"""SchMP-Lasso: ½‖y − Xβ‖² + λ‖β‖₁ by scheduled parallel coordinate descent on a synthetic design
with a group of 512 columns correlated at 0.9 among 1024 (`hetjax.schmp._lasso`, its default
design: Shotgun diverges past about 2 coordinates a round; `--set model_args.groups=32 --set
model_args.group_size=32` many smaller groups). ``--set scheduler=shotgun`` is Shotgun
(random coordinates, no dependency check), ``--set scheduler=cyclic`` sequential coordinate
descent, ``--set model_args.priority="'abs'"`` STRADS's priorities (each coordinate's last
change); ``--set model_args.data="'diabetes'"`` scikit-learn's bundled diabetes data."""

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
      model=ModelConfig('lasso'),
      optimizer=OptimizerConfig(steps=200),
      schmp=SchmpConfig(scheduler='schmp', staleness=1, objective_every=10),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=100))
