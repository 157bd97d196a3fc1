"""Text and a token dataset's ids, both ways: what a prompt is encoded with and a sample decoded
with (`hetjax.run.generate`, ``hetjax-evaluate --sample``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from hetjax.data._token_file import TOKENIZER


@dataclasses.dataclass(frozen=True)
class TextCodec:
  """Text ↔ token ids of a run's data: UTF-8 bytes (256 ids), or a dataset's `tokenizers` file.

  Attributes:
    tokenizer: the ``tokenizers.Tokenizer`` of a ``bpe`` or ``pretrained`` dataset; None:
      bytes.
  """

  tokenizer: object | None = None

  def encode(self, text: str) -> list[int]:
    if self.tokenizer is None:
      return list(text.encode('utf-8'))
    return list(self.tokenizer.encode(text).ids)

  def decode(self, ids: Sequence[int]) -> str:
    """The text of ``ids``; bytes that are not UTF-8 (and ids past 255, under bytes) read as
    U+FFFD."""
    ids = [int(i) for i in ids]
    if self.tokenizer is not None:
      return self.tokenizer.decode(ids)
    return b''.join(bytes([i]) if i < 256 else '\ufffd'.encode() for i in ids).decode(
        'utf-8', errors='replace')


def text_codec(data: str | os.PathLike | None) -> TextCodec:
  """The codec of a model's ``data`` argument: None (the stdlib bytes) or a token dataset
  directory without ``tokenizer.json`` (a ``bytes`` dataset) encode UTF-8 bytes; one with it
  (a ``bpe`` or ``pretrained`` dataset, `hetjax.data.prepare_text`) its tokenizer.

  Example::

    codec = hetjax.data.text_codec('data/mytext')
    codec.decode(codec.encode('def f():'))   # 'def f():'
  """
  if data is None:
    return TextCodec()
  path = os.path.join(os.fspath(data), TOKENIZER)
  if not os.path.isfile(path):
    return TextCodec()
  from tokenizers import Tokenizer  # only datasets with a tokenizer need the package

  return TextCodec(Tokenizer.from_file(path))
