"""What a run reports beyond its loss: evaluation, the learning rate, tokens/s, MFU and
TensorBoard, assembled from the config for the runner (`hetjax.run.train`) in every mode.

MFU divides the model FLOPs of a step by its time and the peak FLOP/s of the devices it runs
on. The FLOPs are XLA's count of the task's step lowered on one device for a few rows (or its
matmuls', where XLA counted fewer, as on a GPU: `hetjax.train.program_flops`), scaled to the
global batch: the same count whatever the mode, so a shares, tokens, pipeline or ps run's MFU
compares with an SPMD run's (each device's part of a partitioned program would count the
collectives' and replicated updates' extra work instead).
The peak is ``logging.peak_flops`` per device, else measured once by a matmul in the compute
dtype (`hetjax.runtime.peak_flops`), times the job's devices.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hetjax import report, runtime, sharding, train
from hetjax.run._built import Built
from hetjax.run._config import Config
from hetjax.run._task import optimizer_of, trains_app

#: Rows of the one-device step whose XLA count gives the FLOPs of one example.
FLOPS_ROWS = 8


def evaluation_of(config: Config, task: Any) -> train.Evaluation | None:
  """The run's periodic evaluation, or None: off in the config, or the task has no held-out
  split (``eval_data``; a SchMP app reports its objective instead)."""
  if trains_app(config) or not config.eval.enabled or task.eval_data is None:
    return None
  return train.Evaluation(task.eval_data, config.data.seed,
                          config.eval.batch or config.data.global_batch, config.eval.batches)


def flops_per_step(config: Config, task: train.Task) -> float:
  """Model FLOPs of one optimizer step over the global batch: XLA's count of the task's step
  on one device for `FLOPS_ROWS` rows (forward, backward and update), per row, times the
  global batch (module docstring). The step is traced and lowered, not compiled
  (`Trainer.trace_step`): XLA's count of the HLO before its passes, or its matmuls' where XLA
  counted fewer (`hetjax.train.program_flops`: a GPU's analysis misses them)."""
  rows = min(FLOPS_ROWS, config.data.global_batch)
  mesh = sharding.make_mesh((1, 1), devices=jax.local_devices()[:1])
  one = train.Trainer(task, optimizer_of(config)[0], rows, mesh,
                      train.Strategy.DATA_PARALLEL.rules(), config.data.seed)
  return train.program_flops(one.trace_step()) / rows * config.data.global_batch


def peak_flops(config: Config) -> tuple[float, str]:
  """``(peak FLOP/s of the job's devices, 'declared' | 'measured')``."""
  one, how = runtime.peak_flops(config.logging.peak_flops or None,
                                config.model.dtype or 'float32', jax.local_devices()[0])
  return one * jax.device_count(), how


def metrics_logger(config: Config, built: Built, workdir: pathlib.Path,
                   evaluation: train.Evaluation | None, launch: report.Launch,
                   launched_unix_s: float
                   ) -> tuple[train.MetricsLogger, report.TensorBoardWriter | None, dict]:
  """The chief's logger: ``metrics.jsonl`` with the learning rate and each evaluation on its
  step's line, tokens/s and MFU for a `hetjax.train.Task`, TensorBoard when configured, how
  and when this launch began (goodput's ``resume`` and ``restart``), and samples/s from the
  telemetry where there is any (the report's figure); and ``run.json``'s fields about them."""
  task = built.program.task
  # Every step's learning rate, computed once: an optax schedule is a JAX computation, which
  # evaluated per step would dispatch (and wait for) one more program every step.
  steps = config.optimizer.steps
  rates = np.broadcast_to(np.asarray(jax.vmap(optimizer_of(config)[1])(jnp.arange(steps)),
                                     np.float64), (steps,))
  writer = report.TensorBoardWriter(workdir / 'tensorboard') if config.logging.tensorboard \
      else None

  def extra(info: train.StepInfo) -> dict[str, Any]:
    fields: dict[str, Any] = {'learning_rate': float(rates[info.step - 1])}
    latest = None if evaluation is None else evaluation.latest
    if latest is not None and latest['step'] == info.step:
      fields |= {k: v for k, v in latest.items() if k != 'step'}
    return fields

  flops = peak = 0.0
  info: dict[str, Any] = {}
  lm = not trains_app(config)  # a SchMP app counts rounds, not examples
  if lm and config.logging.mfu:
    flops = flops_per_step(config, task)
    peak, how = peak_flops(config)
    info = {'flops_per_step': flops, 'peak_flops': peak, 'peak_flops_source': how}
  logger = train.MetricsLogger(
      workdir / 'metrics.jsonl', config.data.global_batch, config.optimizer.steps,
      every=config.logging.every, sinks=[writer.scalars] if writer else (), extra=extra,
      tokens_per_example=task.tokens_per_example if lm else 0, flops_per_step=flops,
      peak_flops=peak, launch=launch, launched_unix_s=launched_unix_s,
      telemetry=workdir / 'telemetry.jsonl' if built.measure_speed is not None else None)
  return logger, writer, info


def eval_hook(evaluation: train.Evaluation, program: Any, config: Config,
              timed: Callable[[train.Hook, str], train.Hook] | None) -> train.Hook:
  """The evaluation hook (every ``eval.every`` steps and after the last), timed into the
  logger's ``hooks_s`` on the chief."""
  hook = evaluation.hook(program, config.eval.every, config.optimizer.steps)
  return hook if timed is None else timed(hook, 'eval')
