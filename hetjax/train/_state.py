"""The training state: step counter, parameters and optimizer state, as one pytree."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """Everything that changes during training and is saved in a checkpoint.

  Attributes:
    step: number of optimizer steps taken (an int32 scalar array). It is also the data position:
      the next global batch is the one of this step.
    params: the model's parameters as a pure nested dict (``nnx.to_pure_dict``); the model's
      structure lives in the trainer's `nnx.GraphDef`.
    opt_state: the optax state for ``params``.
  """

  step: jax.Array
  params: PyTree
  opt_state: PyTree
