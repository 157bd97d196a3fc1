"""Tokenized text on disk: a directory of flat token files, read as random windows by step.

A dataset is a directory holding, for each split (``train``, ``val``):

* ``SPLIT.bin``: every document's token ids, document after document, little-endian
  ``uint16`` when the vocabulary fits in 65,536 ids, else ``uint32``;
* ``SPLIT.json``: its header::

    {"format": "hetjax-tokens", "version": 1, "dtype": "uint16", "vocab_size": 256,
     "num_tokens": 7612345, "tokenizer": "bytes", "documents": [0, 4812, 9034, ...]}

  ``documents`` holds the start offset of each document (ascending, the first 0); document
  ``i`` is ``tokens[documents[i]:documents[i + 1]]``, the last one runs to ``num_tokens``. The
  offsets stay in the header: a million documents make a header of a few megabytes that reads
  in a fraction of a second, and one file per split stays readable by eye. A corpus far past
  that would move them to a ``SPLIT.docs.npy`` beside it (version 2). A ``pretrained`` dataset's
  header also holds ``eos_id``, the id that ends each of its documents. Keys the reader does not
  know are ignored.

A ``bpe`` or ``pretrained`` dataset also holds ``tokenizer.json``, the `tokenizers` package's
file (a ``pretrained`` one's copied from the Hugging Face tokenizer it was encoded with), to
encode prompts and decode samples with; a ``bytes`` dataset's ids are the bytes themselves (256
ids).

The reader memory-maps ``SPLIT.bin`` (read-only) rather than going through Grain: it needs no
extra dependency, drawing random windows from ``step_rng(seed, step)`` takes a few lines, and
each worker pages in only the windows of its own rows (`TokenDataset.rows`), never the corpus.

Ids are checked against ``vocab_size`` where they are read (each batch's windows, a max over a
few thousand numbers), not by scanning the whole file on open, which would read every page of
a large corpus; `write_token_split` checks every id before it writes.

Example::

  >>> header = write_token_split('data/text', 'train', np.frombuffer(b'hello world', np.uint8),
  ...                            documents=[0, 6], vocab_size=256, tokenizer='bytes')
  >>> ds = read_token_dataset('data/text', seq_len=4)
  >>> ds.num_tokens, ds.num_documents, ds.global_batch(seed=0, step=0, size=2)['tokens'].shape
  (11, 2, (2, 5))
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import re
import tempfile
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError, parse_choice
from hetjax.data._source import Batch, step_rng

FORMAT = 'hetjax-tokens'
VERSION = 1
_DTYPES = {'uint16': np.dtype('<u2'), 'uint32': np.dtype('<u4')}
_SPLIT_NAME = re.compile(r'[A-Za-z0-9_-]+')
TOKENIZER = 'tokenizer.json'  # a bpe or pretrained dataset's tokenizer, beside its splits


class Tokenizer(enum.StrEnum):
  """How a dataset's text became ids."""

  BYTES = 'bytes'  # the raw bytes: 256 ids
  BPE = 'bpe'  # byte-level BPE, its merges in the dataset's tokenizer.json
  PRETRAINED = 'pretrained'  # a Hugging Face tokenizer, its tokenizer.json copied into the dataset


