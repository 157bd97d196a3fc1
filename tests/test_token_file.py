"""Token datasets on disk: windows inside documents, by (seed, step, size), every bad file one
line."""

import itertools
import json
import os

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.data import (
  DataSource,
  TokenDataset,
  Tokenizer,
  check_vocab,
  read_token_dataset,
  write_token_split,
)

DOCS = [b'first document, short', b'a second document that is somewhat longer than the first',
        b'tiny', b'the third real document: windows fit here too']


def _bytes_dataset(directory, docs=DOCS, split='train'):
  offsets = np.cumsum([0, *(len(d) for d in docs[:-1])])
  tokens = np.frombuffer(b''.join(docs), np.uint8)
  return write_token_split(directory, split, tokens, offsets, 256, 'bytes')


def _constant_documents(directory, lengths, seq_len):
  """Document i holds only the id i: a window that crossed a boundary would mix two ids."""
  tokens = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])
  write_token_split(directory, 'train', tokens, np.cumsum([0, *lengths[:-1]]), len(lengths),
                    'bpe')
  (directory / 'tokenizer.json').write_text('{}')
  return read_token_dataset(directory, seq_len=seq_len)


def test_written_and_read_back(tmp_path):
  header = _bytes_dataset(tmp_path)
  assert header == {'format': 'hetjax-tokens', 'version': 1, 'dtype': 'uint16',
                    'vocab_size': 256, 'num_tokens': sum(map(len, DOCS)), 'tokenizer': 'bytes',
                    'documents': [0, 21, 77, 81]}
  assert json.loads((tmp_path / 'train.json').read_text()) == header
  assert sorted(os.listdir(tmp_path)) == ['train.bin', 'train.json']  # no temporary left
  ds = read_token_dataset(tmp_path, seq_len=8)
  assert isinstance(ds, DataSource) and isinstance(ds, TokenDataset)
  assert (ds.path, ds.split, ds.seq_len, ds.vocab_size) == (str(tmp_path), 'train', 8, 256)
  assert ds.tokenizer is Tokenizer.BYTES and ds.tokenizer == 'bytes'
  assert (ds.num_tokens, ds.num_documents) == (header['num_tokens'], 4)
  assert ds.tokens.tobytes()[::2] == b''.join(DOCS)  # little-endian uint16: low byte first
  # every start where 9 bytes fit in one document: 'tiny' (4 bytes) has none
  assert ds.num_windows == sum(len(d) - 8 for d in DOCS if len(d) > 8)


def test_a_large_vocabulary_is_stored_as_uint32(tmp_path):
  tokens = np.array([0, 69_999, 65_536, 5, 70_000 - 2, 1])
  header = write_token_split(tmp_path, 'val', tokens, [0, 3], 70_000, 'bpe')
  (tmp_path / 'tokenizer.json').write_text('{}')
  assert header['dtype'] == 'uint32' and os.path.getsize(tmp_path / 'val.bin') == 4 * 6
  ds = read_token_dataset(tmp_path, split='val', seq_len=2)
  np.testing.assert_array_equal(ds.tokens, tokens)
  assert ds.global_batch(0, 0, 64)['tokens'].max() == 69_999


def test_batch_shape_dtype_and_windows_of_the_tokens(tmp_path):
  _bytes_dataset(tmp_path)
  ds = read_token_dataset(tmp_path, seq_len=8)
  batch = ds.global_batch(seed=0, step=0, size=16)
  assert list(batch) == ['tokens']
  assert batch['tokens'].shape == (16, 9) and batch['tokens'].dtype == np.int32
  text = b''.join(DOCS)
  for row, start in zip(batch['tokens'], ds.starts(0, 0, 16), strict=True):
    assert row.astype(np.uint8).tobytes() == text[start:start + 9]


def test_windows_never_cross_a_document_boundary(tmp_path):
  ds = _constant_documents(tmp_path, [5, 12, 3, 9], seq_len=4)
  tokens = np.concatenate([ds.global_batch(seed=1, step=s, size=64)['tokens'] for s in range(8)])
  assert (tokens == tokens[:, :1]).all()  # each row is one document's id throughout
  assert set(tokens[:, 0]) == {0, 1, 3}  # the 3-token document holds no 5-token window


def test_starts_are_uniform_over_every_valid_start(tmp_path):
  ds = _constant_documents(tmp_path, [3, 8, 5], seq_len=4)
  valid = [3 + 0, 3 + 1, 3 + 2, 3 + 3, 11 + 0]  # 4 windows in the 8-token document, 1 in the 5
  assert ds.num_windows == 5
  starts = np.concatenate([ds.starts(seed=0, step=s, size=500) for s in range(4)])
  values, counts = np.unique(starts, return_counts=True)
  assert values.tolist() == valid
  # each count is Binomial(2000, 1/5): mean 400, sd sqrt(2000 * 0.2 * 0.8) = 17.9; 6 sd = 107
  assert (abs(counts - 400) < 107).all(), counts


