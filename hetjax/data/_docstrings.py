"""Bags of words from the standard library's docstrings and comments, offline (topic models).

One document is one top-level unit of a module: the module's own docstring and the comments
before its first definition, or one top-level ``def``/``class`` with every docstring and comment
up to the next one (a class and its methods are one document — they share a topic, as a news
article's paragraphs do). Text is read from the running interpreter's library directory with
`tokenize`: comments, and strings that stand alone as a statement (docstrings, and the
attribute docs some modules write).

Words are lower-cased runs of letters (``get_value`` gives ``get`` and ``value``) of at least
three letters; stop words (English, and Python's ``self``/``none``/``true`` …) are dropped.
Files are visited in an order fixed by ``seed`` and their documents taken in turn (each at most
``max_length`` words, none shorter than ``min_length``) until there are ``documents``; the
vocabulary is then the ``vocabulary`` most frequent words that occur in at least
``min_documents`` of them (rare words dropped), most frequent first, and documents keep only
those words. The codec tables of ``encodings/`` (one comment per character) and the test suites
are left out.

Sizes on CPython 3.11.7: the full corpus (``documents=None``, 552 files, seconds to read) has
3,200 documents; with a vocabulary of 5,000 words they hold 195,409 tokens (6,455 words occur
in two documents or more: 198,751 tokens). The default, 256 documents and 1,000 words, has
13,031 tokens from 31 files (a small part of that read time); 64 documents and 300 words, 2,430
tokens.

Example::

  >>> docs = stdlib_docstrings(documents=64, vocabulary=300)
  >>> docs.num_documents, len(docs.vocabulary), docs.num_tokens
  (64, 300, 2430)
  >>> docs.sources[0], [docs.vocabulary[w] for w in docs.document(0)[:3]]
  ('lib2to3/patcomp.py', ['pattern', 'compiler', 'taken'])
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import os
import re
import sysconfig
import tokenize

import numpy as np

from hetjax._errors import ConfigError

_SKIP_DIRS = frozenset({'site-packages', 'test', 'tests', 'idlelib', 'encodings'})
_WORD = re.compile(r'[a-z]{3,}')
_STOP_WORDS = frozenset({
    'about', 'above', 'after', 'again', 'against', 'all', 'also', 'although', 'among', 'and',
    'another', 'any', 'are', 'aren', 'around', 'because', 'been', 'before', 'being', 'below',
    'between', 'both', 'but', 'can', 'cannot', 'could', 'did', 'does', 'doesn', 'doing', 'done',
    'down', 'during', 'each', 'either', 'else', 'etc', 'even', 'ever', 'every', 'few', 'for',
    'from', 'further', 'had', 'has', 'hasn', 'have', 'having', 'her', 'here', 'hers', 'herself',
    'him', 'himself', 'his', 'how', 'however', 'into', 'isn', 'its', 'itself', 'just', 'may',
    'might', 'more', 'most', 'much', 'must', 'neither', 'nor', 'not', 'now', 'off', 'once', 'one',
    'only', 'other', 'otherwise', 'our', 'ours', 'ourselves', 'out', 'over', 'own', 'per', 'rather',
    'same', 'shall', 'she', 'should', 'since', 'some', 'still', 'such', 'than', 'that', 'the',
    'their', 'theirs', 'them', 'themselves', 'then', 'there', 'these', 'they', 'this', 'those',
    'though', 'through', 'thus', 'too', 'under', 'until', 'upon', 'use', 'used', 'uses', 'using',
    'very', 'was', 'wasn', 'way', 'were', 'weren', 'what', 'when', 'where', 'whether', 'which',
    'while', 'who', 'whom', 'whose', 'why', 'will', 'with', 'within', 'without', 'would', 'yet',
    'you', 'your', 'yours', 'yourself', 'yourselves', 'self', 'none', 'true', 'false', 'def', 'cls',
    'args', 'kwargs', 'elif', 'xxx', 'todo',
})
_STATEMENT_START = frozenset({tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENCODING})
_SKIPPED = frozenset({tokenize.NL, tokenize.COMMENT})


@dataclasses.dataclass(frozen=True, eq=False)
class Documents:
  """Documents as sequences of word ids (a corpus for topic models).

  Attributes:
    tokens: int32[num_tokens], every document's word ids, document after document.
    offsets: int64[num_documents + 1]; document i is ``tokens[offsets[i]:offsets[i + 1]]``.
    vocabulary: the word of each id, most frequent first (id 0 is the commonest word).
    sources: where each document comes from, ``'json/decoder.py:JSONDecoder'`` (a top-level
      definition) or ``'json/decoder.py'`` (the module's own docstring and comments).
  """

  tokens: np.ndarray
  offsets: np.ndarray
  vocabulary: tuple[str, ...]
  sources: tuple[str, ...]

  @property
  def num_documents(self) -> int:
    return len(self.offsets) - 1

  @property
  def num_tokens(self) -> int:
    return len(self.tokens)

  @property
  def lengths(self) -> np.ndarray:
    """int64[num_documents], each document's token count."""
    return np.diff(self.offsets)

  def document(self, i: int) -> np.ndarray:
    """Document ``i``'s word ids, in reading order."""
    return self.tokens[self.offsets[i]:self.offsets[i + 1]]


def _library_files() -> list[str]:
  """The library's ``.py`` files (relative paths), walked in sorted order."""
  root = sysconfig.get_paths()['stdlib']
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    files += [os.path.relpath(os.path.join(dirpath, name), root)
              for name in sorted(filenames) if name.endswith('.py')]
  return files


@functools.lru_cache(maxsize=1024)
def _units(path: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
  """``(source, words)`` of each top-level unit of one file with any words (module docstring).

  A unit starts at a ``def`` or ``class`` at indentation 0 and runs to the next; what comes
  before the first one is the module's unit. A file that does not tokenize gives nothing.
  """
  with open(os.path.join(sysconfig.get_paths()['stdlib'], path), 'rb') as f:
    source = f.read()
  try:
    tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
  except (tokenize.TokenError, SyntaxError):
    return ()
  text: dict[str, list[str]] = collections.defaultdict(list)
  unit, depth, last = path, 0, tokenize.ENCODING
  for i, tok in enumerate(tokens):
    depth += (tok.type == tokenize.INDENT) - (tok.type == tokenize.DEDENT)
    if depth == 0 and last in _STATEMENT_START and tok.string in ('def', 'class'):
      unit = f'{path}:{tokens[i + 1].string}'
    if tok.type == tokenize.COMMENT:
      text[unit].append(tok.string)
    elif tok.type == tokenize.STRING and last in _STATEMENT_START:
      j = i + 1
      while tokens[j].type in (tokenize.STRING, tokenize.NL, tokenize.COMMENT):
        j += 1
      if tokens[j].type in (tokenize.NEWLINE, tokenize.ENDMARKER):  # a string statement
        text[unit].append(tok.string)
    if tok.type not in _SKIPPED:
      last = tok.type
  out = []
  for name, parts in text.items():
    words = tuple(w for w in _WORD.findall(' '.join(parts).lower()) if w not in _STOP_WORDS)
    if words:
      out.append((name, words))
  return tuple(out)


@functools.lru_cache(maxsize=8)
def stdlib_docstrings(documents: int | None = 256, vocabulary: int = 1000, seed: int = 0, *,
                      min_length: int = 8, max_length: int = 400, min_documents: int = 2
                      ) -> Documents:
  """The standard library's docstrings and comments as ``documents`` bags of words (module
  docstring).

  Args:
    documents: how many documents (None: every one there is).
    vocabulary: the most words kept (fewer when fewer occur in ``min_documents`` documents).
    seed: the order files are visited in, so which documents are taken.
    min_length: documents with fewer words (stop words dropped) are not taken.
    max_length: longer documents keep their first ``max_length`` words.
    min_documents: words in fewer of the documents taken are dropped (rare words).

  Raises:
    ConfigError: a size below 1 (``min_length`` above ``max_length``), or more documents asked
      than the library has.
  """
  if documents is not None and documents < 1:
    raise ConfigError(f'stdlib_docstrings needs documents >= 1 (or None: all), got {documents}')
  if vocabulary < 1 or min_length < 1 or max_length < min_length or min_documents < 1:
    raise ConfigError(
        f'stdlib_docstrings needs vocabulary, min_length, min_documents >= 1 and max_length >= '
        f'min_length, got {vocabulary}, {min_length}, {min_documents} and {max_length}')
  files = _library_files()
  picked: list[tuple[str, tuple[str, ...]]] = []
  for index in np.random.default_rng(seed).permutation(len(files)):
    picked += [(name, words[:max_length]) for name, words in _units(files[index])
               if len(words) >= min_length]
    if documents is not None and len(picked) >= documents:
      picked = picked[:documents]
      break
  else:
    if documents is not None:
      raise ConfigError(f'the standard library has {len(picked)} documents of at least '
                        f'{min_length} words, fewer than the {documents} asked for')
  counts = collections.Counter(w for _, words in picked for w in words)
  spread = collections.Counter(w for _, words in picked for w in set(words))
  kept = sorted((w for w in counts if spread[w] >= min_documents), key=lambda w: (-counts[w], w))
  words = tuple(kept[:vocabulary])
  ids = {w: i for i, w in enumerate(words)}
  docs = [np.array([ids[w] for w in doc if w in ids], np.int32) for _, doc in picked]
  tokens = np.concatenate(docs) if docs else np.zeros(0, np.int32)
  offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
  tokens.flags.writeable = offsets.flags.writeable = False  # shared by every cached caller
  return Documents(tokens, offsets, words, tuple(name for name, _ in picked))
