"""A folder of text files made into a token dataset (`read_token_dataset`'s format), offline.

Each matching file is one document. The folder is walked in sorted order (directories named in
``SKIP_DIRS`` and hidden ones left out), so the same folder gives the same dataset on every
machine. The default folder is the running interpreter's standard library (its ``.py`` files:
real text on every machine, nothing downloaded).

Tokenizers:

* ``bytes``: a document's raw bytes are its ids (256 ids; a file need not be UTF-8);
* ``bpe``: a byte-level BPE of ``vocab_size`` ids trained with the `tokenizers` package on the
  train documents only (val stays unseen) and saved as ``tokenizer.json`` beside the splits;
  files that are not UTF-8 are skipped.

The val split holds ``val_fraction`` of the documents (rounded, at least one): those whose
relative path has the smallest seeded hash. A file's split thus depends on its path and the
seed, not on the walk order, and a file held out from a small corpus tends to stay held out when
the corpus grows (``max_bytes`` raised, files added).

Example::

  >>> summary = prepare_text(None, 'data/stdlib', max_bytes=8_000_000)  # stdlib, CPython 3.11.7
  >>> summary['splits']['train']['documents'], summary['vocab_size']
  (414, 256)
  >>> ds = read_token_dataset('data/stdlib', split='val', seq_len=256)
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import sysconfig
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError, parse_choice
from hetjax.data._token_file import Tokenizer, _replace, _splits, write_token_split

#: directories the walk leaves out (besides hidden ones): installed packages, test suites
SKIP_DIRS = frozenset({'site-packages', '__pycache__', 'test', 'tests', 'idlelib'})
_BPE_VOCAB = 4096  # bpe's vocab_size when none is given


def default_source_dir() -> str:
  """The running interpreter's standard library directory (`sysconfig`'s ``stdlib``)."""
  return sysconfig.get_paths()['stdlib']


def prepare_text(source_dir: str | os.PathLike | None, out_dir: str | os.PathLike, *,
                 tokenizer: Tokenizer | str = Tokenizer.BYTES, vocab_size: int | None = None,
                 val_fraction: float = 0.05, pattern: str | Sequence[str] = '*.py',
                 max_bytes: int | None = None, seed: int = 0,
                 overwrite: bool = False) -> dict:
  """Tokenizes the files under ``source_dir`` into ``out_dir``'s ``train`` and ``val`` splits.

  Args:
    source_dir: the folder to walk; None for the standard library (`default_source_dir`).
    out_dir: the dataset directory to write (made if missing).
    tokenizer: ``'bytes'`` or ``'bpe'`` (module docstring).
    vocab_size: bpe's vocabulary (at least 257; default 4096); bytes has 256, give None or 256.
      A small corpus may stop bpe short of it: the header records the size it reached.
    val_fraction: the share of documents held out as ``val``, in ``[0, 1)``; 0 writes no val.
    pattern: a glob (or several) a file's name must match, e.g. ``'*.py'`` or
      ``['*.md', '*.txt']``.
    max_bytes: read files (whole, in walk order) until the next would take the total past this.
    seed: picks which documents are held out.
    overwrite: replace the dataset files of a non-empty ``out_dir`` (nothing else there is
      touched); without it a non-empty ``out_dir`` is refused.

  Returns:
    A summary: ``{'path', 'source', 'tokenizer', 'vocab_size', 'files', 'skipped',
    'splits': {'train': {'documents', 'tokens'}, 'val': {...}}}`` (``skipped``: files bpe could
    not decode as UTF-8).

  Raises:
    ConfigError: an unknown tokenizer, a bad vocab_size, val_fraction or max_bytes, a missing
      source folder, no matching files, too few documents to hold one out, or a non-empty
      ``out_dir`` without ``overwrite``. One line each.
  """
  tokenizer = parse_choice(Tokenizer, tokenizer, 'tokenizer')
  if tokenizer is Tokenizer.BYTES and vocab_size not in (None, 256):
    raise ConfigError(f'the bytes tokenizer has 256 ids, not vocab_size {vocab_size} '
                      '(vocab_size is for bpe)')
  if tokenizer is Tokenizer.BPE and vocab_size is not None and vocab_size < 257:
    raise ConfigError(f'bpe vocab_size {vocab_size} must be at least 257 (256 bytes and one '
                      'merge)')
  if not 0 <= val_fraction < 1:
    raise ConfigError(f'val_fraction {val_fraction} must be in [0, 1)')
  if max_bytes is not None and max_bytes < 1:
    raise ConfigError(f'max_bytes must be at least 1, got {max_bytes}')
  source = default_source_dir() if source_dir is None else os.fspath(source_dir)
  out = os.fspath(out_dir)
  if not os.path.isdir(source):
    raise ConfigError(f'source folder {source} does not exist' if not os.path.exists(source)
                      else f'source folder {source} is not a directory')
  if os.path.exists(out) and not os.path.isdir(out):
    raise ConfigError(f'out folder {out} is not a directory')
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise ConfigError(f'out folder {out} is not empty (overwrite=True, --overwrite, replaces '
                      'its dataset files)')
  patterns = (pattern,) if isinstance(pattern, str) else tuple(pattern)
  files = _read_files(source, patterns, max_bytes)
  texts, skipped = files, 0
  if tokenizer is Tokenizer.BPE:
    texts = [(path, text) for path, text in map(_decoded, files) if text is not None]
    skipped = len(files) - len(texts)
  if not texts:
    limit = f' within max_bytes {max_bytes}' if max_bytes is not None else ''
    undecodable = f' ({skipped} not UTF-8)' if skipped else ''
    raise ConfigError(f'no files matching {" ".join(patterns)} under {source}{limit}'
                      f'{undecodable}')
  train, val = _hold_out(texts, val_fraction, seed, source)

  os.makedirs(out, exist_ok=True)
  if tokenizer is Tokenizer.BYTES:
    encode, vocab = (lambda docs: [np.frombuffer(d, np.uint8) for d in docs]), 256
  else:
    encode, vocab = _train_bpe(train, vocab_size or _BPE_VOCAB, out)
  splits = {}
  for split, docs in (('train', train), ('val', val)):
    if docs:
      ids = encode(docs)
      offsets = np.cumsum([0, *(len(d) for d in ids[:-1])])
      write_token_split(out, split, np.concatenate(ids), offsets, vocab, tokenizer)
      splits[split] = {'documents': len(ids), 'tokens': int(sum(len(d) for d in ids))}
  stale = [f'{s}.{x}' for s in _splits(out) if s not in splits and s in ('train', 'val')
           for x in ('bin', 'json')]
  stale += ['tokenizer.json'] if tokenizer is Tokenizer.BYTES else []
  for name in stale:  # left by an earlier dataset in this folder (overwrite=True)
    if os.path.exists(os.path.join(out, name)):
      os.remove(os.path.join(out, name))
  return {'path': out, 'source': source, 'tokenizer': tokenizer.value, 'vocab_size': vocab,
          'files': len(files), 'skipped': skipped, 'splits': splits}


def _read_files(source: str, patterns: tuple[str, ...],
                max_bytes: int | None) -> list[tuple[str, bytes]]:
  """(relative path, contents) of each non-empty matching file, in sorted walk order."""
  found, total = [], 0
  for dirpath, dirnames, filenames in os.walk(source):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith('.'))
    for name in sorted(filenames):
      if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
        continue
      path = os.path.join(dirpath, name)
      try:
        size = os.path.getsize(path)
        if max_bytes is not None and total + size > max_bytes:
          return found
        with open(path, 'rb') as f:
          data = f.read()
      except OSError:  # a dangling link, a file removed during the walk, no permission
        continue
      if data:
        found.append((os.path.relpath(path, source).replace(os.sep, '/'), data))
        total += len(data)
  return found


def _decoded(file: tuple[str, bytes]) -> tuple[str, str | None]:
  try:
    return file[0], file[1].decode('utf-8')
  except UnicodeDecodeError:
    return file[0], None


def _hold_out(docs: list[tuple[str, object]], val_fraction: float, seed: int,
              source: str) -> tuple[list, list]:
  """(train, val) contents, each in walk order; val the smallest seeded hashes of the paths."""
  if val_fraction == 0:
    return [d for _, d in docs], []
  if len(docs) < 2:
    raise ConfigError(f'{source} has one matching document: too few to hold out val_fraction '
                      f'{val_fraction} (give more files, or val_fraction 0)')
  num_val = min(len(docs) - 1, max(1, round(val_fraction * len(docs))))
  keys = [hashlib.blake2b(f'{seed}\0{path}'.encode(), digest_size=8).digest() for path, _ in docs]
  val = set(sorted(range(len(docs)), key=keys.__getitem__)[:num_val])
  return ([d for i, (_, d) in enumerate(docs) if i not in val],
          [d for i, (_, d) in enumerate(docs) if i in val])


def _train_bpe(texts: list[str], vocab_size: int, out: str):
  """(encode, vocab size reached): a byte-level BPE trained on ``texts``, saved in ``out``."""
  from tokenizers import Tokenizer as BPETokenizer  # only bpe datasets need the package
  from tokenizers import decoders, models, pre_tokenizers, trainers

  bpe = BPETokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  bpe.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      special_tokens=[], show_progress=False))
  _replace(os.path.join(out, 'tokenizer.json'), bpe.to_str().encode())

  def encode(docs: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, dtype=np.int64) for e in bpe.encode_batch(docs)]

  return encode, bpe.get_vocab_size()
