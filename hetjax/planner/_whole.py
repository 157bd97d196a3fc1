"""The whole model as one part: how the planner plans a model that lists no ``submodels()``.

A model that names its parts (`hetjax.train.HasSubmodels`) gets a layout and a group of workers
per part. One that does not still has a layout to choose: data parallel, FSDP, tensor parallel
or a hybrid of them, on every worker or on the fastest ones. The planner then treats the whole
model as one part named `WHOLE_MODEL`, ``'model'``: it is profiled as the task's loss, compiled
forward and backward (`WholeModel`), priced and searched like any sub-model (a chain of one, so
nothing is resharded between parts), and written in a plan as ``{"model": {...}}``. A plan whose
one part is ``'model'`` lays out every parameter and activation of the model
(`hetjax.planner.Plan.rules`), wherever it sits in the model's tree.

Trained on every device of one process, the plan is one SPMD step. On a group of the workers, or
across processes, it is one pipeline stage on the group's devices: `whole_model_task` gives the
pipeline a chain of one link, the whole loss, so the stage's programs are the model's forward,
backward and update, and a worker outside the group has nothing to run.

Example::

  task = hetjax.train.Task('mine', make_model, loss, data)   # a model without submodels()
  profiles = planner.profile_submodels(task)                   # one profile, named 'model'
  plan = planner.search(profiles, cluster, batch=64)          # its best layout and group
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from hetjax.pipeline import Link
from hetjax.train import Task

#: The name of the one part of a model that lists no ``submodels()``.
WHOLE_MODEL = 'model'


class WholeModel(nnx.Module):
  """A model and its task's loss as one module: called on a batch, it returns the per-example
  losses, so its forward + backward is the training step's (what the planner profiles and
  compiles for the whole model). As a pipeline chain it is one link, `WHOLE_MODEL`, whose
  module is the model (its parameters keep their paths under ``model``).

  Example::

    whole = WholeModel(model, task.loss)
    whole(batch)            # float32[B], task.loss(model, batch)
    whole.chain()[0].name   # 'model'
  """

  def __init__(self, model: nnx.Module, loss):
    self.model = model
    self.loss = loss

  def __call__(self, batch: Any) -> jax.Array:
    return self.loss(self.model, batch)

  def chain(self) -> tuple[Link, ...]:
    loss = self.loss
    return (Link(WHOLE_MODEL, self.model, lambda model, _, batch: loss(model, batch)),)

  def chain_loss(self, carry: jax.Array, batch: Any) -> jax.Array:
    """The link's carry is already the per-example losses."""
    return carry


def whole_model_task(task: Task) -> Task:
  """``task`` with its model wrapped in `WholeModel`: a chain of one link that trains as one
  pipeline stage (`hetjax.pipeline.PipelineTrainer`), equal to the plain model's step. Its
  parameters are initialised from the same seed as ``task``'s (the wrapper draws nothing), or
  read from the same ``weights`` (their paths under ``model``)."""
  make_model, loss = task.make_model, task.loss
  metrics = task.metrics
  return dataclasses.replace(
      task, make_model=lambda rngs: WholeModel(make_model(rngs), loss),
      loss=lambda whole, batch: whole(batch),
      metrics=None if metrics is None else lambda whole, batch: metrics(whole.model, batch),
      weights=None if task.weights is None else _Unwrapped(task.weights))


@dataclasses.dataclass(frozen=True)
class _Unwrapped:
  """`hetjax.sharding.Weights` of the wrapped model, read at the wrapper's paths."""

  weights: Any

  def read(self, path: tuple[Any, ...]) -> Any:
    if not path or path[0] != WHOLE_MODEL:
      raise ValueError(f'{"/".join(map(str, path))} is not a path of the wrapped model')
    return self.weights.read(tuple(path[1:]))
