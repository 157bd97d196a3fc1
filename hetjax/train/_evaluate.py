"""Periodic evaluation on a held-out split: a hook of the one loop, for any `StepProgram`.

Each evaluation reads the same ``batches`` held-out batches (batches 0 … n−1 of the task's
``eval_data`` under the run's seed), asks the program for each one's mean loss
(`hetjax.core.StepProgram.evaluate`: a forward pass under the current parameters, wherever they
live), and reports their mean with its perplexity::

  evaluation = Evaluation(task.eval_data, seed=0, batch=64, batches=4)
  hook = evaluation.hook(program, every=50, until=200)    # and after the last step
  ...
  evaluation.latest   # {'step': 100, 'eval_loss': 2.31, 'eval_perplexity': 10.07}

A task's ``metrics`` (`hetjax.train.Task.metrics`, e.g. a classifier's accuracy) come as
``eval_NAME`` beside them, from every program that holds the model's outputs (pipeline stages
report the loss alone).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from hetjax._checks import at_least
from hetjax.core import StepProgram
from hetjax.data import Batch, DataSource
from hetjax.train._loop import Hook, StepInfo


@dataclasses.dataclass(eq=False)
class Evaluation:
  """Evaluation of a program's parameters on ``batches`` fixed held-out batches.

  Attributes:
    source: the held-out split (`hetjax.train.Task.eval_data`).
    seed: the run's seed (the batches are the source's batches 0 … ``batches``−1 under it).
    batch: rows of each batch.
    batches: batches averaged per evaluation.
    on_result: called with each evaluation's record (``step``, ``eval_loss``,
      ``eval_perplexity``) on the processes that get the value.
    latest: the last record, or None before the first.
  """

  source: DataSource
  seed: int
  batch: int
  batches: int = 4
  on_result: Callable[[dict[str, Any]], None] | None = None
  latest: dict[str, Any] | None = None

  def __post_init__(self):
    at_least(self.batch, 1, 'eval.batch')
    at_least(self.batches, 1, 'eval.batches')

  @functools.cached_property
  def host_batches(self) -> list[Batch]:
    """The held-out batches, read once."""
    return [self.source.global_batch(self.seed, i, self.batch) for i in range(self.batches)]

  def run(self, program: StepProgram, state: Any, step: int) -> dict[str, Any] | None:
    """One evaluation of ``state`` (every process calls it); its record (``eval_loss``,
    ``eval_perplexity`` and ``eval_NAME`` for each of the task's metrics), or None on a
    process that does not get the value."""
    found = [program.evaluate(state, b) for b in self.host_batches]
    if any(f is None for f in found):
      return None
    means = {k: sum(f[k] for f in found) / len(found) for k in found[0]}
    loss = means.pop('loss')
    record = {'step': step, 'eval_loss': loss,
              'eval_perplexity': math.exp(loss) if loss < 700 else math.inf,
              **{f'eval_{k}': v for k, v in means.items()}}
    self.latest = record
    if self.on_result is not None:
      self.on_result(record)
    return record

  def hook(self, program: StepProgram, every: int, until: int) -> Hook:
    """A loop hook evaluating every ``every`` steps (0: only after the last, ``until``)."""
    def evaluate(info: StepInfo) -> None:
      if (every and info.step % every == 0) or info.step == until:
        self.run(program, info.state, info.step)
    return Hook(evaluate)
