"""Text generation with a key/value cache (`hetjax.run._generate`): decoding a sequence piece by
piece over the cache gives the full forward's logits at every position; greedy generation is the
argmax of the full forward, token after token; sampling follows its seed and filters; each shape
compiles once; bad input is one line; ``hetjax-evaluate --sample`` prints a continuation."""

from __future__ import annotations

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hetjax import ConfigError, run
from hetjax.data import text_codec
from hetjax.models import gpt, llama
from hetjax.run import _generate, generate

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMALL = {'d_model': 32, 'heads': 4, 'layers': 2, 'seq_len': 32}
MODELS = {
    # Grouped-query attention, q/k/v biases, and Llama 3.1's frequency scaling in force (the
    # longer wavelengths of head_dim 8 exceed rope_original_seq_len / rope_low_freq_factor).
    'llama': lambda: llama.Llama(llama.LlamaConfig(
        **SMALL, kv_heads=2, qkv_bias=True, rope_scaling='llama3', rope_original_seq_len=16),
        rngs=nnx.Rngs(0)),
    'gpt_learned': lambda: gpt.GPT(gpt.GPTConfig(**SMALL), rngs=nnx.Rngs(0)),
    'gpt_rotary': lambda: gpt.GPT(gpt.GPTConfig(**SMALL, positions='rotary'), rngs=nnx.Rngs(0)),
}


@functools.cache
def _build(name: str) -> nnx.Module:
  """The model with every parameter moved off its initial value (the biases and norms are
  zeros and ones at init, which would hide a missed bias or norm in the decoding path)."""
  with nnx.use_eager_sharding(False):
    model = nnx.jit(MODELS[name])()
  graphdef, state = nnx.split(model)
  leaves, tree = jax.tree.flatten(state)
  noise = np.random.default_rng(1).normal(0, 0.1, sum(x.size for x in leaves))
  offsets = np.cumsum([0] + [x.size for x in leaves])
  moved = [x + noise[lo:hi].reshape(x.shape).astype(x.dtype)
           for x, lo, hi in zip(leaves, offsets[:-1], offsets[1:], strict=True)]
  return nnx.merge(graphdef, jax.tree.unflatten(tree, moved))


@pytest.fixture(scope='module', params=list(MODELS))
def model(request):
  return _build(request.param)


_forward = nnx.jit(lambda model, tokens: model(tokens))
_decode = nnx.jit(lambda model, tokens, cache, pos: model.decode(tokens, cache, pos))


def _tokens(batch: int, length: int, seed: int = 2) -> np.ndarray:
  return np.asarray(jax.random.randint(jax.random.key(seed), (batch, length), 0, 256), np.int32)


def test_decoding_over_the_cache_is_the_full_forward(model):
  """A prefill of 5 tokens, a chunk of 3 at position 5, then one token at a time to 16: each
  piece's logits are the full forward's at its positions. The same float32 arithmetic on the
  same values, except the softmax over the cache's masked rows: 1e-5 absolute on logits of
  order 1."""
  tokens = _tokens(2, 16)
  full = _forward(model, jnp.asarray(tokens))
  cache = model.init_cache(2, 16)
  pieces = [(0, 5), (5, 8)] + [(t, t + 1) for t in range(8, 16)]
  for lo, hi in pieces:
    logits, cache = _decode(model, jnp.asarray(tokens[:, lo:hi]), cache, jnp.int32(lo))
    np.testing.assert_allclose(logits, full[:, lo:hi], rtol=0, atol=1e-5, err_msg=(lo, hi))


def test_greedy_generation_is_the_argmax_of_the_full_forward(model):
  """The reference feeds the growing sequence to the full forward and appends the argmax at its
  last position; the forward is causal, so one forward of the zero-padded final length gives
  position t's logits from the tokens up to t (one compile instead of one per length)."""
  prompt, new = _tokens(2, 4), 8
  out = generate(model, prompt, new, temperature=0)
  assert out.shape == (2, 12) and out.dtype == np.int32
  want = np.zeros((2, 12), np.int32)
  want[:, :4] = prompt
  for t in range(4, 12):
    logits = _forward(model, jnp.asarray(want))
    want[:, t] = np.argmax(logits[:, t - 1], axis=-1)
  np.testing.assert_array_equal(out, want)


