"""What the shipped language models share: their pipeline chain and their next-token loss.

A model of ``embed``, blocks and ``head`` (`hetjax.models.transformer`, `hetjax.models.gpt`)
is a chain whose first link reads ``batch['tokens'][:, :-1]`` and whose every other link maps
the carry to the next; its loss is the cross-entropy of ``tokens[:, 1:]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hetjax import data as hdata
from hetjax._errors import ConfigError
from hetjax.pipeline import Link
from hetjax.sharding import scope


class Decoder(nnx.Module):
  """What `hetjax.models.gpt.GPT` and `hetjax.models.llama.Llama` share: ``embed``, then
  ``blocks``, then ``head``, each under its sub-model's `hetjax.sharding.scope`; the sub-models
  in forward order for the planner and the chain for pipelines. A subclass sets ``embed``,
  ``blocks``, ``head``, ``tied`` (the head reads the embedding's table) and ``NAME``."""

  NAME = 'decoder'

  def __call__(self, tokens: jax.Array) -> jax.Array:
    with scope('embed'):
      x = self.embed(tokens)
    for i, block in enumerate(self.blocks):
      with scope(f'block_{i}'):
        x = block(x)
    with scope('head'):
      return self.head(x)

  def submodels(self) -> dict[str, nnx.Module]:
    """``embed``, ``block_0`` … ``block_{layers-1}``, ``head``, in forward order. Tied, the
    head's parameters include the token table (a pipeline's last stage would hold a copy)."""
    parts: dict[str, nnx.Module] = {'embed': self.embed}
    parts.update({f'block_{i}': block for i, block in enumerate(self.blocks)})
    parts['head'] = self.head
    return parts

  def chain(self) -> tuple[Link, ...]:
    """The `submodels` as a pipeline chain (`hetjax.pipeline.HasChain`): ``embed`` reads
    ``batch['tokens'][:, :-1]``, every block and the head map the carry ``x`` to the next.

    Raises:
      ConfigError: with tied embeddings: the first and last links would share the token table,
        and a pipeline's links own disjoint parameters.
    """
    if self.tied:
      raise ConfigError(f'{self.NAME} with tie_embeddings=true cannot be cut into pipeline '
                        'stages: the embed and head links share the token table (use '
                        'tie_embeddings=false)')
    return token_chain(self.submodels())

  def chain_loss(self, logits: jax.Array, batch: hdata.Batch) -> jax.Array:
    """`decoder_loss` from the head's logits: the last step of the chain (reads no
    parameters)."""
    return next_token_loss(logits, batch['tokens'])


def decoder_loss(model: nnx.Module, batch: hdata.Batch) -> jax.Array:
  """Next-token cross-entropy of every example, averaged over its ``seq_len`` positions."""
  tokens = batch['tokens']
  return next_token_loss(model(tokens[:, :-1]), tokens)


def token_chain(submodels: Mapping[str, nnx.Module]) -> tuple[Link, ...]:
  """``submodels`` (``embed`` first) as a pipeline chain (`hetjax.pipeline.HasChain`)."""
  return tuple(Link(name, module, _embed_link if name == 'embed' else _next_link)
               for name, module in submodels.items())


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """Cross-entropy of ``tokens[:, 1:]`` under ``logits`` (computed from ``tokens[:, :-1]``), in
  float32, averaged over positions: one value per example."""
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), tokens[:, 1:])
  return jnp.mean(losses, axis=-1)


def _embed_link(embed: nnx.Module, carry: None, batch: hdata.Batch) -> jax.Array:
  del carry  # the first link reads the batch
  return embed(batch['tokens'][:, :-1])


def _next_link(module: nnx.Module, x: jax.Array, batch: hdata.Batch) -> jax.Array:
  del batch
  return module(x)


def stdlib_splits(seq_len: int, held_out: float) -> tuple[hdata.StdlibText, hdata.StdlibText]:
  """The stdlib corpus cut so the last ``held_out`` fraction is held out: windows of the first
  part train, of the second evaluate."""
  corpus = hdata.stdlib_text(seq_len).corpus
  cut = len(corpus) - int(held_out * len(corpus))
  return hdata.StdlibText(corpus[:cut], seq_len), hdata.StdlibText(corpus[cut:], seq_len)


def token_splits(data: str | os.PathLike, seq_len: int, model: str):
  """The ``train`` and ``val`` splits of the token dataset directory ``data``."""
  read = getattr(hdata, 'read_token_dataset', None)
  if read is None:
    raise ConfigError(f'{model} data={os.fspath(data)!r} needs hetjax.data.read_token_dataset, '
                      'which this hetjax does not have')
  return read(data, split='train', seq_len=seq_len), read(data, split='val', seq_len=seq_len)
