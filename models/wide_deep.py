"""Wide & deep click-through model (Cheng et al., 2016) on Zipf-distributed synthetic clicks."""

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
_zeros = nnx.initializers.zeros_init()


def _dense(din: int, dout: int, names: tuple[str | None, str | None], rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(
      din, dout, rngs=rngs,
      kernel_init=nnx.with_partitioning(_init, names),
      bias_init=nnx.with_partitioning(_zeros, (names[1],)))


class Embedding(nnx.Module):
  """One table of ``rows × dim`` shared by every field: ``int[B, F] → float[B, F, dim]``.

  The table is the large parameter of the model: its rows are ``'table'`` (split them to
  spread memory and lookups) and its columns ``'embed'``.
  """

  def __init__(self, rows: int, dim: int, *, rngs: nnx.Rngs):
    init = nnx.with_partitioning(nnx.initializers.normal(stddev=0.05), ('table', 'embed'))
    self.table = nnx.Param(init(rngs.params(), (rows, dim), jnp.float32))

  def __call__(self, ids: jax.Array) -> jax.Array:
    return constrain(jnp.take(self.table[...], ids, axis=0), ('batch', None, 'embed'))


class Wide(nnx.Module):
  """The memorising linear part: a scalar weight per id summed over fields, plus dense · w + b.

  Its id table is ``rows × 1`` named ``('table', None)`` so it is split like the embedding.
  """

  def __init__(self, rows: int, dense: int, *, rngs: nnx.Rngs):
    init = nnx.with_partitioning(_zeros, ('table', None))
    self.table = nnx.Param(init(rngs.params(), (rows, 1), jnp.float32))
    self.linear = _dense(dense, 1, (None, None), rngs)

  def __call__(self, ids: jax.Array, dense: jax.Array) -> jax.Array:
    ids_term = jnp.take(self.table[...], ids, axis=0).sum(axis=(1, 2))  # [B, F, 1] → [B]
    return ids_term + self.linear(dense)[:, 0]


class Tower(nnx.Module):
  """The generalising deep part: ``concat(embeddings, dense) → hidden → hidden2 → 1`` (relu).

  Megatron pattern: the first matrix splits its columns (``'mlp'``), the second its rows.
  """

  def __init__(self, din: int, hidden: int, hidden2: int, *, rngs: nnx.Rngs):
    self.up = _dense(din, hidden, (None, 'mlp'), rngs)
    self.down = _dense(hidden, hidden2, ('mlp', 'embed'), rngs)
    self.head = _dense(hidden2, 1, ('embed', None), rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    x = jnp.concatenate([emb.reshape(emb.shape[0], -1), dense], axis=-1)
    h = constrain(jax.nn.relu(self.up(x)), ('batch', 'mlp'))
    h = constrain(jax.nn.relu(self.down(h)), ('batch', 'embed'))
    return self.head(h)[:, 0]


class WideDeep(nnx.Module):
  """``logit = wide(ids, dense) + tower(embedding(ids), dense)``, float32[B].

  Example::

    model = WideDeep(rows=1000, dim=8, fields=4, dense=8, hidden=32, hidden2=16,
                     rngs=nnx.Rngs(0))
    logits = model(batch['ids'], batch['dense'])  # [B]
  """

  def __init__(
      self, rows: int, dim: int, fields: int, dense: int, hidden: int, hidden2: int, *,
      rngs: nnx.Rngs):
    self.embedding = Embedding(rows, dim, rngs=rngs)
    self.wide = Wide(rows, dense, rngs=rngs)
    self.tower = Tower(fields * dim + dense, hidden, hidden2, rngs=rngs)

  def __call__(self, ids: jax.Array, dense: jax.Array) -> jax.Array:
    with scope('embedding'):
      emb = self.embedding(ids)
    with scope('wide'):
      wide = self.wide(ids, dense)
    with scope('tower'):
      return wide + self.tower(emb, dense)

  def submodels(self) -> dict[str, nnx.Module]:
    return {'embedding': self.embedding, 'wide': self.wide, 'tower': self.tower}

  def chain(self) -> tuple[Link, ...]:
    """The `submodels` as a chain (`hetjax.pipeline.HasChain`), so a plan can put them on
    different device groups: ``embedding`` looks up ``batch['ids']`` (carry ``{'emb'}``),
    ``wide`` adds its term (``{'emb', 'wide'}``), ``tower`` returns the logits. The wide part
    does not depend on the embedding; it rides in the carry to the tower's stage."""
    return (Link('embedding', self.embedding, _embedding_link),
            Link('wide', self.wide, _wide_link),
            Link('tower', self.tower, _tower_link))

  def chain_loss(self, logits: jax.Array, batch: hdata.Batch) -> jax.Array:
    """`loss` from the tower's logits (reads no parameters)."""
    return optax.sigmoid_binary_cross_entropy(logits, batch['label'])


def _embedding_link(embedding: Embedding, carry: None, batch: hdata.Batch) -> dict:
  del carry  # the first link reads the batch
  return {'emb': embedding(batch['ids'])}


def _wide_link(wide: Wide, carry: dict, batch: hdata.Batch) -> dict:
  return {'emb': carry['emb'], 'wide': wide(batch['ids'], batch['dense'])}


def _tower_link(tower: Tower, carry: dict, batch: hdata.Batch) -> jax.Array:
  return carry['wide'] + tower(carry['emb'], batch['dense'])


def loss(model: WideDeep, batch: hdata.Batch) -> jax.Array:
  """Sigmoid binary cross-entropy of every example, float32[B]."""
  logits = model(batch['ids'], batch['dense'])
  return optax.sigmoid_binary_cross_entropy(logits, batch['label'])


def make_task(
    rows: int = 100_000, dim: int = 64, fields: int = 4, dense: int = 8, hidden: int = 256,
    hidden2: int = 128, exponent: float = 1.1) -> Task:
  """Wide & deep on `zipf_clicks`. ``rows``, ``dim``, ``hidden`` and ``hidden2`` should be
  multiples of the device count for row-sharded tables and tensor-parallel towers to divide."""
  config = {'rows': rows, 'dim': dim, 'fields': fields, 'dense': dense, 'hidden': hidden,
            'hidden2': hidden2, 'exponent': exponent}

  def make_model(rngs: nnx.Rngs) -> WideDeep:
    return WideDeep(rows, dim, fields, dense, hidden, hidden2, rngs=rngs)

  return Task('wide_deep', make_model, loss, hdata.zipf_clicks(rows, fields, dense, exponent),
              config=config)
