"""A task: what the trainer needs to know about a model and its data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

from hetjax.data import Batch, DataSource
from hetjax.sharding import Weights


@runtime_checkable
class HasSubmodels(Protocol):
  """A model that names its parts, in forward order, for planners and profilers."""

  def submodels(self) -> dict[str, nnx.Module]:
    ...


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
  """A model factory, its per-example loss and its data source, under one name.

  Attributes:
    name: registry name of the model (``'mlp'``, ``'transformer'``, ``'wide_deep'``).
    make_model: builds the Flax NNX model from `nnx.Rngs`; parameters carry logical names via
      `nnx.with_partitioning` and nothing else about sharding.
    loss: ``loss(model, batch) -> float32[B]``, the loss of every example of ``batch``. The
      trainer averages it; keeping it per example lets later steps weight or mask rows.
    data: the source of global batches.
    eval_data: the held-out split (batches of the same form) that periodic evaluation reads, or
      None: evaluation is then off for this task.
    config: the keyword arguments that define the task; a checkpoint records them so a resume
      under another model is refused.
    tokens_per_example: positions one example trains (a language model's sequence length),
      for tokens/s; 0: not a sequence model (samples/s only).
    metrics: ``metrics(model, batch) -> {name: float32[B]}``: per-example metrics evaluation
      reports beside the loss (a classifier's ``accuracy``: 1.0 where the prediction is right),
      or None.
    weights: where a fresh run's parameters come from (`hetjax.sharding.Weights`: a pretrained
      checkpoint, ``model.init=hf:PATH``), read onto their shardings in every mode; None: drawn
      from the seed by ``make_model``. A resumed run restores its checkpoint instead.
  """

  name: str
  make_model: Callable[[nnx.Rngs], nnx.Module]
  loss: Callable[[nnx.Module, Batch], jax.Array]
  data: DataSource
  eval_data: DataSource | None = None
  config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  tokens_per_example: int = 0
  metrics: Callable[[nnx.Module, Batch], Mapping[str, jax.Array]] | None = None
  weights: Weights | None = None

  def eval_means(self, model: nnx.Module, batch: Batch) -> dict[str, jax.Array]:
    """``{'loss': mean loss, **mean of each of `metrics`}`` over ``batch``: what an
    evaluation of one held-out batch computes (`hetjax.core.StepProgram.evaluate`)."""
    means = {'loss': jnp.mean(self.loss(model, batch))}
    if self.metrics is not None:
      means |= {k: jnp.mean(v) for k, v in self.metrics(model, batch).items()}
    return means
