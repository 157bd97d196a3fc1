"""Collapsed Gibbs sampling for LDA, token by token, and the collapsed log-likelihood.

With θ and φ integrated out, a token of word w in document d takes topic k with probability

  p(z = k | rest) ∝ (n_dk + α) · (n_wk + β) / (n_k + V·β)

where the counts leave the token itself out (Griffiths & Steyvers 2004). `sweep` visits tokens
in a fixed order (a `lax.scan`, so no Python loop and one compile): it removes the token from
the counts, draws its topic by inverting the cumulative sum of those K weights at u · total
(u a uniform given from outside, so a plain numpy sweep fed the same uniforms is a reference),
and adds it back. Counts are int32 and exact; the weights are float32.

Example (one device, every word in one shard)::

  n_dk, n_wk, n_k, z = sweep(n_dk, n_wk[None], n_k, doc, jnp.zeros_like(doc), word, z, mask,
                             token_uniforms(key, 0, len(doc)), alpha=0.1, beta=0.01, words=V)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import gammaln


def token_uniforms(key: jax.Array, device: jax.Array | int, n: int) -> jax.Array:
  """float32[n], the uniforms device ``device`` uses for its ``n`` token slots in a round with
  ``key`` (slot i's topic is drawn with the i-th; padded slots draw and ignore theirs)."""
  return jax.random.uniform(jax.random.fold_in(key, device), (n,), jnp.float32)


def sweep(n_dk: jax.Array, n_wk: jax.Array, n_k: jax.Array, doc: jax.Array, shard: jax.Array,
          row: jax.Array, topic: jax.Array, mask: jax.Array, uniforms: jax.Array, *,
          alpha: float, beta: float, words: int
          ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Resamples each token's topic in order against the counts, updating them as it goes.

  Args:
    n_dk: int32[D, K], document-topic counts of the documents ``doc`` indexes.
    n_wk: int32[S, R, K], word-topic counts of S shards of R words.
    n_k: int32[K], topic totals (this device's view).
    doc, shard, row, topic: int32[T], each token's document, shard, row in its shard and topic.
    mask: bool[T], which tokens are real (the others change nothing).
    uniforms: float32[T], one per token.
    alpha, beta: the Dirichlet priors; words: V, the vocabulary size (for V·β).

  Returns:
    ``(n_dk, n_wk, n_k, topic)`` after the sweep.
  """
  k_count = n_k.shape[0]
  v_beta = words * beta

  def step(counts, token):
    ndk, nwk, nk = counts
    d, s, r, old, real, u = token
    minus = jnp.where(real, jax.nn.one_hot(old, k_count, dtype=jnp.int32), 0)
    in_doc, in_word, total = ndk[d] - minus, nwk[s, r] - minus, nk - minus
    weight = (in_doc + alpha) * (in_word + beta) / (total + v_beta)
    cdf = jnp.cumsum(weight)
    new = jnp.minimum(jnp.sum(cdf <= u * cdf[-1]), k_count - 1).astype(jnp.int32)
    new = jnp.where(real, new, old)
    plus = jnp.where(real, jax.nn.one_hot(new, k_count, dtype=jnp.int32), 0)
    return (ndk.at[d].set(in_doc + plus), nwk.at[s, r].set(in_word + plus), total + plus), new

  (n_dk, n_wk, n_k), topic = lax.scan(step, (n_dk, n_wk, n_k),
                                      (doc, shard, row, topic, mask, uniforms))
  return n_dk, n_wk, n_k, topic


def log_joint_parts(n_dk: jax.Array, n_wk: jax.Array, n_k: jax.Array, *, alpha: float,
                    beta: float, words: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The collapsed log p(w, z) in three sums, each over the counts it is given:

    log p(z)     = Σ_d [lgΓ(Kα) − lgΓ(n_d + Kα) + Σ_k (lgΓ(n_dk + α) − lgΓ(α))]
    log p(w | z) = Σ_k [lgΓ(Vβ) − lgΓ(n_k + Vβ)] + Σ_k Σ_w (lgΓ(n_wk + β) − lgΓ(β))

  returned as ``(document part, word part, topic part)``: the first two add up over devices
  (documents and shards are split), the last is whole on each device. A padded document or
  word (all counts 0) adds exactly 0.
  """
  k_count = n_k.shape[0]
  n_dk, n_wk, n_k = (x.astype(jnp.float32) for x in (n_dk, n_wk, n_k))
  n_d = n_dk.sum(1)
  docs = (gammaln(k_count * alpha) - gammaln(n_d + k_count * alpha)).sum() + (
      gammaln(n_dk + alpha) - gammaln(alpha)).sum()
  word = (gammaln(n_wk + beta) - gammaln(beta)).sum()
  topic = (gammaln(words * beta) - gammaln(n_k + words * beta)).sum()
  return docs, word, topic
