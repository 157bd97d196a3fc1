"""A folder of files made into a token dataset: deterministic, documents whole, bad input one
line (and exit 2 from experiments/prepare_text.py)."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.data import prepare_text, read_token_dataset
from hetjax.data._prepare_text import default_source_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Python-like text so that bpe finds merges; each file distinct
FILES = {f'pkg{i % 3}/mod{i}.py': ''.join(
    f'def function_{i}_{j}(value):\n    return value * {j} + {i}  # comment {j}\n\n'
    for j in range(4 + i)) for i in range(10)}


@pytest.fixture
def corpus(tmp_path):
  root = tmp_path / 'src'
  for name, text in FILES.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  for skipped in ('tests/t.py', '.git/g.py', '__pycache__/c.py', 'pkg0/readme.md'):
    (root / skipped).parent.mkdir(parents=True, exist_ok=True)
    (root / skipped).write_text('skipped = True\n')
  (root / 'pkg0' / 'empty.py').write_text('')
  (root / 'pkg1' / 'latin1.py').write_bytes(b'name = "caf\xe9"\n')  # not UTF-8
  return root


def _documents(ds):
  ends = [*ds.documents[1:], ds.num_tokens]
  return [ds.tokens[a:b].astype(np.uint8).tobytes() for a, b in zip(ds.documents, ends,
                                                                       strict=True)]


def test_bytes_dataset_holds_each_file_as_one_document(corpus, tmp_path):
  summary = prepare_text(corpus, tmp_path / 'out', val_fraction=0.2)
  assert summary == {
      'path': str(tmp_path / 'out'), 'source': str(corpus), 'tokenizer': 'bytes',
      'vocab_size': 256, 'files': 11, 'skipped': 0,
      'splits': {'train': {'documents': 9, 'tokens': summary['splits']['train']['tokens']},
                 'val': {'documents': 2, 'tokens': summary['splits']['val']['tokens']}}}
  assert sorted(os.listdir(tmp_path / 'out')) == ['train.bin', 'train.json', 'val.bin',
                                                  'val.json']
  train, val = (read_token_dataset(tmp_path / 'out', split=s, seq_len=8) for s in ('train', 'val'))
  texts = [t.encode() for t in FILES.values()] + [b'name = "caf\xe9"\n']
  assert sorted(_documents(train) + _documents(val)) == sorted(texts)
  assert summary['splits']['train']['tokens'] + summary['splits']['val']['tokens'] == sum(
      map(len, texts))
  # in walk order within a split: pkg0 before pkg1 before pkg2, mod0 before mod3 before mod6
  order = [texts.index(d) for d in _documents(train) if d in texts[:10]]
  assert order == sorted(order, key=lambda i: (i % 3, i))


def test_a_window_decodes_to_a_substring_of_a_document(corpus, tmp_path):
  prepare_text(corpus, tmp_path / 'out', val_fraction=0.2)
  ds = read_token_dataset(tmp_path / 'out', seq_len=32)
  documents = _documents(ds)
  for row in ds.global_batch(seed=0, step=1, size=16)['tokens']:
    window = row.astype(np.uint8).tobytes()
    assert any(window in d for d in documents), window


def test_deterministic_and_the_seed_picks_val(corpus, tmp_path):
  def files(out):
    return {n: (out / n).read_bytes() for n in sorted(os.listdir(out))}
  prepare_text(corpus, tmp_path / 'a', val_fraction=0.2)
  prepare_text(corpus, tmp_path / 'b', val_fraction=0.2)
  prepare_text(corpus, tmp_path / 'c', val_fraction=0.2, seed=1)
  assert files(tmp_path / 'a') == files(tmp_path / 'b')
  val = {n: _documents(read_token_dataset(tmp_path / n, split='val', seq_len=4)) for n in 'ac'}
  assert val['a'] != val['c']


def test_val_fraction_zero_writes_no_val_and_max_bytes_stops_the_walk(corpus, tmp_path):
  first = len(FILES['pkg0/mod0.py']) + len(FILES['pkg0/mod3.py'])
  summary = prepare_text(corpus, tmp_path / 'out', val_fraction=0, max_bytes=first + 1)
  assert summary['files'] == 2 and list(summary['splits']) == ['train']
  assert summary['splits']['train'] == {'documents': 2, 'tokens': first}
  with pytest.raises(ConfigError, match=r"has no split 'val' .*splits: train\)"):
    read_token_dataset(tmp_path / 'out', split='val', seq_len=4)


def test_patterns_and_overwrite(corpus, tmp_path):
  out = tmp_path / 'out'
  prepare_text(corpus, out, val_fraction=0.2)
  with pytest.raises(ConfigError, match=f'^out folder {out} is not empty '):
    prepare_text(corpus, out, pattern=['*.md'], val_fraction=0)
  summary = prepare_text(corpus, out, pattern=['*.md', '*.txt'], val_fraction=0, overwrite=True)
  assert summary['files'] == 1  # pkg0/readme.md alone: tests/ and .git/ are not walked
  assert sorted(os.listdir(out)) == ['train.bin', 'train.json']  # the old val removed
  assert _documents(read_token_dataset(out, seq_len=4)) == [b'skipped = True\n']


def test_bpe_dataset_round_trips_through_its_tokenizer(corpus, tmp_path):
  from tokenizers import Tokenizer

  out = tmp_path / 'out'
  summary = prepare_text(corpus, out, tokenizer='bpe', vocab_size=300, val_fraction=0.2)
  assert summary['skipped'] == 1 and summary['files'] == 11  # latin1.py is not UTF-8
  assert summary['tokenizer'] == 'bpe' and 256 < summary['vocab_size'] <= 300
  assert sorted(os.listdir(out)) == ['tokenizer.json', 'train.bin', 'train.json', 'val.bin',
                                     'val.json']
  tokenizer = Tokenizer.from_file(str(out / 'tokenizer.json'))
  texts = []
  for split in ('train', 'val'):
    ds = read_token_dataset(out, split=split, seq_len=8)
    assert ds.tokenizer == 'bpe' and ds.vocab_size == summary['vocab_size']
    ends = [*ds.documents[1:], ds.num_tokens]
    texts += [tokenizer.decode(ds.tokens[a:b].tolist()) for a, b in zip(ds.documents, ends,
                                                                           strict=True)]
    assert ds.num_tokens < sum(len(t) for t in texts)  # merges shorten the text
  assert sorted(texts) == sorted(FILES.values())
  # a bytes dataset written over it drops its tokenizer.json
  prepare_text(corpus, out, val_fraction=0.2, overwrite=True)
  assert 'tokenizer.json' not in os.listdir(out)


@pytest.mark.parametrize('kwargs, fragment', [
    ({'tokenizer': 'words'}, "unknown tokenizer 'words'; choose one of: bytes, bpe"),
    ({'tokenizer': 'bpe', 'vocab_size': 256}, 'bpe vocab_size 256 must be at least 257'),
    ({'vocab_size': 300}, 'the bytes tokenizer has 256 ids, not vocab_size 300'),
    ({'val_fraction': 1.0}, r'val_fraction 1.0 must be in \[0, 1\)'),
    ({'max_bytes': 0}, 'max_bytes must be at least 1, got 0'),
    ({'pattern': '*.rs'}, r'^no files matching \*.rs under .*/src$'),
    ({'max_bytes': 10}, r'no files matching \*.py under .*/src within max_bytes 10$'),
    ({'pattern': 'latin1.py', 'tokenizer': 'bpe'}, r'latin1.py under .*/src \(1 not UTF-8\)$'),
    ({'pattern': 'mod0.py'}, 'one matching document: too few to hold out val_fraction 0.05'),
])
def test_bad_input(corpus, tmp_path, kwargs, fragment):
  with pytest.raises(ConfigError, match=fragment) as e:
    prepare_text(corpus, tmp_path / 'out', **kwargs)
  assert '\n' not in str(e.value)
  assert not (tmp_path / 'out' / 'train.bin').exists()


def test_missing_source_and_out_a_file(tmp_path):
  with pytest.raises(ConfigError, match=f'^source folder {tmp_path}/none does not exist$'):
    prepare_text(tmp_path / 'none', tmp_path / 'out')
  (tmp_path / 'file').write_text('x')
  with pytest.raises(ConfigError, match=r'source folder .*/file is not a directory'):
    prepare_text(tmp_path / 'file', tmp_path / 'out')
  with pytest.raises(ConfigError, match=r'out folder .*/file is not a directory'):
    prepare_text(tmp_path, tmp_path / 'file')


def test_the_default_source_is_the_standard_library():
  assert os.path.isfile(os.path.join(default_source_dir(), 'os.py'))


def _cli(*args):
  return subprocess.run([sys.executable, str(ROOT / 'experiments' / 'prepare_text.py'), *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_writes_a_dataset_and_refuses_bad_input_in_one_line(corpus, tmp_path):
  result = _cli(f'--source={corpus}', f'--out={tmp_path / "out"}', '--val_fraction=0.2')
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].startswith('train: 9 documents, ') and lines[1].startswith('val: 2 documents')
  assert lines[2].startswith(f'wrote {tmp_path / "out"} (bytes, vocab_size 256, from 11 files')
  assert read_token_dataset(tmp_path / 'out', seq_len=8).num_documents == 9
  # again without --overwrite: refused, one line, exit 2
  result = _cli(f'--source={corpus}', f'--out={tmp_path / "out"}', '--tokenizer=bpe')
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      f'prepare_text.py: error: out folder {tmp_path / "out"} is not empty (overwrite=True, '
      '--overwrite, replaces its dataset files)']


@pytest.mark.parametrize('args, fragment', [
    (['--out={tmp}/o', '--tokenizer=words'], "unknown tokenizer 'words'"),
    ([], '--out is required'),
])
def test_cli_bad_input_exits_2(tmp_path, args, fragment):
  result = _cli(*(a.format(tmp=tmp_path) for a in args))
  assert result.returncode == 2, (result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('prepare_text.py: error: ')
  assert fragment.format(tmp=tmp_path) in lines[0]
