"""``hetjax-schmp`` (``experiments/schmp.py``): trains a SchMP app (scheduled model
parallelism), ``hetjax-train`` with the app's config.

  hetjax-schmp --app=lasso --lam=0.1 --scheduler=shotgun --steps=200 \\
      --jax_num_cpu_devices=4 --workdir=runs/lasso
  python -m hetjax.launch --workers 4 -- hetjax-schmp --app=mf --steps=40
  python -m hetjax.report runs/lasso          # the objective against rounds and time

``--app`` (``lasso``, ``logreg``, ``mf``, ``lda``, ``svm``, ``cdmf``) picks the shipped config of
the same name (`hetjax.configs`); ``--lam``, ``--scheduler``, ``--schedule_size`` and
``--staleness`` are shorthands for ``--set model_args.lam=…``, ``--set scheduler=…`` and so on
(the SVM's C is ``--set model_args.c=…``), and every flag of train.py works here too
(``--steps`` rounds, ``--resume``, ``--set model_args.…``). Each round's objective goes to
``metrics.jsonl`` as its ``loss``. Bad input (an unknown app or
scheduler, λ ≤ 0, a schedule size of 0, data that does not split over the devices) prints one
line and exits with 2.
"""

from __future__ import annotations

from absl import flags

from hetjax import ConfigError, schmp
from hetjax.cli import train
from hetjax.cli._main import program_name, run_main

_APP = flags.DEFINE_string('app', None, f'the SchMP app: one of {", ".join(schmp.APPS)}')
_LAM = flags.DEFINE_float('lam', None, 'the regularisation λ (model_args.lam)')
_SCHEDULER = flags.DEFINE_string('scheduler', None, 'schmp, or a baseline the app names')
_SCHEDULE_SIZE = flags.DEFINE_integer('schedule_size', None, 'blocks a round updates (>= 1)')
_STALENESS = flags.DEFINE_integer('staleness', None, 'rounds old the schedule\'s information is')


def schmp_from_flags() -> dict | None:
  if not _APP.value:
    raise ConfigError(f'--app is required: one of {", ".join(schmp.APPS)}')
  if _APP.value not in schmp.APPS:
    raise ConfigError(f'unknown SchMP app {_APP.value!r}; choose one of: {", ".join(schmp.APPS)}')
  if flags.FLAGS['config'].present:
    raise ConfigError('give --app, not --config (schmp.py picks the app\'s config)')
  flags.FLAGS.config = _APP.value
  sets = [f'{key}={flag.value}' for key, flag in (
      ('model_args.lam', _LAM), ('scheduler', _SCHEDULER), ('schedule_size', _SCHEDULE_SIZE),
      ('staleness', _STALENESS)) if flag.value is not None]
  flags.FLAGS.set = [*flags.FLAGS.set, *sets]
  if not flags.FLAGS['workdir'].present:
    flags.FLAGS.workdir = f'runs/{_APP.value}'
  return train.train_from_flags()


def main() -> None:
  """The ``hetjax-schmp`` console entry."""
  run_main(program_name('schmp.py'), schmp_from_flags)
