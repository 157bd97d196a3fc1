"""A folder of text files made into a token dataset (`read_token_dataset`'s format), offline.

The folder is walked in sorted order (directories named in ``SKIP_DIRS`` and hidden ones left
out), so the same folder gives the same dataset on every machine. The default folder is the
running interpreter's standard library (its ``.py`` files: real text on every machine, nothing
downloaded). Each file whose name matches ``pattern`` gives documents:

* a ``.jsonl`` file: one document per line, the string in its ``text_field`` (``'text'``);
  blank lines are passed over, a line that is not JSON or lacks the field is an error;
* a ``.parquet`` file (needs ``pyarrow``): one document per row, the string in its column
  ``text_field``;
* any other file (``.py``, ``.md``, ``.txt``, …): the whole file is one document.

Empty documents are left out.

Tokenizers:

* ``bytes``: a document's raw bytes are its ids (256 ids; a file need not be UTF-8);
* ``bpe``: a byte-level BPE of ``vocab_size`` ids trained with the `tokenizers` package on the
  train documents only (val stays unseen) and saved as ``tokenizer.json`` beside the splits;
  files that are not UTF-8 are skipped;
* a path: a pretrained Hugging Face tokenizer, the ``tokenizer.json`` file itself or a model
  folder holding it (a downloaded Llama or Qwen checkpoint). Its vocabulary is the dataset's;
  its ``tokenizer.json`` is copied beside the splits and the header names it ``pretrained``.
  Each document is encoded as the tokenizer does by default (``add_special_tokens=True``: a
  post-processor that starts a sequence with BOS, as Llama 3's does, keeps doing so, as Hugging
  Face's training scripts have it) and then ended with the EOS id, unless the encoding already
  ends with it; truncation and padding set in the file are turned off. Files that are not UTF-8
  are skipped.

The EOS id of a pretrained tokenizer is, first found: ``eos_id`` as given; the ``eos_token`` of
``tokenizer_config.json`` in the folder holding ``tokenizer.json`` (a string, or a dict with
``content``); the ``eos_token_id`` of ``config.json`` there (the first of a list); the first
special token of the tokenizer among ``EOS_TOKENS``. None found is an error asking for
``eos_id``. The header records it as ``eos_id``.

The val split holds ``val_fraction`` of the documents (rounded, at least one): those whose
key has the smallest seeded hash, the key of a whole file being its relative path and that of a
line or row ``PATH#INDEX`` (its index in the file from 0). A document's split thus depends on
its key and the seed, not on the walk order, and a document held out from a small corpus tends
to stay held out when the corpus grows (``max_bytes`` raised, files added).

Example::

  >>> summary = prepare_text(None, 'data/stdlib', max_bytes=8_000_000)  # stdlib, CPython 3.11.7
  >>> summary['splits']['train']['documents'], summary['vocab_size']
  (414, 256)
  >>> ds = read_token_dataset('data/stdlib', split='val', seq_len=256)
  >>> prepare_text('corpus', 'data/llama', tokenizer='models/Llama-3.2-1B', pattern='*.jsonl')
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sysconfig
from collections.abc import Iterator, Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.data._token_file import Tokenizer, _replace, _splits, write_token_split

#: directories the walk leaves out (besides hidden ones): installed packages, test suites
SKIP_DIRS = frozenset({'site-packages', '__pycache__', 'test', 'tests', 'idlelib'})
#: special tokens taken as a pretrained tokenizer's EOS, first held first, when neither
#: ``eos_id`` nor the model folder's ``tokenizer_config.json`` or ``config.json`` names one
EOS_TOKENS = ('</s>', '<|endoftext|>', '<|end_of_text|>', '<|eot_id|>', '<|im_end|>')
_BPE_VOCAB = 4096  # bpe's vocab_size when none is given
_NAMED = (Tokenizer.BYTES, Tokenizer.BPE)  # tokenizers given by name, the others by path


def default_source_dir() -> str:
  """The running interpreter's standard library directory (`sysconfig`'s ``stdlib``)."""
  return sysconfig.get_paths()['stdlib']


def prepare_text(source_dir: str | os.PathLike | None, out_dir: str | os.PathLike, *,
                 tokenizer: Tokenizer | str | os.PathLike = Tokenizer.BYTES,
                 vocab_size: int | None = None, eos_id: int | None = None,
                 val_fraction: float = 0.05, pattern: str | Sequence[str] = '*.py',
                 text_field: str = 'text', max_bytes: int | None = None, seed: int = 0,
                 overwrite: bool = False) -> dict:
  """Tokenizes the files under ``source_dir`` into ``out_dir``'s ``train`` and ``val`` splits.

  Args:
    source_dir: the folder to walk; None for the standard library (`default_source_dir`).
    out_dir: the dataset directory to write (made if missing).
    tokenizer: ``'bytes'``, ``'bpe'``, or the path of a Hugging Face ``tokenizer.json`` or of a
      model folder holding one (module docstring). A folder named ``bytes`` is ``'./bytes'``.
    vocab_size: bpe's vocabulary (at least 257; default 4096); bytes has 256, give None or 256;
      a pretrained tokenizer has its own, give None or that. A small corpus may stop bpe short
      of it: the header records the size it reached.
    eos_id: the id that ends each document of a pretrained tokenizer; None looks it up (module
      docstring). Bytes and bpe documents carry no EOS.
    val_fraction: the share of documents held out as ``val``, in ``[0, 1)``; 0 writes no val.
    pattern: a glob (or several) a file's name must match, e.g. ``'*.py'`` or
      ``['*.md', '*.txt']`` or ``'*.jsonl'``.
    text_field: the field of a ``.jsonl`` line, or the column of a ``.parquet`` file, holding
      a document's text.
    max_bytes: read documents (whole, in walk order) until the next would take the total past
      this: a plain file's size, a line's or row's text in UTF-8.
    seed: picks which documents are held out.
    overwrite: replace the dataset files of a non-empty ``out_dir`` (nothing else there is
      touched); without it a non-empty ``out_dir`` is refused.

  Returns:
    A summary: ``{'path', 'source', 'tokenizer', 'vocab_size', 'eos_id', 'files', 'skipped',
    'splits': {'train': {'documents', 'tokens'}, 'val': {...}}}`` (``tokenizer``: ``'bytes'``,
    ``'bpe'`` or ``'pretrained'``; ``eos_id`` None but for pretrained; ``files``: the files
    documents were read from; ``skipped``: files bpe or a pretrained tokenizer could not decode
    as UTF-8).

  Raises:
    ConfigError: an unknown tokenizer, a tokenizer path that does not exist or read, a bad
      vocab_size, eos_id, val_fraction or max_bytes, no EOS found, a missing source folder, no
      matching files, a ``.jsonl`` line or ``.parquet`` file without ``text_field``, a
      ``.parquet`` file without pyarrow installed, too few documents to hold one out, or a
      non-empty ``out_dir`` without ``overwrite``. One line each.
  """
  tokenizer, tokenizer_file = _tokenizer_choice(tokenizer)
  if tokenizer is Tokenizer.BYTES and vocab_size not in (None, 256):
    raise ConfigError(f'the bytes tokenizer has 256 ids, not vocab_size {vocab_size} '
                      '(vocab_size is for bpe)')
  if tokenizer is Tokenizer.BPE and vocab_size is not None and vocab_size < 257:
    raise ConfigError(f'bpe vocab_size {vocab_size} must be at least 257 (256 bytes and one '
                      'merge)')
  if tokenizer in _NAMED and eos_id is not None:
    raise ConfigError(f'eos_id is for a pretrained tokenizer: {tokenizer} documents carry no '
                      'EOS')
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
  if tokenizer is Tokenizer.PRETRAINED:
    pretrained, vocab, eos_id = _pretrained(tokenizer_file, vocab_size, eos_id)
  patterns = (pattern,) if isinstance(pattern, str) else tuple(pattern)
  documents, files = _read_documents(source, patterns, text_field, max_bytes)
  texts, skipped = documents, 0
  if tokenizer is not Tokenizer.BYTES:
    texts = [(key, text) for key, text in map(_decoded, documents) if text is not None]
    skipped = len(documents) - len(texts)
  if not texts:
    limit = f' within max_bytes {max_bytes}' if max_bytes is not None else ''
    undecodable = f' ({skipped} not UTF-8)' if skipped else ''
    raise ConfigError(f'no files matching {" ".join(patterns)} under {source}{limit}'
                      f'{undecodable}')
  train, val = _hold_out(texts, val_fraction, seed, source)

  os.makedirs(out, exist_ok=True)
  if tokenizer is Tokenizer.BYTES:
    encode, vocab = _encode_bytes, 256
  elif tokenizer is Tokenizer.BPE:
    encode, vocab = _train_bpe(train, vocab_size or _BPE_VOCAB, out)
  else:
    with open(tokenizer_file, 'rb') as f:
      _replace(os.path.join(out, 'tokenizer.json'), f.read())
    encode = _pretrained_encoder(pretrained, eos_id)
  splits = {}
  for split, docs in (('train', train), ('val', val)):
    if docs:
      ids = encode(docs)
      offsets = np.cumsum([0, *(len(d) for d in ids[:-1])])
      write_token_split(out, split, np.concatenate(ids), offsets, vocab, tokenizer, eos_id)
      splits[split] = {'documents': len(ids), 'tokens': int(sum(len(d) for d in ids))}
  stale = [f'{s}.{x}' for s in _splits(out) if s not in splits and s in ('train', 'val')
           for x in ('bin', 'json')]
  stale += ['tokenizer.json'] if tokenizer is Tokenizer.BYTES else []
  for name in stale:  # left by an earlier dataset in this folder (overwrite=True)
    if os.path.exists(os.path.join(out, name)):
      os.remove(os.path.join(out, name))
  return {'path': out, 'source': source, 'tokenizer': tokenizer.value, 'vocab_size': vocab,
          'eos_id': eos_id, 'files': files, 'skipped': skipped, 'splits': splits}


def _tokenizer_choice(value: object) -> tuple[Tokenizer, str | None]:
  """(bytes or bpe, None), or (pretrained, the path of its ``tokenizer.json``)."""
  if value in _NAMED:
    return Tokenizer(value), None
  name = os.fspath(value) if isinstance(value, str | os.PathLike) else None
  if name is not None and os.path.isdir(name):
    if not os.path.isfile(os.path.join(name, 'tokenizer.json')):
      raise ConfigError(f'tokenizer folder {name} holds no tokenizer.json (a Hugging Face '
                        'tokenizer\'s file)')
    return Tokenizer.PRETRAINED, os.path.join(name, 'tokenizer.json')
  if name is not None and os.path.isfile(name):
    return Tokenizer.PRETRAINED, name
  if name is not None and ('/' in name or os.sep in name or name.endswith('.json')):
    raise ConfigError(f'tokenizer {name} does not exist (a tokenizer.json, or a model folder '
                      'holding one)')
  shown = value.value if isinstance(value, Tokenizer) else value
  raise ConfigError(f'unknown tokenizer {shown!r}; choose one of: bytes, bpe, or the path of a '
                    'tokenizer.json or of a model folder holding one')


def _pretrained(file: str, vocab_size: int | None, eos_id: int | None):
  """(tokenizer, vocab size, EOS id) of the Hugging Face ``tokenizer.json`` at ``file``."""
  from tokenizers import Tokenizer as HFTokenizer  # only bpe and pretrained need the package

  try:
    tokenizer = HFTokenizer.from_file(file)
  except Exception as e:  # the package raises a bare Exception for a file it cannot parse
    reason = ' '.join(str(e).split())
    raise ConfigError(f'{file} does not read as a Hugging Face tokenizer.json: {reason}') from None
  tokenizer.no_truncation()  # a file may set them for inference; documents stay whole
  tokenizer.no_padding()
  ids = tokenizer.get_vocab(with_added_tokens=True).values()
  vocab = max(tokenizer.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
  if vocab_size is not None and vocab_size != vocab:
    raise ConfigError(f'vocab_size {vocab_size} is not the {vocab} ids of the pretrained '
                      f'tokenizer {file} (leave vocab_size out)')
  eos = _find_eos(tokenizer, file) if eos_id is None else eos_id
  if isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < vocab:
    raise ConfigError(f'eos_id {eos!r} is not an id of the pretrained tokenizer {file} '
                      f'([0, {vocab}))')
  return tokenizer, vocab, eos


def _find_eos(tokenizer, file: str) -> int:
  """The EOS id named beside ``file`` or held as a special token (module docstring)."""
  folder = os.path.dirname(file) or '.'
  token = _json_object(os.path.join(folder, 'tokenizer_config.json')).get('eos_token')
  token = token.get('content') if isinstance(token, dict) else token
  if isinstance(token, str):
    eos = tokenizer.token_to_id(token)
    if eos is None:
      raise ConfigError(f'the eos_token {token!r} of {folder}/tokenizer_config.json is not a '
                        f'token of {file} (give eos_id=, --eos_id)')
    return eos
  eos = _json_object(os.path.join(folder, 'config.json')).get('eos_token_id')
  eos = eos[0] if isinstance(eos, list) and eos else eos
  if isinstance(eos, int) and not isinstance(eos, bool):
    return eos
  special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
  for name in EOS_TOKENS:
    if name in special:
      return special[name]
  raise ConfigError(f'no EOS token found for {file}: no eos_token in tokenizer_config.json or '
                    'eos_token_id in config.json beside it, no special token '
                    f'{" ".join(EOS_TOKENS)} (give eos_id=, --eos_id)')


def _json_object(path: str) -> dict:
  """The JSON object in ``path``; {} when there is no such file or it holds no object."""
  if not os.path.isfile(path):
    return {}
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except (OSError, ValueError) as e:
    reason = ' '.join(str(e).split())
    raise ConfigError(f'{path} does not read as JSON: {reason}') from None
  return value if isinstance(value, dict) else {}


def _pretrained_encoder(tokenizer, eos_id: int):
  def encode(docs: list[str]) -> list[np.ndarray]:
    ids = [e.ids for e in tokenizer.encode_batch(docs)]  # add_special_tokens=True
    return [np.asarray(d if d and d[-1] == eos_id else [*d, eos_id], dtype=np.int64)
            for d in ids]

  return encode


def _encode_bytes(docs: list[bytes | str]) -> list[np.ndarray]:
  return [np.frombuffer(d.encode() if isinstance(d, str) else d, np.uint8) for d in docs]


def _read_documents(source: str, patterns: tuple[str, ...], text_field: str,
                    max_bytes: int | None) -> tuple[list[tuple[str, bytes | str]], int]:
  """((key, text) of each non-empty document in walk order, how many files they came from).

  A whole file's key is its relative path and its text the bytes; a line's or row's key is
  ``PATH#INDEX`` and its text a string.
  """
  found, total, files = [], 0, 0
  for path in _walk(source, patterns):
    rel = os.path.relpath(path, source).replace(os.sep, '/')
    if path.endswith(('.jsonl', '.parquet')):
      read = _jsonl_texts if path.endswith('.jsonl') else _parquet_texts
      before = len(found)
      for index, text in read(path, text_field):
        size = len(text.encode())
        if max_bytes is not None and total + size > max_bytes:
          return found, files + (len(found) > before)
        found.append((f'{rel}#{index}', text))
        total += size
      files += len(found) > before
      continue
    try:
      size = os.path.getsize(path)
      if max_bytes is not None and total + size > max_bytes:
        return found, files
      with open(path, 'rb') as f:
        data = f.read()
    except OSError:  # a dangling link, a file removed during the walk, no permission
      continue
    if data:
      found.append((rel, data))
      total += len(data)
      files += 1
  return found, files


def _walk(source: str, patterns: tuple[str, ...]) -> Iterator[str]:
  """The path of each file under ``source`` whose name matches, in sorted walk order."""
  for dirpath, dirnames, filenames in os.walk(source):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith('.'))
    for name in sorted(filenames):
      if any(fnmatch.fnmatchcase(name, p) for p in patterns):
        yield os.path.join(dirpath, name)


def _jsonl_texts(path: str, field: str) -> Iterator[tuple[int, str]]:
  """(line index, text) of each line of a ``.jsonl`` file with non-empty text, read lazily."""
  try:
    f = open(path, 'rb')  # noqa: SIM115 (closed below; a file that will not open is passed over)
  except OSError:
    return
  with f:
    for index, line in enumerate(f):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        raise ConfigError(f'{path} line {index + 1} is not JSON (or not UTF-8)') from None
      if not isinstance(record, dict) or field not in record:
        raise ConfigError(f'{path} line {index + 1} has no field {field!r} (text_field=, '
                          '--text_field, names the field)')
      if not isinstance(record[field], str):
        raise ConfigError(f'{path} line {index + 1}: field {field!r} is '
                          f'{type(record[field]).__name__}, not a string')
      if record[field]:
        yield index, record[field]


def _parquet_texts(path: str, column: str) -> Iterator[tuple[int, str]]:
  """(row index, text) of each row of a ``.parquet`` file with non-empty text, read lazily."""
  try:
    import pyarrow as pa
    import pyarrow.parquet as pq
  except ImportError:
    raise ConfigError(f'{path} is a parquet file: reading it needs pyarrow (pip install '
                      'pyarrow)') from None
  try:
    f = open(path, 'rb')  # noqa: SIM115 (closed below; a file that will not open is passed over)
  except OSError:
    return
  with f:
    try:
      table = pq.ParquetFile(f)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
      raise ConfigError(f'{path} does not read as parquet: {" ".join(str(e).split())}') from None
    schema = table.schema_arrow
    if column not in schema.names:
      raise ConfigError(f'{path} has no column {column!r} (columns: {", ".join(schema.names)}; '
                        'text_field=, --text_field, names the column)')
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
      raise ConfigError(f'{path}: column {column!r} holds {kind}, not strings')
    index = 0
    for batch in table.iter_batches(batch_size=1024, columns=[column]):
      for text in batch.column(0).to_pylist():
        if text is None:
          raise ConfigError(f'{path} row {index}: column {column!r} is null')
        if text:
          yield index, text
        index += 1


def _decoded(document: tuple[str, bytes | str]) -> tuple[str, str | None]:
  key, text = document
  if isinstance(text, str):
    return key, text
  try:
    return key, text.decode('utf-8')
  except UnicodeDecodeError:
    return key, None


def _hold_out(docs: list[tuple[str, object]], val_fraction: float, seed: int,
              source: str) -> tuple[list, list]:
  """(train, val) contents, each in walk order; val the smallest seeded hashes of the keys."""
  if val_fraction == 0:
    return [d for _, d in docs], []
  if len(docs) < 2:
    raise ConfigError(f'{source} has one matching document: too few to hold out val_fraction '
                      f'{val_fraction} (give more files, or val_fraction 0)')
  num_val = min(len(docs) - 1, max(1, round(val_fraction * len(docs))))
  keys = [hashlib.blake2b(f'{seed}\0{key}'.encode(), digest_size=8).digest() for key, _ in docs]
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