def test_batch_is_a_pure_function_of_seed_step_size(tmp_path):
  _bytes_dataset(tmp_path)
  ds = read_token_dataset(tmp_path, seq_len=8)
  a = ds.global_batch(seed=0, step=3, size=8)['tokens']
  np.testing.assert_array_equal(a, ds.global_batch(seed=0, step=3, size=8)['tokens'])
  fresh = read_token_dataset(tmp_path, seq_len=8)  # nothing carried between calls or readers
  np.testing.assert_array_equal(a, fresh.global_batch(seed=0, step=3, size=8)['tokens'])
  assert not np.array_equal(a, ds.global_batch(seed=0, step=4, size=8)['tokens'])
  assert not np.array_equal(a, ds.global_batch(seed=1, step=3, size=8)['tokens'])


@pytest.mark.parametrize('cuts', [[], [5], [1, 2, 3], [0, 0, 10, 13], [13]])
def test_rows_over_any_split_concatenate_to_the_batch(tmp_path, cuts):
  _bytes_dataset(tmp_path)
  ds = read_token_dataset(tmp_path, seq_len=8)
  bounds = [0, *cuts, 13]
  parts = [ds.read_rows(seed=2, step=7, size=13, lo=lo, hi=hi)['tokens']
           for lo, hi in itertools.pairwise(bounds)]
  np.testing.assert_array_equal(np.concatenate(parts),
                                ds.global_batch(seed=2, step=7, size=13)['tokens'])
  assert ds.read_rows(seed=2, step=7, size=13, lo=4, hi=4)['tokens'].shape == (0, 9)


@pytest.mark.parametrize('lo, hi', [(-1, 2), (3, 2), (0, 14)])
def test_rows_outside_the_batch(tmp_path, lo, hi):
  _bytes_dataset(tmp_path)
  with pytest.raises(ConfigError, match=f'rows {lo}:{hi} do not lie within a batch of 13'):
    read_token_dataset(tmp_path, seq_len=8).read_rows(0, 0, 13, lo, hi)


def test_an_id_past_the_vocabulary_is_caught_where_read(tmp_path):
  _bytes_dataset(tmp_path, docs=[b'abcdefghi'])
  raw = bytearray((tmp_path / 'train.bin').read_bytes())
  raw[2 * 5 + 1] = 1  # token 5 becomes ord('f') + 256
  (tmp_path / 'train.bin').write_bytes(bytes(raw))
  ds = read_token_dataset(tmp_path, seq_len=8)  # one window: the whole document
  with pytest.raises(ConfigError, match=r'train.bin: token id 358 at offset 5 is not below '
                                        r'vocab_size 256$'):
    ds.global_batch(0, 0, 1)


def test_check_vocab(tmp_path):
  _bytes_dataset(tmp_path)
  ds = read_token_dataset(tmp_path, seq_len=8)
  check_vocab(ds, 256)
  check_vocab(ds, 50_000)
  with pytest.raises(ConfigError, match="train has vocab_size 256, more than the model's 255"):
    check_vocab(ds, 255)


def test_seq_len_longer_than_every_document(tmp_path):
  _bytes_dataset(tmp_path)
  longest = max(map(len, DOCS))
  with pytest.raises(ConfigError) as e:
    read_token_dataset(tmp_path, seq_len=longest)
  assert str(e.value) == (
      f'seq_len {longest} is longer than any document in {tmp_path}/train (longest: {longest} '
      f'tokens; a window holds seq_len + 1 = {longest + 1})')
  assert read_token_dataset(tmp_path, seq_len=longest - 1).num_windows == 1
  with pytest.raises(ConfigError, match='seq_len must be at least 1, got 0'):
    read_token_dataset(tmp_path, seq_len=0)


def test_a_missing_dataset_names_the_command_that_makes_one_and_a_near_name(tmp_path, monkeypatch):
  """Issue 44: ``data/mytxt`` (the dataset made was ``data/mytext``) did not name prepare_text."""
  monkeypatch.chdir(tmp_path)
  make = ('make one with: python experiments/prepare_text.py --source=DIR --out=data/mytxt '
          '(hetjax.data.prepare_text)')
  with pytest.raises(ConfigError) as e:
    read_token_dataset('data/mytxt', seq_len=4)
  assert str(e.value) == f'token dataset data/mytxt does not exist; {make}'
  _bytes_dataset(tmp_path / 'data' / 'mytext')
  (tmp_path / 'data' / 'mytex').mkdir()  # closer, but no dataset: not suggested
  with pytest.raises(ConfigError) as e:
    read_token_dataset('data/mytxt', seq_len=4)
  assert str(e.value) == ('token dataset data/mytxt does not exist (did you mean data/mytext?); '
                          f'{make}')