def test_sampling_follows_the_seed_and_the_filters():
  model = _build('llama')
  prompt = _tokens(2, 4)
  greedy = generate(model, prompt, 10, temperature=0)
  first = generate(model, prompt, 10, temperature=1.0, seed=3)
  np.testing.assert_array_equal(generate(model, prompt, 10, temperature=1.0, seed=3), first)
  # 20 tokens from near-uniform distributions over 256 ids: all equal by chance ~256^-20.
  assert not np.array_equal(generate(model, prompt, 10, temperature=1.0, seed=4), first)
  np.testing.assert_array_equal(generate(model, prompt, 10, temperature=1.0, top_k=1), greedy)
  np.testing.assert_array_equal(generate(model, prompt, 10, temperature=2.0, top_p=1e-6),
                                greedy)  # the nucleus of any mass below the top token's is it
  # Every sampled token lies in its position's top 5, or its nucleus of mass 0.5.
  for options in ({'top_k': 5}, {'top_p': 0.5}):
    out = generate(model, prompt, 10, temperature=1.0, seed=5, **options)
    np.testing.assert_array_equal(out[:, :4], prompt)
    logits = np.asarray(_forward(model, jnp.asarray(out)))[:, 3:-1]  # those that drew 4 …
    drawn = out[:, 4:, None]
    rank = np.sum(logits > np.take_along_axis(logits, drawn, -1), axis=-1)  # 0: the top one
    if 'top_k' in options:
      assert rank.max() < 5, rank
    else:
      probs = jax.nn.softmax(logits, axis=-1)
      above = np.sum(np.where(logits > np.take_along_axis(logits, drawn, -1), probs, 0), -1)
      assert above.max() < 0.5, above


def test_a_second_call_of_the_same_shapes_compiles_nothing():
  """The prefill and the step are traced once for a shape, greedy or not and filtered or not;
  the prompt's values, the seed, the temperature, top_k and top_p are traced arguments."""
  model = _build('gpt_rotary')
  generate(model, _tokens(3, 5), 6, temperature=0.7, top_p=0.9, seed=0)
  before = dict(_generate._TRACES)
  generate(model, _tokens(3, 5, seed=7), 6, temperature=1.3, top_k=3, top_p=0.5, seed=1)
  generate(model, _tokens(3, 5), 6, temperature=0.2, top_k=40)
  assert dict(_generate._TRACES) == before
  generate(model, _tokens(3, 5), 7, temperature=0.7, top_p=0.9)  # a longer cache: new shapes
  assert _generate._TRACES['prefill'] == before['prefill'] + 1
  assert _generate._TRACES['step'] == before['step'] + 1


@pytest.mark.parametrize('model_name, prompt, kwargs, message', [
    ('llama', [[1, 2]], {'max_new_tokens': -1}, 'max_new_tokens must be an integer >= 0'),
    ('llama', [[1, 2]], {'temperature': -0.5}, 'temperature must be a finite number >= 0'),
    ('llama', [[1, 2]], {'top_k': 0}, 'top_k must be an integer >= 1'),
    ('llama', [[1, 2]], {'top_p': 0.0}, r'top_p must be in \(0, 1\]'),
    ('llama', [[1, 2]], {'top_p': 1.5}, r'top_p must be in \(0, 1\]'),
    ('llama', [[1, 256]], {}, r'prompt_ids must lie in \[0, 256\)'),
    ('llama', [], {}, 'prompt_ids must be a non-empty array of ints'),
    ('llama', [[0.5]], {}, 'prompt_ids must be a non-empty array of ints'),
    ('gpt_learned', [[1] * 30], {'max_new_tokens': 3},
     "33 positions, more than the 32 of gpt's learned position table"),
])
def test_bad_input_is_one_line(model_name, prompt, kwargs, message):
  model = _build(model_name)
  kwargs = {'max_new_tokens': 2, **kwargs}
  with pytest.raises(ConfigError, match=message) as error:
    generate(model, prompt, **kwargs)
  assert '\n' not in str(error.value)


def test_what_generate_accepts():
  with pytest.raises(ConfigError, match='needs a decoder language model'):
    generate(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), [[1]], 1)
  rotary = _build('gpt_rotary')  # no position table: past seq_len runs
  one = generate(rotary, [1] * 30, 4, temperature=0)  # a [T] prompt gives [T + new]
  np.testing.assert_array_equal(one, generate(rotary, [[1] * 30], 4, temperature=0)[0])
  assert one.shape == (34,)
  np.testing.assert_array_equal(generate(rotary, [5, 6], 0), [5, 6])