class TokenDataset:
  """One split of a token dataset: windows of ``seq_len + 1`` tokens inside one document.

  Row ``r`` of step ``step``'s batch is a window whose start is drawn uniformly over every
  position where ``seq_len + 1`` tokens fit inside one document (a window never crosses into
  the next document), from `step_rng(seed, step)` alone: the batch depends on
  ``(seed, step, size)`` only. Inputs are ``tokens[:, :-1]``, next-token targets
  ``tokens[:, 1:]``. Made by `read_token_dataset`.

  Example::

    >>> ds = read_token_dataset('data/text', split='train', seq_len=128)
    >>> batch = ds.global_batch(seed=0, step=7, size=32)['tokens']      # int32[32, 129]
    >>> np.array_equal(batch[8:16], ds.read_rows(seed=0, step=7, size=32, lo=8, hi=16)['tokens'])
    True

  Attributes:
    path: the dataset directory, as given.
    split: ``'train'``, ``'val'``, …
    seq_len: model context length; rows hold ``seq_len + 1`` tokens.
    vocab_size: ids lie in ``[0, vocab_size)``.
    tokenizer: a `Tokenizer`.
    num_tokens: the split's length in tokens.
    num_documents: how many documents it holds.
    num_windows: how many windows a row is drawn from (the valid starts).
    tokens: the read-only memory map of ``SPLIT.bin`` (uint16 or uint32[num_tokens]).
    documents: int64[num_documents], each document's start offset.
  """

  def __init__(self, path: str, split: str, tokens: np.ndarray, documents: np.ndarray,
               vocab_size: int, tokenizer: Tokenizer, seq_len: int):
    self.path, self.split, self.seq_len = path, split, seq_len
    self.vocab_size, self.tokenizer = vocab_size, tokenizer
    self.tokens, self.documents = tokens, documents
    self.num_tokens, self.num_documents = len(tokens), len(documents)
    lengths = np.diff(documents, append=len(tokens))
    if seq_len < 1:
      raise ConfigError(f'seq_len must be at least 1, got {seq_len}')
    if lengths.max() < seq_len + 1:
      raise ConfigError(
          f'seq_len {seq_len} is longer than any document in {self._where} (longest: '
          f'{lengths.max()} tokens; a window holds seq_len + 1 = {seq_len + 1})')
    counts = np.maximum(lengths - seq_len, 0)
    fits = counts > 0
    self._first_start = documents[fits]
    self._window_end = np.cumsum(counts[fits])  # windows of documents up to this one
    self._window_begin = self._window_end - counts[fits]
    self.num_windows = int(self._window_end[-1])

  @property
  def _where(self) -> str:
    return os.path.join(self.path, self.split)

  def starts(self, seed: int, step: int, size: int) -> np.ndarray:
    """int64[size]: the token offset where each row of step ``step``'s batch starts."""
    if size < 0:
      raise ConfigError(f'batch size must be >= 0, got {size}')
    k = step_rng(seed, step).integers(0, self.num_windows, size=size)
    doc = np.searchsorted(self._window_end, k, side='right')
    return self._first_start[doc] + (k - self._window_begin[doc])

  def read_rows(self, seed: int, step: int, size: int, lo: int, hi: int) -> Batch:
    """``{'tokens': int32[hi - lo, seq_len + 1]}``: rows ``lo:hi`` of `global_batch`, reading
    only those (`hetjax.data.RowSource`).

    Every start is drawn (cheap) and only the windows of rows ``lo:hi`` are read from the memory
    map, so a worker's share costs the pages of its own rows.

    Raises:
      ConfigError: ``lo:hi`` is not within ``[0, size]``; an id in the rows read is not below
        ``vocab_size`` (a damaged file).
    """
    if not 0 <= lo <= hi <= size:
      raise ConfigError(f'rows {lo}:{hi} do not lie within a batch of {size}')
    starts = self.starts(seed, step, size)[lo:hi]
    windows = self.tokens[starts[:, None] + np.arange(self.seq_len + 1)].astype(np.int32)
    if windows.size and windows.max() >= self.vocab_size:
      row, col = np.argwhere(windows >= self.vocab_size)[0]
      raise ConfigError(
          f'{self._where}.bin: token id {windows[row, col]} at offset {starts[row] + col} is not '
          f'below vocab_size {self.vocab_size}')
    return {'tokens': windows}

  def global_batch(self, seed: int, step: int, size: int) -> Batch:
    """Returns ``{'tokens': int32[size, seq_len + 1]}`` (class docstring)."""
    return self.read_rows(seed, step, size, 0, size)


def read_token_dataset(path: str | os.PathLike, *, split: str = 'train',
                       seq_len: int) -> TokenDataset:
  """Split ``split`` of the token dataset in directory ``path`` (module docstring), mapped.

  Args:
    path: the dataset directory (what `prepare_text` wrote).
    split: which split, ``'train'`` or ``'val'``.
    seq_len: model context length; rows hold ``seq_len + 1`` tokens.

  Returns:
    A `TokenDataset` (a `DataSource`) over the memory-mapped tokens.

  Raises:
    ConfigError: no such directory or split; a header that does not match the format or its
      ``.bin`` file (format, version, dtype, vocab_size, tokenizer, num_tokens against the file's
      size, document offsets); ``seq_len`` longer than every document. One line each, naming the
      file.
  """
  shown = os.fspath(path)
  if not os.path.exists(shown):
    raise ConfigError(f'token dataset {shown} does not exist{_nearby(shown)}; make one with: '
                      f'python experiments/prepare_text.py --source=DIR --out={shown} '
                      '(hetjax.data.prepare_text)')
  if not os.path.isdir(shown):
    raise ConfigError(f'token dataset {shown} is not a directory')
  where = os.path.join(shown, _split_name(split))
  if not os.path.isfile(f'{where}.json'):
    have = ', '.join(_splits(shown)) or 'none'
    raise ConfigError(f'token dataset {shown} has no split {split!r} (no {where}.json; '
                      f'splits: {have})')
  try:
    with open(f'{where}.json', encoding='utf-8') as f:
      header = json.load(f)
  except (OSError, ValueError) as e:
    reason = ' '.join(str(e).split())
    raise ConfigError(f'{where}.json does not read as a JSON header: {reason}') from None
  dtype, vocab_size, tokenizer, num_tokens, documents = _check_header(header, f'{where}.json')
  if tokenizer is not Tokenizer.BYTES and not os.path.isfile(os.path.join(shown, TOKENIZER)):
    raise ConfigError(f'{where}.json names a {tokenizer} tokenizer but {shown} has no '
                      'tokenizer.json')
  if not os.path.isfile(f'{where}.bin'):
    raise ConfigError(f'{where}.bin does not exist (its header {where}.json does)')
  size = os.path.getsize(f'{where}.bin')
  if size != num_tokens * dtype.itemsize:
    raise ConfigError(
        f'{where}.bin holds {size} bytes, not num_tokens {num_tokens} × {dtype.itemsize} bytes '
        f'({dtype.name}) as {where}.json says')
  tokens = np.memmap(f'{where}.bin', dtype=dtype, mode='r', shape=(num_tokens,))
  return TokenDataset(shown, split, tokens.view(np.ndarray), documents, vocab_size, tokenizer,
                      seq_len)


