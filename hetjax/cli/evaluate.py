"""``hetjax-evaluate`` (``experiments/evaluate.py``): evaluates a finished run's model on its
held-out split (`hetjax.run.evaluate`).

  hetjax-evaluate --workdir=runs/mytext              # the latest checkpoint
  hetjax-evaluate --workdir=runs/mytext --step=200 --batches=32

Prints the step, ``eval_loss`` and ``eval_perplexity`` and writes them to ``WORKDIR/eval.json``.
The batches are the run's own evaluation batches (the first ``--batches`` of them), so at the
last step and the run's ``eval.batches`` it repeats the run's final ``eval_loss``. No run, no
checkpoint or no held-out split prints one line and exits 2.

With ``--sample`` it samples text instead (a gpt or llama run; `hetjax.run.sample`):

  hetjax-evaluate --workdir=runs/llama_tiny --sample --prompt='def main(' --temperature=0.8

The prompt is ``--prompt``, else the start of the first held-out example (half the context,
less where a learned position table must also hold the new tokens); text becomes ids as the
run's data does (`hetjax.data.text_codec`: UTF-8 bytes, or a ``bpe`` dataset's
``tokenizer.json``). Prints the prompt and the ``--max_new_tokens`` tokens that follow it, on
one device.
"""

from __future__ import annotations

import json
import pathlib

from absl import flags

from hetjax import ConfigError, run
from hetjax.cli._main import program_name, run_main

_WORKDIR = flags.DEFINE_string('workdir', None, 'run directory to evaluate (required)')
_STEP = flags.DEFINE_integer('step', None, 'checkpoint step (default: the latest)')
_BATCHES = flags.DEFINE_integer('batches', 8, 'held-out batches to average over')
_BATCH = flags.DEFINE_integer('batch', None, 'rows per batch (default: the run\'s eval batch)')
_SAMPLE = flags.DEFINE_bool('sample', False, 'sample text from the model instead of evaluating')
_PROMPT = flags.DEFINE_string('prompt', None, 'text to continue (default: the start of the '
                              'first held-out example)')
_MAX_NEW_TOKENS = flags.DEFINE_integer('max_new_tokens', 64, 'tokens to sample')
_TEMPERATURE = flags.DEFINE_float('temperature', 0.8, 'sampling temperature (0: greedy)')
_TOP_K = flags.DEFINE_integer('top_k', None, 'sample from the k most likely tokens')
_TOP_P = flags.DEFINE_float('top_p', None, 'sample from the most likely tokens holding this '
                            'probability, in (0, 1]')
_SEED = flags.DEFINE_integer('seed', 0, 'sampling seed')


def evaluate_from_flags() -> dict:
  if not _WORKDIR.value:
    raise ConfigError('--workdir is required: the run directory to evaluate')
  workdir = pathlib.Path(_WORKDIR.value).expanduser()
  if _SAMPLE.value:
    return sample(workdir)
  result = run.evaluate(workdir, step=_STEP.value, batches=_BATCHES.value, batch=_BATCH.value)
  (workdir / 'eval.json').write_text(json.dumps(result, indent=2) + '\n')
  print(f'step {result["step"]}: eval_loss {result["eval_loss"]:.4f}, eval_perplexity '
        f'{result["eval_perplexity"]:.2f} ({result["batches"]} batches of {result["batch"]} rows)')
  return result


def sample(workdir: pathlib.Path) -> dict:
  """Prints ``--prompt`` (or the default prompt) and the model's continuation of it
  (`hetjax.run.sample`); its record."""
  result = run.sample(workdir, _PROMPT.value, _MAX_NEW_TOKENS.value,
                      temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value,
                      seed=_SEED.value, step=_STEP.value)
  prompt_tokens = len(result['ids']) - _MAX_NEW_TOKENS.value
  print(f'--- prompt ({prompt_tokens} tokens) ---\n{result["prompt"]}')
  print(f'--- continuation ({_MAX_NEW_TOKENS.value} tokens, temperature '
        f'{_TEMPERATURE.value:g}) ---\n{result["continuation"]}')
  return result


def main() -> None:
  """The ``hetjax-evaluate`` console entry."""
  run_main(program_name('evaluate.py'), evaluate_from_flags)