def test_missing_directory_split_and_bin(tmp_path):
  with pytest.raises(ConfigError, match=f'^token dataset {tmp_path}/none does not exist; '):
    read_token_dataset(tmp_path / 'none', seq_len=4)
  (tmp_path / 'file').write_text('x')
  with pytest.raises(ConfigError, match='file is not a directory'):
    read_token_dataset(tmp_path / 'file', seq_len=4)
  _bytes_dataset(tmp_path / 'ds')
  with pytest.raises(ConfigError, match=f"{tmp_path}/ds has no split 'val' "
                                        rf"\(no {tmp_path}/ds/val.json; splits: train\)"):
    read_token_dataset(tmp_path / 'ds', split='val', seq_len=4)
  with pytest.raises(ConfigError, match=r"split '\.\./x' must be a name"):
    read_token_dataset(tmp_path / 'ds', split='../x', seq_len=4)
  os.remove(tmp_path / 'ds' / 'train.bin')
  with pytest.raises(ConfigError, match=r'ds/train.bin does not exist \(its header'):
    read_token_dataset(tmp_path / 'ds', seq_len=4)


@pytest.mark.parametrize('change, fragment', [
    ({'format': 'other'}, "format 'other' version 1 is not 'hetjax-tokens' version 1"),
    ({'version': 2}, "format 'hetjax-tokens' version 2 is not"),
    ({'dtype': 'int8'}, "dtype 'int8' is not uint16 or uint32"),
    ({'vocab_size': 70_000, 'tokenizer': 'bpe'}, 'vocab_size 70000 is not a whole number in '
                                                 r'\[1, 65536\] \(dtype uint16\)'),
    ({'vocab_size': 300}, 'a bytes tokenizer has vocab_size 256, not 300'),
    ({'tokenizer': 'words'}, "unknown tokenizer 'words'; choose one of: bytes, bpe"),
    ({'tokenizer': 'bpe'}, 'names a bpe tokenizer but .* has no tokenizer.json'),
    ({'num_tokens': 100}, r'.bin holds 252 bytes, not num_tokens 100 × 2 bytes \(uint16\)'),
    ({'num_tokens': True}, 'num_tokens True is not a positive whole number'),
    ({'documents': [0, 30, 30]}, r'not ascending: 30 then 30 \(documents 1 and 2\)'),
    ({'documents': [0, 50, 40]}, 'not ascending: 50 then 40'),
    ({'documents': [3, 40]}, 'documents must start at offset 0, not 3'),
    ({'documents': [0, 126]}, 'document offset 126 is out of range for num_tokens 126'),
    ({'documents': []}, 'documents must be a non-empty list of start offsets'),
    ({'documents': None}, 'documents must be a non-empty list'),
    ({'vocab_size': None}, 'vocab_size None is not a whole number'),
])
def test_a_header_that_does_not_match(tmp_path, change, fragment):
  header = _bytes_dataset(tmp_path)
  (tmp_path / 'train.json').write_text(json.dumps({**header, **change}))
  with pytest.raises(ConfigError, match=f'^{tmp_path}/train.*{fragment}') as e:
    read_token_dataset(tmp_path, seq_len=4)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('text, fragment', [
    ('{"format": "hetjax-tokens", "ver', 'does not read as a JSON header: '),
    ('[1, 2]', 'the header must be a JSON object'),
    ('{"format": "hetjax-tokens", "version": 1}', 'the header lacks dtype, vocab_size, '
                                                   'num_tokens, tokenizer, documents'),
])
def test_a_header_that_does_not_read(tmp_path, text, fragment):
  _bytes_dataset(tmp_path)
  (tmp_path / 'train.json').write_text(text)
  with pytest.raises(ConfigError, match=f'^{tmp_path}/train.json.*{fragment}'):
    read_token_dataset(tmp_path, seq_len=4)


@pytest.mark.parametrize('tokens, documents, fragment', [
    (np.array([1, 2, 256]), [0], 'token id 256 at offset 2 is not in \\[0, vocab_size 256\\)'),
    (np.array([1, -1, 3]), [0], 'token id -1 at offset 1'),
    (np.array([1.0, 2.0]), [0], 'tokens must be a flat integer array, got float64\\[2\\]'),
    (np.array([], dtype=np.int64), [0], 'num_tokens 0 is not a positive whole number'),
    (np.array([1, 2, 3]), [1], 'documents must start at offset 0, not 1'),
    (np.array([1, 2, 3]), [0, 2, 1], 'not ascending: 2 then 1'),
])
def test_write_refuses_what_the_reader_would(tmp_path, tokens, documents, fragment):
  with pytest.raises(ConfigError, match=fragment):
    write_token_split(tmp_path, 'train', tokens, documents, 256, 'bytes')
  assert not (tmp_path / 'train.bin').exists()


def test_rewriting_a_split_replaces_it(tmp_path):
  _bytes_dataset(tmp_path)
  _bytes_dataset(tmp_path, docs=[b'a brand new corpus'])
  ds = read_token_dataset(tmp_path, seq_len=4)
  assert ds.num_documents == 1 and ds.tokens.tobytes()[::2] == b'a brand new corpus'
  assert sorted(os.listdir(tmp_path)) == ['train.bin', 'train.json']
  assert oct(os.stat(tmp_path / 'train.bin').st_mode & 0o777) == '0o644'