def write_token_split(directory: str | os.PathLike, split: str, tokens: np.ndarray,
                      documents: Sequence[int] | np.ndarray, vocab_size: int,
                      tokenizer: Tokenizer | str, eos_id: int | None = None) -> dict:
  """Writes ``SPLIT.bin`` and ``SPLIT.json`` into ``directory`` (made if missing), atomically.

  Each file is written under a temporary name and renamed over the old one (`os.replace`), so a
  reader never sees half a file; the ``.bin`` goes first, so a reader between the two renames
  meets a size that does not match its header, an error rather than wrong tokens.

  Args:
    directory: the dataset directory.
    split: the split's name (``'train'``, ``'val'``; letters, digits, ``_`` and ``-``).
    tokens: the ids of every document, concatenated (any integer dtype).
    documents: each document's start offset in ``tokens``, ascending, the first 0.
    vocab_size: the vocabulary's size; stored as uint16 when it is at most 65,536, else uint32.
    tokenizer: ``'bytes'``, ``'bpe'`` or ``'pretrained'`` (the ``tokenizer.json`` of a bpe or
      pretrained dataset is the caller's).
    eos_id: the id that ends each document, recorded in the header; None (bytes, bpe) writes no
      ``eos_id`` key.

  Returns:
    The header written.

  Raises:
    ConfigError: tokens that are not integers in ``[0, vocab_size)``, or offsets or a header
      the reader would refuse.
  """
  tokens = np.asarray(tokens)
  where = os.path.join(os.fspath(directory), _split_name(split))
  if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
    raise ConfigError(f'{where}: tokens must be a flat integer array, got {tokens.dtype}'
                      f'{list(tokens.shape)}')
  dtype = 'uint16' if isinstance(vocab_size, int) and vocab_size <= 2 ** 16 else 'uint32'
  header = {'format': FORMAT, 'version': VERSION, 'dtype': dtype, 'vocab_size': vocab_size,
            'num_tokens': len(tokens), 'tokenizer': str(tokenizer),
            'documents': [int(d) for d in documents]}
  if eos_id is not None:
    header['eos_id'] = eos_id
  _check_header(header, f'{where}.json')
  if tokens.min() < 0 or tokens.max() >= vocab_size:
    bad = int(np.argmax((tokens < 0) | (tokens >= vocab_size)))
    raise ConfigError(f'{where}: token id {tokens[bad]} at offset {bad} is not in '
                      f'[0, vocab_size {vocab_size})')
  os.makedirs(os.path.dirname(where) or '.', exist_ok=True)
  _replace(f'{where}.bin', np.ascontiguousarray(tokens, dtype=_DTYPES[dtype]))
  _replace(f'{where}.json', json.dumps(header).encode())
  return header


def check_vocab(dataset: TokenDataset, model_vocab: int) -> None:
  """Refuses a dataset whose ids would index past a model's embedding table.

  Example::

    >>> check_vocab(read_token_dataset('data/bpe', seq_len=64), model_vocab=256)
    Traceback (most recent call last):
    ConfigError: token dataset data/bpe/train has vocab_size 4096, more than the model's 256 (...)

  Raises:
    ConfigError: ``dataset.vocab_size > model_vocab``.
  """
  if dataset.vocab_size > model_vocab:
    raise ConfigError(
        f'token dataset {os.path.join(dataset.path, dataset.split)} has vocab_size '
        f'{dataset.vocab_size}, more than the model\'s {model_vocab} (give the model a vocab of '
        f'at least {dataset.vocab_size})')


