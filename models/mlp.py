"""MLP classifier on scikit-learn's bundled digits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hetjax import data as hdata
from hetjax.pipeline import Link
from hetjax.sharding import constrain, scope
from hetjax.train import Task

_init = nnx.initializers.lecun_normal()


def _dense(din: int, dout: int, names: tuple[str, str], rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(
      din, dout, rngs=rngs,
      kernel_init=nnx.with_partitioning(_init, names),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (names[1],)))


class MLP(nnx.Module):
  """``features → hidden (relu) → width (relu) → classes``.

  Logical axes: the input and the ``width`` layer are ``'embed'``, the hidden layer ``'mlp'`` (the
  Megatron pattern: the first matrix splits its columns, the second its rows), the output
  ``'classes'``.
  """

  def __init__(self, features: int, hidden: int, width: int, classes: int, *, rngs: nnx.Rngs):
    self.up = _dense(features, hidden, ('embed', 'mlp'), rngs)
    self.down = _dense(hidden, width, ('mlp', 'embed'), rngs)
    self.head = _dense(width, classes, ('embed', 'classes'), rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    with scope('up'):
      h = _up(self.up, x)
    with scope('down'):
      h = _down(self.down, h)
    with scope('head'):
      return self.head(h)

  def submodels(self) -> dict[str, nnx.Module]:
    return {'up': self.up, 'down': self.down, 'head': self.head}

  def chain(self) -> tuple[Link, ...]:
    """``up`` (reads ``batch['x']``), ``down``, ``head`` as a pipeline chain
    (`hetjax.pipeline.HasChain`); the carry is the hidden activation, then the logits."""
    return (Link('up', self.up, lambda layer, _, batch: _up(layer, batch['x'])),
            Link('down', self.down, lambda layer, h, _: _down(layer, h)),
            Link('head', self.head, lambda layer, h, _: layer(h)))

  def chain_loss(self, logits: jax.Array, batch: hdata.Batch) -> jax.Array:
    """`loss` from the head's logits (reads no parameters)."""
    return _cross_entropy(logits, batch)


def _up(layer: nnx.Linear, x: jax.Array) -> jax.Array:
  return constrain(jax.nn.relu(layer(x)), ('batch', 'mlp'))


def _down(layer: nnx.Linear, h: jax.Array) -> jax.Array:
  return constrain(jax.nn.relu(layer(h)), ('batch', 'embed'))


def _cross_entropy(logits: jax.Array, batch: hdata.Batch) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])


def loss(model: MLP, batch: hdata.Batch) -> jax.Array:
  """Softmax cross-entropy of every example."""
  return _cross_entropy(model(batch['x']), batch)


def accuracy(model: MLP, batch: hdata.Batch) -> jax.Array:
  return jnp.mean(correct(model, batch)['accuracy'])


def correct(model: MLP, batch: hdata.Batch) -> dict[str, jax.Array]:
  """``{'accuracy': 1.0 where the predicted digit is right, else 0.0}``, per example."""
  return {'accuracy': (jnp.argmax(model(batch['x']), -1) == batch['y']).astype(jnp.float32)}


#: Rows of the digits held out for evaluation (the last ones: about 10%).
HELD_OUT = 180


def make_task(hidden: int = 256, width: int = 128) -> Task:
  """The digits classifier, trained on the first 1,617 of the 1,797 digits and evaluated
  (loss and accuracy) on the last `HELD_OUT`. ``hidden`` and ``width`` should be multiples of
  the device count for the tensor-parallel and FSDP strategies to divide them."""
  digits = hdata.digits()
  features = digits.arrays['x'].shape[1]
  source = hdata.ArraySource({k: a[:-HELD_OUT] for k, a in digits.arrays.items()})
  held_out = hdata.ArraySource({k: a[-HELD_OUT:] for k, a in digits.arrays.items()})

  def make_model(rngs: nnx.Rngs) -> MLP:
    return MLP(features, hidden, width, classes=10, rngs=rngs)

  return Task('mlp', make_model, loss, source, config={'hidden': hidden, 'width': width},
              eval_data=held_out, metrics=correct)
