"""A folder of files made into a token dataset: deterministic, documents whole, bad input one
line (and exit 2 from experiments/prepare_text.py)."""

import hashlib
import json
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
      'vocab_size': 256, 'eos_id': None, 'files': 11, 'skipped': 0,
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
    ({'tokenizer': 'bpe', 'eos_id': 0}, 'eos_id is for a pretrained tokenizer: bpe documents'),
    ({'tokenizer': 'no/such/tokenizer.json'}, '^tokenizer no/such/tokenizer.json does not exist'),
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
    (['--out={tmp}/o', '--eos_id=3'], 'eos_id is for a pretrained tokenizer: bytes documents'),
    ([], '--out is required'),
])
def test_cli_bad_input_exits_2(tmp_path, args, fragment):
  result = _cli(*(a.format(tmp=tmp_path) for a in args))
  assert result.returncode == 2, (result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('prepare_text.py: error: ')
  assert fragment.format(tmp=tmp_path) in lines[0]


# -- pretrained Hugging Face tokenizers ------------------------------------------------------

TEXTS = [' '.join(f'w{(i * 7 + j) % 23}' for j in range(5 + 2 * i)) for i in range(12)]


def _tokenizer(specials=('<unk>', '<s>', '</s>'), template=None, truncate=None):
  """A word-level `tokenizers.Tokenizer` over ``w0`` … ``w22``, its specials first."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

  tokenizer = Tokenizer(models.WordLevel(unk_token='<unk>'))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.train_from_iterator([' '.join(f'w{i}' for i in range(23))], trainers.WordLevelTrainer(
      special_tokens=list(specials), show_progress=False))
  if template:
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, tokenizer.token_to_id(t)) for t in specials])
  if truncate:
    tokenizer.enable_truncation(max_length=truncate)
  return tokenizer


def _model_dir(path, tokenizer, **files):
  """A model folder: ``tokenizer.json`` and each ``NAME=dict`` as ``NAME.json``."""
  path.mkdir(parents=True, exist_ok=True)
  tokenizer.save(str(path / 'tokenizer.json'))
  for name, content in files.items():
    (path / f'{name}.json').write_text(json.dumps(content))
  return path


@pytest.fixture
def texts(tmp_path):
  root = tmp_path / 'texts'
  root.mkdir()
  for i, text in enumerate(TEXTS):
    (root / f'doc{i:02}.txt').write_text(text)
  return root


def _ids(ds):
  ends = [*ds.documents[1:], ds.num_tokens]
  return [ds.tokens[a:b].tolist() for a, b in zip(ds.documents, ends, strict=True)]


def _all_ids(out):
  return [ids for split in ('train', 'val')
          for ids in _ids(read_token_dataset(out, split=split, seq_len=2))]


def test_a_pretrained_tokenizer_file_ends_each_document_with_its_eos(texts, tmp_path):
  from tokenizers import Tokenizer

  tokenizer = _tokenizer()
  _model_dir(tmp_path / 'tok', tokenizer)
  out = tmp_path / 'out'
  summary = prepare_text(texts, out, tokenizer=tmp_path / 'tok' / 'tokenizer.json',
                         pattern='*.txt', val_fraction=0.25)
  eos = tokenizer.token_to_id('</s>')
  assert summary['tokenizer'] == 'pretrained' and summary['eos_id'] == eos == 2
  assert summary['vocab_size'] == tokenizer.get_vocab_size(with_added_tokens=True) == 26
  assert summary['splits']['val']['documents'] == 3 and summary['files'] == 12
  # the dataset carries its tokenizer, byte for byte, and the header its kind and EOS
  copied = (tmp_path / 'tok' / 'tokenizer.json').read_bytes()
  assert (out / 'tokenizer.json').read_bytes() == copied
  header = json.loads((out / 'train.json').read_text())
  assert header['tokenizer'] == 'pretrained' and header['eos_id'] == eos
  assert read_token_dataset(out, seq_len=2).tokenizer == 'pretrained'
  expected = [[*Tokenizer.from_file(str(out / 'tokenizer.json')).encode(t).ids, eos]
              for t in TEXTS]
  assert sorted(_all_ids(out)) == sorted(expected)
  # a bytes dataset written over it drops its tokenizer.json; deleting it spoils a pretrained one
  prepare_text(texts, out, pattern='*.txt', overwrite=True)
  assert 'tokenizer.json' not in os.listdir(out)
  prepare_text(texts, out, tokenizer=tmp_path / 'tok', pattern='*.txt', overwrite=True)
  os.remove(out / 'tokenizer.json')
  with pytest.raises(ConfigError, match=r'train.json names a pretrained tokenizer but .* has '
                                        r'no tokenizer.json$'):
    read_token_dataset(out, seq_len=2)


@pytest.mark.parametrize('specials, files, eos_id, expected', [
    # tokenizer_config.json's eos_token first (a string, or a dict), then config.json's
    (('<unk>', '</s>', '<|im_end|>'), {'tokenizer_config': {'eos_token': '<|im_end|>'},
                                       'config': {'eos_token_id': 1}}, None, 2),
    (('<unk>', '</s>', '<x>'), {'tokenizer_config': {'eos_token': {'content': '<x>'}}}, None, 2),
    (('<unk>', '</s>', '<x>'), {'tokenizer_config': {'bos_token': '<unk>'},
                                'config': {'eos_token_id': 2}}, None, 2),
    (('<unk>', '</s>', '<x>'), {'config': {'eos_token_id': [2, 1]}}, None, 2),
    # then the special tokens in EOS_TOKENS order, whatever their ids
    (('<unk>', '<|im_end|>', '<|eot_id|>', '<|endoftext|>'), {}, None, 3),
    (('<unk>', '</s>'), {'config': {'eos_token_id': None}}, None, 1),
    # eos_id given wins
    (('<unk>', '</s>', '<x>'), {'tokenizer_config': {'eos_token': '</s>'}}, 2, 2),
])
def test_the_eos_id_of_a_model_folder(texts, tmp_path, specials, files, eos_id, expected):
  model = _model_dir(tmp_path / 'model', _tokenizer(specials), **files)
  summary = prepare_text(texts, tmp_path / 'out', tokenizer=str(model), eos_id=eos_id,
                         pattern='*.txt')
  assert summary['eos_id'] == expected
  assert all(ids[-1] == expected and expected not in ids[:-1] for ids in _all_ids(tmp_path / 'out'))


def test_no_eos_found_asks_for_eos_id(texts, tmp_path):
  model = _model_dir(tmp_path / 'model', _tokenizer(('<unk>', '<pad>')))
  with pytest.raises(ConfigError, match=r'^no EOS token found for .*/model/tokenizer.json: .* '
                                        r'\(give eos_id=, --eos_id\)$'):
    prepare_text(texts, tmp_path / 'out', tokenizer=model, pattern='*.txt')
  assert not (tmp_path / 'out').exists()
  assert prepare_text(texts, tmp_path / 'out', tokenizer=model, pattern='*.txt',
                      eos_id=1)['eos_id'] == 1


def test_the_post_processor_is_kept_and_truncation_dropped(texts, tmp_path):
  # a BOS template as Llama 3's; a template that ends with EOS itself gets no second one
  for template, lead, tail in (('<s> $A', [1], [2]), ('<s> $A </s>', [1], [2])):
    tokenizer = _tokenizer(template=template, truncate=3)
    model = _model_dir(tmp_path / 'model', tokenizer, tokenizer_config={'eos_token': '</s>'})
    prepare_text(texts, tmp_path / 'out', tokenizer=model, pattern='*.txt', overwrite=True)
    tokenizer.no_truncation()
    words = [[tokenizer.token_to_id(w) for w in t.split()] for t in TEXTS]
    assert sorted(_all_ids(tmp_path / 'out')) == sorted(lead + w + tail for w in words)


@pytest.mark.parametrize('make, kwargs, fragment', [
    (lambda d: d.mkdir(), {}, r'tokenizer folder .*/model holds no tokenizer.json'),
    (lambda d: _model_dir(d, _tokenizer()), {'vocab_size': 300},
     r'^vocab_size 300 is not the 26 ids of the pretrained tokenizer .*/model/tokenizer.json'),
    (lambda d: _model_dir(d, _tokenizer()), {'eos_id': 26},
     r'^eos_id 26 is not an id of the pretrained tokenizer .*tokenizer.json \(\[0, 26\)\)$'),
    (lambda d: _model_dir(d, _tokenizer(), tokenizer_config={'eos_token': '<eos>'}), {},
     r"^the eos_token '<eos>' of .*/model/tokenizer_config.json is not a token of "),
    (lambda d: (d.mkdir(), (d / 'tokenizer.json').write_text('{"version": ')), {},
     r'^.*/model/tokenizer.json does not read as a Hugging Face tokenizer.json: '),
    (lambda d: (_model_dir(d, _tokenizer(('<unk>',))), (d / 'config.json').write_text('{')), {},
     r'^.*/model/config.json does not read as JSON: '),
])
def test_bad_pretrained_tokenizer(texts, tmp_path, make, kwargs, fragment):
  make(tmp_path / 'model')
  with pytest.raises(ConfigError, match=fragment) as e:
    prepare_text(texts, tmp_path / 'out', tokenizer=tmp_path / 'model', pattern='*.txt',
                 **kwargs)
  assert '\n' not in str(e.value)


# -- jsonl and parquet -----------------------------------------------------------------------

def _jsonl(path, records):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(''.join(r if isinstance(r, str) else json.dumps(r) + '\n' for r in records))


def test_jsonl_lines_are_documents_held_out_by_path_and_index(tmp_path):
  _jsonl(tmp_path / 'src' / 'a.jsonl', [{'body': t, 'id': i} for i, t in enumerate(TEXTS[:8])]
         + ['\n', {'body': ''}, {'body': 'caf\u00e9 w1'}])
  _jsonl(tmp_path / 'src' / 'b' / 'c.jsonl', [{'body': t} for t in TEXTS[8:]])
  (tmp_path / 'src' / 'notes.txt').write_text('a whole file')
  summary = prepare_text(tmp_path / 'src', tmp_path / 'out', pattern=['*.jsonl', '*.txt'],
                         text_field='body', val_fraction=0.3, seed=5)
  assert summary['files'] == 3 and summary['splits']['val']['documents'] == 4
  documents = {f'a.jsonl#{i}': t for i, t in enumerate(TEXTS[:8])}
  documents |= {'a.jsonl#10': 'caf\u00e9 w1', 'notes.txt': 'a whole file'}
  documents |= {f'b/c.jsonl#{i}': t for i, t in enumerate(TEXTS[8:])}
  val = sorted(documents, key=lambda k: hashlib.blake2b(f'5\0{k}'.encode(),
                                                        digest_size=8).digest())[:4]
  got = {s: [bytes(d).decode() for d in _ids(read_token_dataset(tmp_path / 'out', split=s,
                                                                  seq_len=2))]
         for s in ('train', 'val')}
  assert got == {'val': [t for k, t in documents.items() if k in val],
                 'train': [t for k, t in documents.items() if k not in val]}
  # max_bytes counts the text read: the first three lines fit, the fourth does not
  limit = sum(len(t.encode()) for t in TEXTS[:3])
  summary = prepare_text(tmp_path / 'src', tmp_path / 'few', pattern='*.jsonl',
                         text_field='body', val_fraction=0, max_bytes=limit + 1)
  assert summary['files'] == 1 and summary['splits']['train'] == {'documents': 3, 'tokens': limit}


def test_jsonl_with_a_pretrained_tokenizer(tmp_path):
  _jsonl(tmp_path / 'src' / 'a.jsonl', [{'text': t} for t in TEXTS])
  tokenizer = _tokenizer()
  model = _model_dir(tmp_path / 'model', tokenizer)
  prepare_text(tmp_path / 'src', tmp_path / 'out', tokenizer=model, pattern='*.jsonl')
  assert sorted(_all_ids(tmp_path / 'out')) == sorted([*tokenizer.encode(t).ids, 2]
                                                       for t in TEXTS)


@pytest.mark.parametrize('lines, fragment', [
    (['{"text": "w1"}\n', '{"text": "w2"\n'], r'/a.jsonl line 2 is not JSON'),
    (['\n', '{"text": "w1"}\n', '{"body": "w2"}\n'],
     r"/a.jsonl line 3 has no field 'text' \(text_field=, --text_field, names the field\)$"),
    (['["w1"]\n'], r"/a.jsonl line 1 has no field 'text'"),
    (['{"text": 3}\n'], r"/a.jsonl line 1: field 'text' is int, not a string$"),
])
def test_bad_jsonl_names_the_file_and_line(tmp_path, lines, fragment):
  _jsonl(tmp_path / 'src' / 'a.jsonl', lines)
  with pytest.raises(ConfigError, match=fragment) as e:
    prepare_text(tmp_path / 'src', tmp_path / 'out', pattern='*.jsonl', val_fraction=0)
  assert str(e.value).startswith(str(tmp_path / 'src' / 'a.jsonl')) and '\n' not in str(e.value)


def test_parquet_rows_are_documents(tmp_path):
  pa = pytest.importorskip('pyarrow')
  pq = pytest.importorskip('pyarrow.parquet')

  (tmp_path / 'src').mkdir()
  pq.write_table(pa.table({'id': list(range(12)), 'text': TEXTS}), tmp_path / 'src' / 'a.parquet',
                 row_group_size=5)
  summary = prepare_text(tmp_path / 'src', tmp_path / 'out', pattern='*.parquet')
  assert summary['files'] == 1 and summary['splits']['val']['documents'] == 1
  assert sorted(bytes(d).decode() for d in _all_ids(tmp_path / 'out')) == sorted(TEXTS)
  with pytest.raises(ConfigError, match=r"a.parquet has no column 'body' \(columns: id, text; "):
    prepare_text(tmp_path / 'src', tmp_path / 'o2', pattern='*.parquet', text_field='body')
  with pytest.raises(ConfigError, match=r"a.parquet: column 'id' holds int64, not strings$"):
    prepare_text(tmp_path / 'src', tmp_path / 'o2', pattern='*.parquet', text_field='id')
  pq.write_table(pa.table({'text': ['w1', None]}), tmp_path / 'src' / 'a.parquet')
  with pytest.raises(ConfigError, match=r"a.parquet row 1: column 'text' is null$"):
    prepare_text(tmp_path / 'src', tmp_path / 'o2', pattern='*.parquet')
  (tmp_path / 'src' / 'a.parquet').write_text('not parquet')
  with pytest.raises(ConfigError, match=r'a.parquet does not read as parquet: '):
    prepare_text(tmp_path / 'src', tmp_path / 'o2', pattern='*.parquet')


def test_parquet_without_pyarrow_says_how_to_install_it(tmp_path, monkeypatch):
  (tmp_path / 'src').mkdir()
  (tmp_path / 'src' / 'a.parquet').write_bytes(b'PAR1')
  monkeypatch.setitem(sys.modules, 'pyarrow', None)  # `import pyarrow` raises ImportError
  monkeypatch.setitem(sys.modules, 'pyarrow.parquet', None)
  with pytest.raises(ConfigError, match=r'a.parquet is a parquet file: reading it needs pyarrow '
                                        r'\(pip install pyarrow\)$'):
    prepare_text(tmp_path / 'src', tmp_path / 'out', pattern='*.parquet')


def test_cli_with_a_pretrained_tokenizer_and_jsonl(tmp_path):
  _jsonl(tmp_path / 'src' / 'a.jsonl', [{'body': t} for t in TEXTS])
  tokenizer = _tokenizer()
  model = _model_dir(tmp_path / 'model', tokenizer)
  result = _cli(f'--source={tmp_path / "src"}', f'--out={tmp_path / "out"}',
                f'--tokenizer={model}', '--pattern=*.jsonl', '--text_field=body', '--eos_id=1',
                '--val_fraction=0.25')
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[:2] == [f'train: 9 documents, {lines[0].split(", ")[1]}',
                       f'val: 3 documents, {lines[1].split(", ")[1]}']
  assert lines[2].startswith(f'wrote {tmp_path / "out"} (pretrained, vocab_size 26, eos_id 1, '
                             'from 1 files under ')
  assert sorted(_all_ids(tmp_path / 'out')) == sorted([*tokenizer.encode(t).ids, 1]
                                                       for t in TEXTS)


def test_the_vocabulary_runs_to_the_largest_id(tmp_path):
  """A vocabulary with gaps counts 4 tokens but ids up to 70,000: the dataset takes 70,001 ids,
  past uint16."""
  from tokenizers import Tokenizer, models, pre_tokenizers

  tokenizer = Tokenizer(models.WordLevel(vocab={'<unk>': 0, 'a': 1, 'b': 70_000},
                                         unk_token='<unk>'))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.add_special_tokens(['<|endoftext|>'])
  _model_dir(tmp_path / 'model', tokenizer)
  _jsonl(tmp_path / 'src' / 'a.jsonl', [{'text': 'a b a'}, {'text': 'b b'}])
  summary = prepare_text(tmp_path / 'src', tmp_path / 'out', tokenizer=tmp_path / 'model',
                         pattern='*.jsonl', val_fraction=0)
  assert (summary['vocab_size'], summary['eos_id']) == (70_001, 3)
  assert json.loads((tmp_path / 'out' / 'train.json').read_text())['dtype'] == 'uint32'
  assert _ids(read_token_dataset(tmp_path / 'out', seq_len=2)) == [[1, 70_000, 1, 3],
                                                                    [70_000, 70_000, 3]]