def _check_header(header: object, name: str
                  ) -> tuple[np.dtype, int, Tokenizer, int, np.ndarray]:
  """(dtype, vocab_size, tokenizer, num_tokens, documents) of a valid header, else one line."""
  if not isinstance(header, dict):
    raise ConfigError(f'{name}: the header must be a JSON object')
  missing = [k for k in ('format', 'version', 'dtype', 'vocab_size', 'num_tokens', 'tokenizer',
                         'documents') if k not in header]
  if missing:
    raise ConfigError(f'{name}: the header lacks {", ".join(missing)}')
  if header['format'] != FORMAT or header['version'] != VERSION:
    raise ConfigError(f'{name}: format {header["format"]!r} version {header["version"]!r} is not '
                      f'{FORMAT!r} version {VERSION}')
  if header['dtype'] not in _DTYPES:
    raise ConfigError(f'{name}: dtype {header["dtype"]!r} is not uint16 or uint32')
  dtype = _DTYPES[header['dtype']]
  vocab_size, num_tokens = header['vocab_size'], header['num_tokens']
  if not _is_int(vocab_size) or not 1 <= vocab_size <= 2 ** (8 * dtype.itemsize):
    raise ConfigError(f'{name}: vocab_size {vocab_size!r} is not a whole number in '
                      f'[1, {2 ** (8 * dtype.itemsize)}] (dtype {dtype.name})')
  try:
    tokenizer = parse_choice(Tokenizer, header['tokenizer'], 'tokenizer')
  except ConfigError as e:
    raise ConfigError(f'{name}: {e}') from None
  if tokenizer is Tokenizer.BYTES and vocab_size != 256:
    raise ConfigError(f'{name}: a bytes tokenizer has vocab_size 256, not {vocab_size}')
  if 'eos_id' in header and not (_is_int(header['eos_id']) and
                                 0 <= header['eos_id'] < vocab_size):
    raise ConfigError(f'{name}: eos_id {header["eos_id"]!r} is not a whole number in '
                      f'[0, vocab_size {vocab_size})')
  if not _is_int(num_tokens) or num_tokens < 1:
    raise ConfigError(f'{name}: num_tokens {num_tokens!r} is not a positive whole number')
  offsets = header['documents']
  if not isinstance(offsets, list) or not offsets or not all(_is_int(d) for d in offsets):
    raise ConfigError(f'{name}: documents must be a non-empty list of start offsets')
  documents = np.asarray(offsets, dtype=np.int64)
  if documents[0] != 0:
    raise ConfigError(f'{name}: documents must start at offset 0, not {documents[0]}')
  if len(documents) > 1 and (np.diff(documents) <= 0).any():
    at = int(np.argmax(np.diff(documents) <= 0))
    raise ConfigError(f'{name}: document offsets are not ascending: {documents[at]} then '
                      f'{documents[at + 1]} (documents {at} and {at + 1})')
  if documents[-1] >= num_tokens:
    raise ConfigError(f'{name}: document offset {documents[-1]} is out of range for '
                      f'num_tokens {num_tokens}')
  return dtype, vocab_size, tokenizer, num_tokens, documents


def _is_int(value: object) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _split_name(split: str) -> str:
  if not isinstance(split, str) or not _SPLIT_NAME.fullmatch(split):
    raise ConfigError(f'split {split!r} must be a name of letters, digits, _ and - ("train")')
  return split


def _splits(directory: str) -> list[str]:
  """The splits in ``directory``: names with both a ``.json`` and a ``.bin`` file."""
  names = os.listdir(directory)
  return sorted(n[:-5] for n in names if n.endswith('.json') and n[:-5] + '.bin' in names)


def _nearby(missing: str) -> str:
  """``' (did you mean data/mytext?)'`` for a mistyped ``data/mytxt``: the token dataset
  beside it with the closest name, or ''."""
  parent, name = os.path.split(os.path.normpath(missing))
  try:
    siblings = os.listdir(parent or '.')
  except OSError:
    return ''
  for close in difflib.get_close_matches(name, siblings, n=3, cutoff=0.6):
    if _is_dataset(os.path.join(parent, close)):
      return f' (did you mean {os.path.join(parent, close)}?)'
  return ''


def _is_dataset(directory: str) -> bool:
  try:
    return os.path.isdir(directory) and bool(_splits(directory))
  except OSError:  # a folder we may not list is no dataset to suggest
    return False


def _replace(path: str, data: bytes | np.ndarray) -> None:
  """Writes ``data`` to ``path`` through a temporary file in the same directory."""
  directory, name = os.path.split(path)
  fd, tmp = tempfile.mkstemp(prefix=f'.{name}.', dir=directory or '.')
  try:
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the dataset from other users
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
