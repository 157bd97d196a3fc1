"""``hetjax-prepare-text`` (``experiments/prepare_text.py``): makes a token dataset from a folder of
text files (`hetjax.data.prepare_text`), offline.

  hetjax-prepare-text --out=data/stdlib --max_mb=8           # the stdlib, bytes
  hetjax-prepare-text --out=data/bpe --tokenizer=bpe --vocab_size=4096 \\
      --source=~/src/myproject --pattern='*.py,*.md'
  hetjax-prepare-text --out=data/llama --tokenizer=~/models/Llama-3.2-1B \
      --source=~/corpus --pattern='*.jsonl,*.parquet' --text_field=text

Each plain file is one document, each line of a ``.jsonl`` file and each row of a ``.parquet``
file (pyarrow) one, its text in field or column ``--text_field``; ``val`` holds
``--val_fraction`` of them. ``--tokenizer`` is ``bytes``, ``bpe`` (trained here) or a Hugging
Face ``tokenizer.json`` or model folder holding one, whose EOS id (``--eos_id`` or looked up
beside it, `hetjax.data.prepare_text`) ends each document. The directory written is read by
`hetjax.data.read_token_dataset`. Bad input (a missing folder, no matching files, an unknown
tokenizer, no EOS found, a ``.jsonl`` line without the field, a non-empty ``--out`` without
``--overwrite``) prints one line and exits 2.
"""

from __future__ import annotations

import os

from absl import flags

from hetjax import ConfigError
from hetjax.cli._main import program_name, run_main
from hetjax.data import prepare_text

_SOURCE = flags.DEFINE_string('source', None, 'folder to read (default: the Python stdlib)')
_OUT = flags.DEFINE_string('out', None, 'dataset directory to write (required)')
_TOKENIZER = flags.DEFINE_string(
    'tokenizer', 'bytes', 'bytes (256 ids), bpe (trained here), or the path of a Hugging Face '
    'tokenizer.json or of a model folder holding one')
_VOCAB_SIZE = flags.DEFINE_integer('vocab_size', None, 'bpe vocabulary (>= 257; default 4096)')
_EOS_ID = flags.DEFINE_integer(
    'eos_id', None, "id ending each document of a pretrained tokenizer (default: its "
    "tokenizer_config.json's eos_token, config.json's eos_token_id or a special token like </s>)")
_VAL_FRACTION = flags.DEFINE_float('val_fraction', 0.05, 'share of documents held out as val')
_PATTERN = flags.DEFINE_list('pattern', ['*.py'], 'file-name globs to read, comma-separated')
_TEXT_FIELD = flags.DEFINE_string('text_field', 'text',
                                  'field of a .jsonl line, column of a .parquet file, to read')
_MAX_MB = flags.DEFINE_float('max_mb', None, 'read at most this many MB (10^6 bytes) of text')
_SEED = flags.DEFINE_integer('seed', 0, 'picks the val documents')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'replace the dataset in a non-empty --out')


def prepare_text_from_flags() -> dict:
  if not _OUT.value:
    raise ConfigError('--out is required: the dataset directory to write')
  source = None if _SOURCE.value is None else os.path.expanduser(_SOURCE.value)
  max_bytes = None if _MAX_MB.value is None else max(1, int(_MAX_MB.value * 1e6))
  summary = prepare_text(
      source, os.path.expanduser(_OUT.value), tokenizer=os.path.expanduser(_TOKENIZER.value),
      vocab_size=_VOCAB_SIZE.value, eos_id=_EOS_ID.value, val_fraction=_VAL_FRACTION.value,
      pattern=_PATTERN.value, text_field=_TEXT_FIELD.value, max_bytes=max_bytes, seed=_SEED.value,
      overwrite=_OVERWRITE.value)
  for split, sizes in summary['splits'].items():
    print(f'{split}: {sizes["documents"]:,} documents, {sizes["tokens"]:,} tokens')
  skipped = f', {summary["skipped"]} files not UTF-8 skipped' if summary['skipped'] else ''
  eos = f', eos_id {summary["eos_id"]}' if summary['eos_id'] is not None else ''
  print(f'wrote {summary["path"]} ({summary["tokenizer"]}, vocab_size {summary["vocab_size"]}'
        f'{eos}, from {summary["files"]} files under {summary["source"]}{skipped})')
  return summary


def main() -> None:
  """The ``hetjax-prepare-text`` console entry."""
  run_main(program_name('prepare_text.py'), prepare_text_from_flags)
