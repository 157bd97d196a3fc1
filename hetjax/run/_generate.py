"""Sampling text from a trained decoder: a key/value cache, one compiled prefill and one compiled
step per shape, greedy or temperature sampling with top-k and nucleus (top-p) filtering.

The prompt goes through the model once (`hetjax.models._lm.Decoder.decode` from position 0,
filling every block's `hetjax.models._lm.KVCache`); each new token then goes through alone,
reading the cached keys and values of the positions before it. Both functions are jitted once
per model structure (its `nnx.GraphDef`, `_programs`): a second call with the same batch,
prompt length and ``max_new_tokens`` compiles nothing (JAX's own cache, keyed on those and on
whether the call is greedy and filters). The position, the seed, the temperature,
``top_k`` and ``top_p`` are traced arguments, so the step compiles once for every position and a
sweep over sampling options compiles once.

Example::

  model = hetjax.run.load_model('runs/llama_tiny')
  codec = hetjax.data.text_codec(None)                       # the stdlib bytes
  ids = generate(model, codec.encode('def main('), 64, temperature=0.8, top_k=40)
  print(codec.decode(ids))

`sample` does the same for a run directory (``hetjax-evaluate --sample``), and `sample_hook` at
each periodic evaluation of a run (``eval.sample``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hetjax import ConfigError, core, data, train
from hetjax._checks import fraction, integer, number, positive_int

#: What `generate` reads of a model (`hetjax.models._lm.Decoder`'s).
_DECODER = ('decode', 'init_cache', 'max_positions', 'vocab_size')

#: How often each compiled function was traced (``'prefill'``, ``'step'``): a test's proof that
#: a repeated call compiles nothing.
_TRACES: collections.Counter[str] = collections.Counter()


@dataclasses.dataclass(frozen=True)
class _Sampler:
  """What changes the compiled program (static): greedy or not, and whether a top-k or top-p
  filter applies; the temperature, ``top_k`` and ``top_p`` themselves are traced values."""

  greedy: bool
  filtered: bool


def generate(model: nnx.Module, prompt_ids, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0) -> np.ndarray:
  """``prompt_ids`` followed by ``max_new_tokens`` tokens drawn from ``model``.

  Each new token is drawn from the model's next-token distribution given everything before
  it: ``temperature=0`` takes the most likely one (greedy); otherwise the logits are divided
  by ``temperature``, cut to the ``top_k`` largest and then to the smallest set whose
  probability reaches ``top_p`` (nucleus), and one token is drawn with `jax.random` from
  ``seed`` (the token at position ``p`` from ``fold_in(key(seed), p)``: the same seed gives the
  same tokens).

  A model with a learned position table (gpt's ``positions='learned'``) has no position past
  its ``seq_len``, so the prompt and the new tokens must fit in it; a model with rotary
  positions (llama, gpt's ``'rotary'``) runs at any length (what it says past the length it was
  trained on is its own affair).

  Example::

    model = hetjax.run.load_model('runs/llama_tiny')
    generate(model, [100, 101, 102], 5, temperature=0)   # int32[8], greedy

  Args:
    model: a decoder language model (`hetjax.models.gpt.GPT`, `hetjax.models.llama.Llama`),
      e.g. `hetjax.run.load_model`'s: one with ``decode``, ``init_cache``, ``max_positions`` and
      ``vocab_size``, as their base ``hetjax.models._lm.Decoder`` has.
    prompt_ids: ints ``[B, T]`` (or ``[T]``: one prompt, and the result is ``[T + new]``), each
      in ``[0, vocab_size)``, ``T >= 1``.
    max_new_tokens: how many tokens to add (0: the prompt back).
    temperature: ``>= 0``; 0 is greedy.
    top_k: keep the ``top_k`` most likely tokens (``>= 1``); None: all.
    top_p: keep the most likely tokens whose probabilities reach ``top_p``, in ``(0, 1]``;
      None: all.
    seed: the sampling seed (unused when greedy).

  Returns:
    ``int32[B, T + max_new_tokens]`` (or ``[T + max_new_tokens]``): the prompt, then the new
    tokens.

  Raises:
    ConfigError: a model without key/value decoding, a bad prompt, a sequence longer than a
      learned position table, or a bad sampling option; one line naming it.
  """
  if not all(hasattr(model, name) for name in _DECODER):
    raise ConfigError(f'generate needs a decoder language model with key/value decoding '
                      f'(hetjax.models gpt or llama), got {type(model).__name__}')
  new = integer(max_new_tokens, 'max_new_tokens')
  temperature = number(temperature, 'temperature')
  if top_k is not None:
    top_k = positive_int(top_k, 'top_k')
  if top_p is not None:
    top_p = fraction(top_p, 'top_p')
  integer(seed, 'seed')
  vocab = model.vocab_size
  prompt = _prompt(prompt_ids, vocab)
  length = prompt.shape[1]
  limit = model.max_positions
  if limit is not None and length + new > limit:
    name = getattr(model, 'NAME', 'the model')
    raise ConfigError(f'a prompt of {length} tokens and max_new_tokens={new} make '
                      f'{length + new} positions, more than the {limit} of {name}\'s learned '
                      'position table')
  if new == 0:
    return prompt if np.ndim(prompt_ids) == 2 else prompt[0]
  top_k = vocab if top_k is None else min(top_k, vocab)
  top_p = 1.0 if top_p is None else top_p
  sampler = _Sampler(greedy=temperature == 0, filtered=top_k < vocab or top_p < 1)
  options = dict(key=jax.random.key(seed), temperature=jnp.float32(temperature or 1.0),
                 top_k=jnp.int32(top_k), top_p=jnp.float32(top_p))
  graphdef, state = nnx.split(model)
  prefill, step = _programs(graphdef)
  token, cache = prefill(state, jnp.asarray(prompt), max_len=length + new - 1, sampler=sampler,
                         **options)
  tokens = [token]
  for pos in range(length, length + new - 1):
    token, cache = step(state, cache, token, np.int32(pos), sampler=sampler, **options)
    tokens.append(token)
  out = np.concatenate([prompt, np.stack(jax.device_get(tokens), axis=1)], axis=1)
  return out if np.ndim(prompt_ids) == 2 else out[0]


def held_out_prompt(task: train.Task, seed: int, new_tokens: int,
                    max_positions: int | None) -> list[int]:
  """The first tokens of the task's first held-out example (its ``eval_data`` batch 0 under
  ``seed``): half its context, fewer where a learned position table of ``max_positions`` must
  also hold ``new_tokens``; at least one.

  Raises:
    ConfigError: the task has no held-out split.
  """
  if task.eval_data is None:
    raise ConfigError(f'model {task.name} has no held-out split to take a prompt from: give one')
  example = task.eval_data.global_batch(seed, 0, 1)['tokens'][0]
  length = len(example) // 2
  if max_positions is not None:
    length = min(length, max_positions - max(new_tokens, 0))
  return [int(i) for i in example[:max(length, 1)]]


def sample(run_dir, prompt: str | None = None, max_new_tokens: int = 64, *,
           temperature: float = 0.8, top_k: int | None = None, top_p: float | None = None,
           seed: int = 0, step: int | None = None) -> dict:
  """A continuation of ``prompt`` by a finished run's model (`hetjax.run.load_model`, on one
  device), text in and out as the run's data encodes it (`hetjax.data.text_codec`).

  Example::

    hetjax.run.sample('runs/finetune', 'def main(', 32, temperature=0)['continuation']

  Args:
    run_dir: a run directory of a gpt or llama run (a mode `load_model` reads).
    prompt: the text to continue; None: the start of the first held-out example
      (`held_out_prompt`).
    max_new_tokens, temperature, top_k, top_p, seed: as `generate` takes them.
    step: the checkpoint step; None: the latest.

  Returns:
    ``{'step', 'prompt', 'continuation', 'ids'}``: the prompt's and the new tokens' text and
    every id.

  Raises:
    ConfigError: what `load_model` and `generate` refuse, or an empty ``prompt``.
  """
  from hetjax.run._task import make_task
  from hetjax.run._trained import checkpoint_step, load_model, read_run_config

  config = read_run_config(run_dir)
  step = checkpoint_step(run_dir) if step is None else step
  model = load_model(run_dir, step=step, devices=jax.local_devices()[:1])
  codec = data.text_codec(config.model.args.get('data'))
  if prompt is not None:
    ids = codec.encode(prompt)
    if not ids:
      raise ConfigError('the prompt is empty: give some text to continue')
  else:
    ids = held_out_prompt(make_task(config, weights=False), config.data.seed, max_new_tokens,
                          getattr(model, 'max_positions', None))
  out = generate(model, ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                 seed=seed)
  return {'step': step, 'prompt': codec.decode(ids), 'continuation': codec.decode(out[len(ids):]),
          'ids': out.tolist()}


def sample_hook(program: core.StepProgram, task: train.Task, tokens: int, seed: int,
                every: int, until: int, is_chief: bool) -> train.Hook:
  """A loop hook that prints a greedy continuation of ``tokens`` tokens of the held-out prompt
  (`held_out_prompt`) every ``every`` steps (0: only after the last, ``until``), on the chief:
  ``sample at step 100: 'def f(' → 'x):'``. The program gives its model whole
  (`hetjax.core.HasModel`).

  Raises:
    ConfigError: a model without key/value decoding (gpt and llama have it), or a program
      that cannot give its model whole to a process.
  """
  with nnx.use_eager_sharding(False):
    abstract = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(0)))
  if not all(hasattr(abstract, name) for name in _DECODER):
    raise ConfigError(f'eval.sample: model {task.name} cannot generate text (gpt and llama '
                      'can): set eval.sample=0')
  if not isinstance(program, core.HasModel):
    raise ConfigError(f'eval.sample: {type(program).__name__} does not hold the model whole on '
                      'a process (SPMD, shares, tokens, ps, and pipelines on one process do)')
  prompt = held_out_prompt(task, seed, tokens, abstract.max_positions)
  codec = data.text_codec(task.config.get('data'))
  said = []

  def run(info: train.StepInfo) -> None:
    if not is_chief or not ((every and info.step % every == 0) or info.step == until):
      return
    model = program.whole_model(info.state)
    if model is None:
      if not said:
        print('eval.sample: the parameters span processes here; no samples', flush=True)
        said.append(True)
      return
    ids = generate(model, prompt, tokens, temperature=0)
    print(f'sample at step {info.step}: {codec.decode(prompt)!r} → '
          f'{codec.decode(ids[len(prompt):])!r}', flush=True)

  return train.Hook(run)


def _prompt(prompt_ids, vocab: int) -> np.ndarray:
  """``prompt_ids`` as ``int32[B, T]``, checked."""
  prompt = np.asarray(prompt_ids)
  if prompt.ndim not in (1, 2) or prompt.size == 0 or not (
      np.issubdtype(prompt.dtype, np.integer)):
    raise ConfigError(f'prompt_ids must be a non-empty array of ints [batch, length] or '
                      f'[length], got {prompt.dtype}{list(prompt.shape)}')
  if prompt.min() < 0 or prompt.max() >= vocab:
    raise ConfigError(f'prompt_ids must lie in [0, {vocab}) (the model\'s vocabulary), got ids '
                      f'from {prompt.min()} to {prompt.max()}')
  return prompt.astype(np.int32).reshape((-1, prompt.shape[-1]))


@functools.lru_cache(maxsize=8)
def _programs(graphdef: nnx.GraphDef) -> tuple[Callable, Callable]:
  """The jitted prefill and step of a model structure: looked up once a `generate` call (a
  graph definition hashes in a fraction of a millisecond a block, too slow to repeat as a
  static argument at every token), then JAX's cache per shape and `_Sampler`."""

  @functools.partial(jax.jit, static_argnames=('max_len', 'sampler'))
  def prefill(state, prompt, *, key, temperature, top_k, top_p, max_len: int,
              sampler: _Sampler):
    """The prompt through the model from position 0 into an empty cache of ``max_len`` rows,
    and the token drawn after it: ``(int32[B], cache)``."""
    _TRACES['prefill'] += 1
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(prompt.shape[0], max_len)
    logits, cache = model.decode(prompt, cache, 0)
    pos = prompt.shape[1]
    return _draw(logits[:, -1], jax.random.fold_in(key, pos), temperature, top_k, top_p,
                 sampler), cache

  @functools.partial(jax.jit, static_argnames=('sampler',), donate_argnames=('cache',))
  def step(state, cache, token, pos, *, key, temperature, top_k, top_p, sampler: _Sampler):
    """``token`` (``int32[B]``, at position ``pos``) through the model over the cache, and the
    token drawn after it: ``(int32[B], cache)``."""
    _TRACES['step'] += 1
    model = nnx.merge(graphdef, state)
    logits, cache = model.decode(token[:, None], cache, pos)
    return _draw(logits[:, -1], jax.random.fold_in(key, pos + 1), temperature, top_k, top_p,
                 sampler), cache

  return prefill, step


def _draw(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array,
          top_p: jax.Array, sampler: _Sampler) -> jax.Array:
  """One token per row of ``float32[B, vocab]`` logits (`generate`'s rule).

  Filtered, the logits are ranked (one sort, so ``top_k`` can be traced, unlike
  `jax.lax.top_k`'s): rank ``r`` stays if ``r < top_k`` and the tokens ranked before it,
  renormalised over the top ``top_k``, hold less than ``top_p``; the smallest logit that stays
  is the cut-off (tokens tied with it stay too).
  """
  if sampler.greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if sampler.filtered:
    ranked = jnp.sort(logits, axis=-1)[:, ::-1]
    in_top_k = jnp.arange(ranked.shape[-1]) < top_k
    probs = jax.nn.softmax(jnp.where(in_top_k, ranked, -jnp.inf), axis=-1)
    above = jnp.cumsum(probs, axis=-1) - probs  # the mass of the tokens ranked before each
    stays = in_top_k & (above < top_p)  # rank 0 always: 0 < top_p
    cutoff = jnp.min(jnp.where(stays, ranked, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
