"""The training state: step counter, parameters and optimizer state, as one pytree."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax

from hetjax.train._trainable import merge_trainable, split_trainable

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """Everything that changes during training and is saved in a checkpoint.

  Attributes:
    step: number of optimizer steps taken (an int32 scalar array). It is also the data position:
      the next global batch is the one of this step.
    params: the model's state as a pure nested dict (``nnx.to_pure_dict``), all of it: its
      float parameters and any other state (a dropout stream's key and count), which is held
      fixed (`hetjax.train._trainable`); the model's structure lives in the trainer's
      `nnx.GraphDef`.
    opt_state: the optax state for ``params``'s float leaves (``split_trainable(params)[0]``:
      ``params`` itself for a model of float parameters only).
  """

  step: jax.Array
  params: PyTree
  opt_state: PyTree

  def apply_gradients(self, optimizer: optax.GradientTransformation, grads: PyTree) -> TrainState:
    """One optimizer step with ``grads``, the gradients of ``params``'s float leaves
    (`trainable_value_and_grad`'s): the next state (``step`` + 1), its other leaves unchanged.

    Example::

      state = state.apply_gradients(optax.sgd(0.1), grads)   # params - 0.1 * grads
    """
    trainable, fixed = split_trainable(self.params)
    updates, opt_state = optimizer.update(grads, self.opt_state, trainable)
    params = merge_trainable(optax.apply_updates(trainable, updates), fixed)
    return TrainState(self.step + 1, params, opt_state)
