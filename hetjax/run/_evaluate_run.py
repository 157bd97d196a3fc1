"""Evaluating a finished run: its model's loss and perplexity on held-out batches, after the
fact (the run's own periodic evaluation is `hetjax.train.Evaluation`, a hook of the loop)."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from hetjax import ConfigError, sharding, train
from hetjax._checks import at_least
from hetjax.run._task import make_task, trains_app
from hetjax.run._trained import checkpoint_step, load_model, read_run_config


def evaluate(run_dir: str | pathlib.Path, *, step: int | None = None, batches: int = 8,
             batch: int | None = None,
             devices: Sequence[jax.Device] | None = None) -> dict[str, Any]:
  """Mean loss and perplexity of a run's model at checkpoint ``step`` on ``batches`` held-out
  batches of its task (`hetjax.train.Task.eval_data`).

  The batches are those the run's periodic evaluation read: batch ``i`` is
  ``task.eval_data.global_batch(config.data.seed, i, rows)`` for ``i < batches``, with ``rows``
  = ``batch``, else ``eval.batch``, else ``data.global_batch``; so with the run's
  ``eval.batches`` and the last step this is the run's final ``eval_loss`` again, up to float32
  summation order (the run's forward was partitioned over its mesh, this one is over
  ``devices``). The model is `load_model`'s (modes spmd, shares and tokens), its parameters
  replicated on the devices and each batch's rows split over them (all of ``devices`` when
  they divide ``rows``, else the most that do). Each batch's loss is the mean of
  ``task.loss`` over its rows; the result is the mean over batches, and ``exp`` of it.

  Example::

    result = hetjax.run.evaluate('runs/mytext', batches=8)
    result   # {'step': 300, 'eval_loss': 1.52, 'eval_perplexity': 4.57, 'batches': 8, ...}

  Args:
    run_dir: a run directory of `hetjax.run.train` (``hetjax-train --workdir``).
    step: the checkpoint step; None: the latest.
    batches: held-out batches to average over (the first ``batches`` of the run's).
    batch: rows of each batch; None: the run's ``eval.batch`` or ``data.global_batch``.
    devices: where to run (default: ``jax.local_devices()``).

  Returns:
    ``step``, ``eval_loss``, ``eval_perplexity``, ``batches``, ``batch`` (rows) and ``devices``
    (how many ran it).

  Raises:
    ConfigError: no run or no checkpoint there, a task with no held-out split, a mode whose
      checkpoints hold the model in pieces (`load_model`), or a bad ``batches`` or ``batch``.
  """
  run_dir = pathlib.Path(run_dir)
  config = read_run_config(run_dir)
  at_least(batches, 1, 'batches')
  rows = at_least(batch or config.eval.batch or config.data.global_batch, 1, 'batch')
  task = None if trains_app(config) else make_task(config, weights=False)
  if task is None or task.eval_data is None:
    raise ConfigError(f'{run_dir} is a run of model {config.model.name}, which has no held-out '
                      'split (Task.eval_data) to evaluate on')
  step = checkpoint_step(run_dir) if step is None else step
  devices = list(jax.local_devices() if devices is None else devices)
  devices = devices[:max(k for k in range(1, len(devices) + 1) if rows % k == 0)]
  model = load_model(run_dir, step, devices)
  mesh = sharding.make_mesh((len(devices), 1), devices=devices)
  rules = train.Strategy.DATA_PARALLEL.rules().compute
  graphdef, params = nnx.split(model)

  @jax.jit
  def means(params, rows_of_batch):
    with sharding.activation_rules(mesh, rules):
      return task.eval_means(nnx.merge(graphdef, params), rows_of_batch)

  found = [means(params, sharding.put_batch(
      task.eval_data.global_batch(config.data.seed, i, rows), mesh, rules))
      for i in range(batches)]
  averaged = {k: sum(float(f[k]) for f in found) / len(found) for k in found[0]}
  loss = averaged.pop('loss')
  return {'step': step, 'eval_loss': loss,
          'eval_perplexity': math.exp(loss) if loss < 700 else math.inf,
          **{f'eval_{k}': v for k, v in averaged.items()},
          'batches': batches, 'batch': rows, 'devices': len(devices)}
