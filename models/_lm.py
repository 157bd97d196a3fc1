"""What the shipped language models share: their pipeline chain, their next-token loss and
their decoding with a key/value cache.

A model of ``embed``, blocks and ``head`` (`hetjax.models.transformer`, `hetjax.models.gpt`)
is a chain whose first link reads ``batch['tokens'][:, :-1]`` and whose every other link maps
the carry to the next; its loss is the cross-entropy of ``tokens[:, 1:]``. A `Decoder` (gpt,
llama) also runs a sequence piece by piece (`Decoder.decode`): each block's keys and values of
the positions so far are kept in a `KVCache` that the caller passes in and gets back, so the
training forward, the parameters and the checkpoints stay as they are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hetjax import data as hdata
from hetjax._errors import ConfigError
from hetjax.pipeline import Link
from hetjax.sharding import constrain, scope


class KVCache(NamedTuple):
  """One block's keys and values for decoding (`Decoder.decode`): ``k`` and ``v`` are
  ``[batch, max_len, kv_heads, head_dim]`` in the compute dtype, row ``t`` holding position
  ``t``'s (rotated) key and value once it has been decoded; rows past the decoded positions are
  zeros and masked out. A pytree of arrays, passed in and returned: no model state."""

  k: jax.Array
  v: jax.Array


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, cache: KVCache,
                     pos: jax.Array | int) -> tuple[jax.Array, KVCache]:
  """Causal attention of ``T`` new positions ``pos … pos + T - 1`` over a cache.

  ``k`` and ``v`` (``[B, T, kv_heads, head_dim]``) are written into ``cache`` at rows ``pos``
  onwards; then ``q`` (``[B, T, heads, head_dim]``, ``heads`` a multiple of ``kv_heads``) attends
  over all ``max_len`` rows, row ``s`` masked unless ``s <= pos + i`` for query ``i``: the shapes
  never depend on ``pos``, so one compiled step serves every position. XLA's kernel (a mask).

  Returns:
    The mixed values ``[B, T, heads, head_dim]`` and the updated cache.
  """
  start = (0, pos, 0, 0)
  cache = KVCache(jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), start),
                  jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), start))
  rows = jnp.arange(cache.k.shape[1])
  mask = rows[None, :] <= pos + jnp.arange(q.shape[1])[:, None]  # [T, max_len]
  mixed = jax.nn.dot_product_attention(q, cache.k, cache.v, mask=mask[None, None],
                                       implementation='xla')
  return mixed, cache


#: The logical names of the query heads' activations ``[batch, seq, heads, head_dim]``.
HEADS = ('batch', 'seq', 'heads', 'head_dim')
#: The logical names of the residual stream ``[batch, seq, d_model]``.
RESIDUAL = ('batch', 'seq', 'embed')


class CausalAttention(nnx.Module):
  """What gpt's and llama's attention share: causal attention of the projections a subclass
  makes (``_qkv(x, pos) -> (q, k, v)``, positions from ``pos``), then the output projection
  ``out`` (``[heads, head_dim, d_model]``) in ``dtype``; over the whole sequence with the
  ``implementation`` kernel (`__call__`), or piece by piece over a `KVCache` (`decode`)."""

  def __call__(self, x: jax.Array) -> jax.Array:
    q, k, v = self._qkv(x, 0)
    mixed = constrain(jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation=self.implementation), HEADS)
    return jnp.einsum('bqhd,hde->bqe', mixed, self.out[...].astype(self.dtype))

  def decode(self, x: jax.Array, cache: KVCache,
             pos: jax.Array | int) -> tuple[jax.Array, KVCache]:
    """`__call__` for positions ``pos …`` over the earlier positions' keys and values in
    ``cache`` (`cached_attention`): ``(output, updated cache)``."""
    q, k, v = self._qkv(x, pos)
    mixed, cache = cached_attention(q, k, v, cache, pos)
    return jnp.einsum('bqhd,hde->bqe', mixed, self.out[...].astype(self.dtype)), cache

  def _qkv(self, x: jax.Array, pos: jax.Array | int) -> tuple[jax.Array, jax.Array, jax.Array]:
    raise NotImplementedError


class DecoderBlock(nnx.Module):
  """What gpt's and llama's blocks share: ``x + attn(attn_norm(x))``, then the subclass's
  ``_mlp`` (its own residual), rematerialised as ``remat`` (a `hetjax.models.gpt.Remat`) says;
  `decode` runs the same over a `KVCache`."""

  def __call__(self, x: jax.Array) -> jax.Array:
    if self.remat.value == 'none':  # Remat.NONE (hetjax.models.gpt's, which imports this module)
      return self.forward(x)
    return nnx.remat(DecoderBlock.forward, policy=self.remat.policy())(self, x)

  def forward(self, x: jax.Array) -> jax.Array:
    return self._mlp(constrain(x + self.attn(self.attn_norm(x)), RESIDUAL))

  def decode(self, x: jax.Array, cache: KVCache,
             pos: jax.Array | int) -> tuple[jax.Array, KVCache]:
    """`forward` for positions ``pos …`` with a key/value cache (`CausalAttention.decode`)."""
    mixed, cache = self.attn.decode(self.attn_norm(x), cache, pos)
    return self._mlp(constrain(x + mixed, RESIDUAL)), cache

  def _mlp(self, x: jax.Array) -> jax.Array:
    raise NotImplementedError


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

  @property
  def max_positions(self) -> int | None:
    """The longest sequence the model can place: a learned position table's length, or None
    when positions are rotary (any length runs; quality past the trained ``seq_len`` is
    another matter)."""
    return self.embed.max_positions

  @property
  def vocab_size(self) -> int:
    """Token ids lie in ``[0, vocab_size)``: the rows of the embedding's token table."""
    return self.embed.tokens.shape[0]

  def init_cache(self, batch: int, max_len: int) -> tuple[KVCache, ...]:
    """An empty cache for `decode`: one zero `KVCache` per block, ``[batch, max_len, kv_heads,
    head_dim]`` in the block's compute dtype (the shape of its ``attn.key`` weight, ``[d_model,
    kv_heads, head_dim]``)."""
    def empty(attn: nnx.Module) -> KVCache:
      _, heads, head_dim = attn.key[...].shape
      zeros = jnp.zeros((batch, max_len, heads, head_dim), attn.dtype)
      return KVCache(zeros, zeros)

    return tuple(empty(block.attn) for block in self.blocks)

  def decode(self, tokens: jax.Array, cache: tuple[KVCache, ...],
             pos: jax.Array | int) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """The forward of ``tokens`` at positions ``pos … pos + T - 1`` given the keys and values of
    positions ``< pos`` in ``cache``: ``(logits, cache)`` with ``logits`` equal to the last
    ``T`` positions' of ``model(whole_sequence)`` and this call's keys and values written in.

    Example (prefill a prompt, then one token at a time)::

      cache = model.init_cache(batch=1, max_len=64)
      logits, cache = model.decode(prompt, cache, 0)          # prompt: int[1, 10]
      logits, cache = model.decode(next_token, cache, 10)     # next_token: int[1, 1]

    Args:
      tokens: ``int[B, T]``.
      cache: `init_cache`'s, or the one the previous call returned.
      pos: the absolute position of ``tokens[:, 0]`` (an int or int32 scalar, traced under
        ``jax.jit``); ``pos + T`` must not exceed the cache's ``max_len``.

    Returns:
      ``float32[B, T, vocab_size]`` logits and the updated cache.
    """
    with scope('embed'):
      x = self.embed.decode(tokens, pos)
    written = []
    for i, (block, layer) in enumerate(zip(self.blocks, cache, strict=True)):
      with scope(f'block_{i}'):
        x, layer = block.decode(x, layer, pos)
      written.append(layer)
    with scope('head'):
      return self.head(x), tuple(written)

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
