"""SchMP-LDA: collapsed Gibbs sampling with vocabulary shards rotating over the devices.

STRADS's static schedule for LDA (ALGORITHMS.md, "STRADS / SchMP"). Documents are split over P
devices: a device's document-topic counts n_dk and its tokens' topics z never leave it. The
vocabulary is split into P shards (`TokenLayout`), and the word-topic counts n_wk of a shard
live on one device at a time. In round t (a sub-round of the rotation, offset s = t mod P)
device p holds shard (p + s) mod P and samples, one after another (`sweep`), every one of its
tokens whose word is in that shard, against its own n_dk, the shard's n_wk — which no other
device touches this round — and its copy of the topic totals n_k. Then every shard moves one
device down the ring (`lax.ppermute`, device p → p − 1), so device p holds shard
(p + s + 1) mod P for round t + 1: every device meets every shard once per P rounds (a sweep of
the corpus), and no two devices ever hold the same shard.

The topic totals n_k are the one count every token touches. Each device keeps a copy, changes
it as it samples, and at the end of the round the copies are made equal again with one psum of
the round's changes: a device sees the other devices' changes to n_k one round late (bounded
staleness of one round, on n_k only; n_dk and n_wk are always exact).

The baseline, ``scheduler='unscheduled'`` (unscheduled parallel Gibbs, as YahooLDA / AD-LDA):
every device holds the whole n_wk table, samples all its tokens each round (a sweep) against
its own copy — stale for the other devices' changes since the sweep began — and the copies are
merged after the sweep (a psum of each device's changes to n_wk and n_k). A SchMP round is 1/P
of a sweep, an unscheduled round a whole one; compare them by time or by sweeps.

The stronger baseline, ``scheduler='unscheduled-rounds'``, syncs as often as SchMP does: round
c samples the c-th of P equal runs of slots of each of the device's shard groups (so 1/P of its
tokens, words from the whole vocabulary, as a random 1/P would be) against its copy of the
whole table, and the copies are merged after every round. Its copies are stale by 1/P of a
sweep, not a whole one; what it still lacks is the schedule: two devices may sample the same
word in one round, where SchMP's shards never meet.

The objective is the negative collapsed log-likelihood per token, −log p(w, z) / N, summed over
the devices with psums (lower is better).

Example::

  app = make_lda(topics=16, devices=4)            # 256 documents of stdlib docstrings
  program = SchmpProgram(app, app.default_schedule_size(4), jax.devices()[:4])
  for info in training_steps(program, program.init_state(), 40, policy=app.policy(4, 0)):
    print(info.step, float(info.stats.loss))       # -log p(w, z) per token, falling
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from hetjax._errors import ConfigError, parse_choice
from hetjax.data import Documents, is_data_path, read_documents, stdlib_docstrings
from hetjax.schmp._lda_gibbs import log_joint_parts, sweep, token_uniforms
from hetjax.schmp._lda_layout import TokenLayout, layout
from hetjax.schmp._static import StaticRotation


class LdaScheduler(enum.Enum):
  """How the rounds share the word-topic counts (module docstring)."""

  SCHMP = 'schmp'              # vocabulary shards rotate; each row has one owner at a time
  UNSCHEDULED = 'unscheduled'  # every device samples everything against stale copies
  UNSCHEDULED_ROUNDS = 'unscheduled-rounds'  # 1/P of every device's tokens, merged each round


@dataclasses.dataclass(frozen=True, eq=False)
class Lda:
  """LDA on a corpus laid out over ``layout.devices`` devices (module docstring).

  Parameters (per device): ``n_dk`` int32[D_max, K] its documents' counts; ``n_wk``
  int32[1, R, K] the shard it holds (SchMP) or int32[P, R, K] the whole table (unscheduled);
  ``n_k`` int32[K]; ``z`` int32[1, P, L] its tokens' topics; ``rotation`` (replicated) the
  shift the shards have moved by: device p holds shard (p + rotation) mod P.
  """

  corpus: Documents
  layout: TokenLayout
  topics: int
  alpha: float
  beta: float
  scheduler: str
  config: dict
  name: str = 'lda'

  @property
  def devices(self) -> int:
    return self.layout.devices

  @property
  def blocks(self) -> int:
    """SchMP: the vocabulary shards (one per device); unscheduled-rounds: the P chunks of a
    device's tokens; unscheduled: one, the whole table."""
    return 1 if self.scheduler == LdaScheduler.UNSCHEDULED.value else self.devices

  @property
  def _schmp(self) -> bool:
    return self.scheduler == LdaScheduler.SCHMP.value

  # -- what the executor asks ---------------------------------------------------------------

  def policy(self, schedule_size: int, seed: int) -> StaticRotation:
    del seed  # the rotation is fixed before running
    if schedule_size != self.blocks:
      raise ConfigError(f'app lda ({self.scheduler}) rounds have {self.blocks} slots, one per '
                        f'block; got a schedule size of {schedule_size}')
    return StaticRotation(self.blocks)

  def default_schedule_size(self, devices: int) -> int:
    self._check_devices(devices)
    return self.blocks

  def reference_objective(self) -> float | None:
    return None

  def host_data(self, shards: int) -> dict[str, np.ndarray]:
    self._check_devices(shards)
    lay = self.layout
    return {'doc': lay.doc, 'row': lay.row, 'mask': lay.mask, 'topic': lay.topic,
            'length': lay.length}

  def param_specs(self, axis: str) -> dict[str, PartitionSpec]:
    table = PartitionSpec(axis) if self._schmp else PartitionSpec()
    return {'n_dk': PartitionSpec(axis), 'n_wk': table, 'n_k': PartitionSpec(),
            'z': PartitionSpec(axis), 'rotation': PartitionSpec()}

  def init_params(self, data: dict[str, jax.Array], axis: str) -> dict[str, jax.Array]:
    p_count, k_count = self.devices, self.topics
    z, doc, row, real = data['topic'][0], data['doc'][0], data['row'][0], data['mask'][0]
    ones = real.astype(jnp.int32)
    n_dk = jnp.zeros((data['length'].shape[1], k_count), jnp.int32).at[doc, z].add(ones)
    shard = jnp.broadcast_to(jnp.arange(p_count)[:, None], z.shape)
    mine = jnp.zeros((p_count, self.layout.rows, k_count), jnp.int32).at[shard, row, z].add(ones)
    # SchMP: device p starts with shard p (rotation 0); unscheduled: everyone has everything.
    n_wk = (lax.psum_scatter(mine, axis, scatter_dimension=0, tiled=True) if self._schmp
            else lax.psum(mine, axis))
    return {'n_dk': n_dk, 'n_wk': n_wk, 'n_k': lax.psum(mine.sum((0, 1)), axis), 'z': z[None],
            'rotation': jnp.zeros((), jnp.int32)}

  def round(self, params, shard, blocks, mask, offset, key, axis):
    if blocks.shape[0] != self.blocks:
      raise ConfigError(f'app lda ({self.scheduler}) rounds have {self.blocks} slots; got a '
                        f'schedule of {blocks.shape[0]}')
    if self._schmp:
      params, changed = self._rotation_round(params, shard, offset, key, axis)
    elif self.scheduler == LdaScheduler.UNSCHEDULED_ROUNDS.value:
      params, changed = self._unscheduled_round(params, shard, key, axis, chunk=offset)
    else:
      params, changed = self._unscheduled_round(params, shard, key, axis)
    return params, jnp.where(mask, changed[blocks], 0.0)

  def objective(self, params, shard, axis):
    del shard
    docs, word, topic = log_joint_parts(params['n_dk'], params['n_wk'], params['n_k'],
                                        alpha=self.alpha, beta=self.beta, words=self._words)
    word = lax.psum(word, axis) if self._schmp else word  # shards are split, copies are not
    return -(lax.psum(docs, axis) + word + topic) / self.corpus.num_tokens

  # -- rounds -------------------------------------------------------------------------------

  @property
  def _words(self) -> int:
    return len(self.corpus.vocabulary)

  def _sample(self, n_dk, n_wk, n_k, doc, shard, row, z, real, key, axis):
    # The replicated counts become this device's own copy (the scan's carry must vary).
    n_k = lax.pcast(n_k, axis, to='varying')
    n_wk = n_wk if self._schmp else lax.pcast(n_wk, axis, to='varying')
    device = lax.axis_index(axis)
    return sweep(n_dk, n_wk, n_k, doc, shard, row, z, real,
                 token_uniforms(key, device, doc.shape[0]), alpha=self.alpha, beta=self.beta,
                 words=self._words)

  def _rotation_round(self, params, data, offset, key, axis):
    """Device p samples its tokens of shard (p + offset) mod P, then passes the shard on."""
    p_count, me = self.devices, lax.axis_index(axis)
    # Normally the shard to work on is already here (rotation == offset); a schedule that
    # jumps (a resumed run, another rotation) has it fetched first, so counts stay exact.
    n_wk = lax.switch((offset - params['rotation']) % p_count,
                      [lambda t, k=k: _shift(t, k, axis, p_count) for k in range(p_count)],
                      params['n_wk'])
    j = (me + offset) % p_count

    def take(a):
      return lax.dynamic_index_in_dim(a[0], j, keepdims=False)

    before = take(params['z'])
    n_dk, n_wk, n_k, after = self._sample(
        params['n_dk'], n_wk, params['n_k'], take(data['doc']), jnp.zeros_like(before),
        take(data['row']), before, take(data['mask']), key, axis)
    z = lax.dynamic_update_index_in_dim(params['z'], after[None], j, axis=1)
    changed = jax.nn.one_hot(j, p_count) * jnp.sum(after != before)
    return {'n_dk': n_dk, 'n_wk': _shift(n_wk, 1, axis, p_count),
            'n_k': params['n_k'] + lax.psum(n_k - params['n_k'], axis), 'z': z,
            'rotation': ((offset + 1) % p_count).astype(jnp.int32)}, lax.psum(changed, axis)

  def _unscheduled_round(self, params, data, key, axis, chunk=None):
    """The device's tokens (every one, or with ``chunk`` = c the c-th of P runs of slots of
    every shard's group: words of the whole vocabulary) against its copy of the whole table;
    copies merged after."""
    p_count, slots = self.devices, self.layout.slots
    width = slots if chunk is None else -(-slots // p_count)
    picked = (jnp.arange(slots) if chunk is None else chunk * width + jnp.arange(width))

    def take(a):  # [P shards, width] slots of a [1, P, L] array, flat
      a = a[0] if chunk is None else jnp.take(a[0], picked, axis=1, mode='clip')
      return a.reshape(-1)

    real = take(data['mask']) & jnp.tile(picked < slots, p_count)
    before = take(params['z'])
    shard = jnp.repeat(jnp.arange(p_count), width)
    n_dk, n_wk, n_k, after = self._sample(
        params['n_dk'], params['n_wk'], params['n_k'], take(data['doc']), shard,
        take(data['row']), before, real, key, axis)
    merged = {name: params[name] + lax.psum(mine - params[name], axis)
              for name, mine in (('n_wk', n_wk), ('n_k', n_k))}
    count = lax.psum(jnp.sum(after != before), axis).astype(jnp.float32)
    changed = count[None] if chunk is None else jax.nn.one_hot(chunk, p_count) * count
    z = params['z'][0].at[:, picked].set(after.reshape(p_count, width), mode='drop')[None]
    return {'n_dk': n_dk, **merged, 'z': z, 'rotation': params['rotation']}, changed

  def round_work(self, offset: int) -> np.ndarray:
    """int[P]: the tokens each device samples in a round of ``offset`` (its tokens of shard
    (p + offset) mod P; unscheduled-rounds: its chunk ``offset``; unscheduled: all of them)."""
    mask, p = self.layout.mask, np.arange(self.devices)
    if self._schmp:
      return mask[p, (p + offset) % self.devices].sum(-1)
    if self.scheduler == LdaScheduler.UNSCHEDULED_ROUNDS.value:
      width = -(-self.layout.slots // self.devices)
      return mask[:, :, offset * width:(offset + 1) * width].sum((1, 2))
    return mask.sum((1, 2))

  # -- checks and views ---------------------------------------------------------------------

  def _check_devices(self, devices: int) -> None:
    if devices != self.devices:
      raise ConfigError(f'app lda was made for {self.devices} devices (documents and vocabulary '
                        f'split {self.devices} ways), run on {devices}: make it with '
                        f'devices={devices}')

  def word_topic(self, params: dict[str, Any]) -> np.ndarray:
    """int[V, K], the word-topic counts on the host, by word id, wherever the shards are."""
    table = np.asarray(params['n_wk'])                  # [P, R, K]: row p on device p
    held = (np.arange(self.devices) + int(params['rotation'])) % self.devices  # 0: baseline
    by_shard = np.empty_like(table)
    by_shard[held] = table
    # word w = row · P + shard
    return by_shard.transpose(1, 0, 2).reshape(-1, self.topics)[:self._words]


def _shift(table: jax.Array, k: int, axis: str, p_count: int) -> jax.Array:
  """Each device's ``table`` moved ``k`` devices down the ring (device p gets p + k's)."""
  if k % p_count == 0:
    return table
  return lax.ppermute(table, axis, [(q, (q - k) % p_count) for q in range(p_count)])


def make_lda(scheduler: str = 'schmp', *, topics: int = 16, alpha: float = 0.1,
             beta: float = 0.01, devices: int | None = None,
             doc_shares: Sequence[int] | None = None, data: str = 'stdlib',
             documents: int | None = 256, vocabulary: int = 1000, seed: int = 0) -> Lda:
  """LDA on ``documents`` stdlib docstring documents (`hetjax.data.stdlib_docstrings`) or on
  your own corpus.

  Args:
    scheduler: ``'schmp'`` (rotating vocabulary shards), ``'unscheduled'`` (the baseline,
      merged once a sweep) or ``'unscheduled-rounds'`` (merged every 1/P sweep).
    topics: K >= 2.
    alpha, beta: the symmetric Dirichlet priors on document-topic and topic-word (> 0).
    devices: P, the devices it runs on (default: ``len(doc_shares)``, else every device).
    doc_shares: documents per device (summing to the documents) so faster devices can get
      more; default an even split. Shapes stay equal: every device is padded to the largest
      share.
    data: ``'stdlib'`` (the standard library's docstrings) or the path of your own corpus: a
      document-term count matrix as ``.npy`` or ``.csv`` (a header names the words), or
      ``.npz`` with ``counts``, or with ``tokens`` and ``offsets`` (`hetjax.data.Documents`'
      form), and optionally ``vocabulary`` (`hetjax.data.read_documents`); with a file,
      ``documents`` and ``vocabulary`` keep their defaults (the shipped config names them).
    documents, vocabulary: the stdlib corpus's size (None documents: all 3,200;
      ``vocabulary`` is the most words kept).
    seed: which stdlib documents, and the initial topics.

  Raises:
    ConfigError: topics < 2, alpha or beta <= 0, an unknown scheduler or data, ``documents``
      or ``vocabulary`` with a file, a file that does not read as a corpus, documents that do
      not split (evenly, or as ``doc_shares`` says) over the devices.
  """
  kind = parse_choice(LdaScheduler, scheduler, 'lda scheduler')
  if isinstance(topics, bool) or not isinstance(topics, int) or topics < 2:
    raise ConfigError(f'lda needs topics >= 2, got {topics!r}')
  if not (alpha > 0 and beta > 0):
    raise ConfigError(f'lda needs alpha > 0 and beta > 0, got alpha={alpha}, beta={beta}')
  if devices is None:
    devices = len(doc_shares) if doc_shares is not None else jax.device_count()
  if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
    raise ConfigError(f'lda needs devices >= 1, got {devices!r}')
  corpus, source = _corpus(data, documents, vocabulary, seed)
  count = corpus.num_documents
  if doc_shares is None:
    if count % devices:
      even = [count // devices + (p < count % devices) for p in range(devices)]
      raise ConfigError(f'lda: {count} documents do not split evenly over {devices} devices; '
                        f'--set model_args.doc_shares=({",".join(map(str, even))}) gives '
                        'them unequal shares')
    doc_shares = (count // devices,) * devices
  doc_shares = tuple(int(n) for n in doc_shares)
  if len(doc_shares) != devices or min(doc_shares) < 0 or sum(doc_shares) != count:
    raise ConfigError(f'lda: doc_shares {list(doc_shares)} must be {devices} counts >= 0 that '
                      f'sum to the {count} documents')
  config = {'topics': topics, 'alpha': float(alpha), 'beta': float(beta), 'devices': devices,
            'doc_shares': list(doc_shares), **source, 'seed': seed}
  return Lda(corpus, layout(corpus, doc_shares, topics, seed), topics, float(alpha),
             float(beta), kind.value, config)


def _corpus(data: str, documents: int | None, vocabulary: int, seed: int
            ) -> tuple[Documents, dict[str, Any]]:
  """The corpus ``data`` names and how the config records it."""
  if not is_data_path(data):
    if data != 'stdlib':
      raise ConfigError(f"lda: unknown data {data!r}; choose stdlib, or a .npz, .csv or .npy "
                        'file')
    return (stdlib_docstrings(documents, vocabulary, seed),
            {'data': data, 'documents': documents, 'vocabulary': vocabulary})
  defaults = inspect.signature(make_lda).parameters
  given = [k for k, v in (('documents', documents), ('vocabulary', vocabulary))
           if v != defaults[k].default]
  if given:
    raise ConfigError(f'lda: data {os.fspath(data)!r} is a file: {", ".join(given)} apply to '
                      "data='stdlib' only")
  return read_documents(data), {'data': os.fspath(data)}
