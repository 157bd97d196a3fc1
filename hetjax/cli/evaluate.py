"""``hetjax-evaluate`` (``experiments/evaluate.py``): evaluates a finished run's model on its
held-out split (`hetjax.run.evaluate`).

  hetjax-evaluate --workdir=runs/mytext              # the latest checkpoint
  hetjax-evaluate --workdir=runs/mytext --step=200 --batches=32

Prints the step, ``eval_loss`` and ``eval_perplexity`` and writes them to ``WORKDIR/eval.json``.
The batches are the run's own evaluation batches (the first ``--batches`` of them), so at the
last step and the run's ``eval.batches`` it repeats the run's final ``eval_loss``. No run, no
checkpoint or no held-out split prints one line and exits 2.
"""

from __future__ import annotations

import json
import pathlib

from absl import flags

from hetjax import ConfigError, run
from hetjax.cli._main import program_name, run_main

_WORKDIR = flags.DEFINE_string('workdir', None, 'run directory to evaluate (required)')
_STEP = flags.DEFINE_integer('step', None, 'checkpoint step (default: the latest)')
_BATCHES = flags.DEFINE_integer('batches', 8, 'held-out batches to average over')
_BATCH = flags.DEFINE_integer('batch', None, 'rows per batch (default: the run\'s eval batch)')


def evaluate_from_flags() -> dict:
  if not _WORKDIR.value:
    raise ConfigError('--workdir is required: the run directory to evaluate')
  workdir = pathlib.Path(_WORKDIR.value).expanduser()
  result = run.evaluate(workdir, step=_STEP.value, batches=_BATCHES.value, batch=_BATCH.value)
  (workdir / 'eval.json').write_text(json.dumps(result, indent=2) + '\n')
  print(f'step {result["step"]}: eval_loss {result["eval_loss"]:.4f}, eval_perplexity '
        f'{result["eval_perplexity"]:.2f} ({result["batches"]} batches of {result["batch"]} rows)')
  return result


def main() -> None:
  """The ``hetjax-evaluate`` console entry."""
  run_main(program_name('evaluate.py'), evaluate_from_flags)