def test_the_text_codecs(tmp_path):
  codec = text_codec(None)
  assert codec.encode('é!') == [195, 169, 33]
  assert codec.decode([195, 169, 33, 300, 255]) == 'é!\ufffd\ufffd'
  assert text_codec(tmp_path).encode('a') == [97]  # a bytes dataset: no tokenizer.json
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  bpe = Tokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  bpe.train_from_iterator(['def main(): return 0'] * 10, trainers.BpeTrainer(
      vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  bpe.save(str(tmp_path / 'tokenizer.json'))
  codec = text_codec(tmp_path)
  ids = codec.encode('def main():')
  assert len(ids) < len('def main():') and codec.decode(ids) == 'def main():'


@pytest.fixture(scope='module')
def llama_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('llama')
  config = run.override(run.load_config('llama_tiny'), [
      'steps=2', 'model.args.layers=1', 'model.args.d_model=32', 'model.args.heads=4',
      'model.args.kv_heads=2', 'model.args.mlp=64', 'model.args.seq_len=32', 'global_batch=8',
      'mesh=8x1', 'strategy=data_parallel', 'eval.every=0', 'eval.batches=1',
      'logging.mfu=False', 'logging.tensorboard=False', 'checkpoint_every=2'])
  run.train(config, workdir, overwrite=True)
  return workdir


#: Calls hetjax-evaluate's function once per argument list (JSON in argv[1]), each with the
#: absl flags parsed from it, and prints the results as JSON on the last line.
_EVALUATE = """
import json, sys
from absl import flags
from hetjax.cli import evaluate
results = []
for argv in json.loads(sys.argv[1]):
  flags.FLAGS(['evaluate.py', *argv])
  results.append(evaluate.evaluate_from_flags())
  flags.FLAGS.unparse_flags()
print(json.dumps(results))
"""


def test_evaluate_samples_a_continuation(llama_run):
  """In a process of its own: hetjax-train's flags share names with hetjax-evaluate's, so the
  two cannot be imported into one test process."""
  calls = [[f'--workdir={llama_run}', '--sample', '--prompt=def main(', '--max_new_tokens=12',
            '--temperature=0'],
           [f'--workdir={llama_run}', '--sample', '--max_new_tokens=4', '--top_k=5']]
  done = subprocess.run([sys.executable, '-c', _EVALUATE, json.dumps(calls)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  greedy, held_out = json.loads(done.stdout.splitlines()[-1])
  model = run.load_model(llama_run, devices=jax.devices()[:1])
  want = generate(model, list(b'def main('), 12, temperature=0)
  assert greedy['ids'] == want.tolist()
  assert greedy['continuation'] == text_codec(None).decode(want[9:])
  assert done.stdout.startswith('--- prompt (9 tokens) ---\ndef main(\n--- continuation (12 '
                                f'tokens, temperature 0) ---\n{greedy["continuation"]}\n')
  assert len(held_out['ids']) == 16 + 4  # half the context of 32, then 4 new tokens
  assert '--- prompt (16 tokens) ---\n' in done.stdout


def test_a_run_prints_a_greedy_sample_at_each_evaluation(tmp_path, capsys):
  """``eval.sample``: at each evaluation the chief prints the greedy continuation of the
  held-out prompt; the last one is what the finished run's model generates."""
  config = run.override(run.load_config('llama_tiny'), [
      'steps=2', 'model.args.layers=1', 'model.args.d_model=32', 'model.args.heads=4',
      'model.args.kv_heads=2', 'model.args.mlp=64', 'model.args.seq_len=32', 'global_batch=8',
      'mesh=8x1', 'strategy=data_parallel', 'eval.every=1', 'eval.batches=1', 'eval.sample=6',
      'logging.mfu=False', 'logging.tensorboard=False', 'checkpoint_every=2'])
  run.train(config, tmp_path / 'run')
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('sample')]
  assert [line.split(':')[0] for line in lines] == ['sample at step 1', 'sample at step 2']
  model = run.load_model(tmp_path / 'run', devices=jax.devices()[:1])
  prompt = _generate.held_out_prompt(run.make_task(config), 0, 6, None)
  codec = text_codec(None)
  continuation = codec.decode(generate(model, prompt, 6, temperature=0)[len(prompt):])
  assert lines[-1] == f'sample at step 2: {codec.decode(prompt)!r} → {continuation!r}'


def test_a_sample_of_a_model_that_cannot_generate_is_refused(tmp_path):
  config = run.override(run.load_config('mlp'), ['steps=1', 'mesh=8x1', 'eval.sample=4'])
  with pytest.raises(ConfigError, match=r'eval\.sample: model mlp cannot generate text'):
    run.train(config, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()  # refused before the run directory is made
