"""The training state: step counter, parameters and optimizer state, as one pytree."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax

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

  def apply_gradients(self, optimizer: optax.GradientTransformation, grads: PyTree) -> TrainState:
    """One optimizer step with ``grads``: the next state (``step`` + 1).

    Example::

      state = state.apply_gradients(optax.sgd(0.1), grads)   # params - 0.1 * grads
    """
    updates, opt_state = optimizer.update(grads, self.opt_state, self.params)
    return TrainState(self.step + 1, optax.apply_updates(self.params, updates), opt_state)
