"""SchMP apps on the user's own files: each format reads as the arrays written, an app made from
a file runs the same rounds as the same data bundled or generated, rows that do not split name
the --set that fixes them, and every bad file is one line."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.data import (
    bundled_design,
    read_design,
    read_documents,
    read_ratings,
    zipf_ratings,
)
from hetjax.schmp import SchmpProgram, make_app
from hetjax.train import training_steps
from tests.conftest import require_devices
from tests.test_train_cli import ROOT, TIMEOUT


def _csv(path, table, header=None):
  """``table`` as CSV, floats to 9 digits (float32 round-trips exactly)."""
  np.savetxt(path, table, delimiter=',', fmt='%.9g', header=header or '', comments='')
  return path


def _losses(app, devices, rounds=3):
  """The objective after each of ``rounds`` rounds of ``app`` on ``devices`` devices."""
  size = app.default_schedule_size(devices)
  program = SchmpProgram(app, size, require_devices(devices), staleness=0)
  return [float(info.stats.loss) for info in
          training_steps(program, program.init_state(), rounds, policy=app.policy(size, 0))]


def _one_line(call, match):
  with pytest.raises(ConfigError, match=match) as e:
    call()
  assert '\n' not in str(e.value)
  return str(e.value)


# -- designs (Lasso, logistic regression) --------------------------------------------------------

def _design_files(tmp_path, x, y):
  table = np.column_stack([x, y])
  np.savez(tmp_path / 'd.npz', X=x, y=y)
  np.save(tmp_path / 'd.npy', table)
  header = ','.join([f'f{j}' for j in range(x.shape[1])] + ['target'])
  return [tmp_path / 'd.npz', tmp_path / 'd.npy', _csv(tmp_path / 'd.csv', table, header),
          _csv(tmp_path / 'bare.csv', table)]


def test_every_design_format_reads_as_written(tmp_path):
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal((7, 3)).astype(np.float32), rng.standard_normal(7).astype(np.float32)
  for path in _design_files(tmp_path, x, y):
    design = read_design(path, 'linear')
    assert design.x.dtype == design.y.dtype == np.float32 and design.name == path.name
    np.testing.assert_array_equal(design.x, x)
    np.testing.assert_array_equal(design.y, y)
  np.savez(tmp_path / 'column.npz', X=x, y=y[:, None])       # y as a column is fine too
  np.testing.assert_array_equal(read_design(tmp_path / 'column.npz', 'linear').y, y)


@pytest.mark.parametrize('labels', [[0, 1, 1, 0], [-1, 1, 1, -1], [0, 0, 0, 0]])
def test_logistic_labels_are_0_1_or_plus_minus_1(tmp_path, labels):
  x = np.arange(8.0).reshape(4, 2)
  np.savez(tmp_path / 'l.npz', X=x, y=np.array(labels))
  y = read_design(tmp_path / 'l.npz', 'logistic').y
  np.testing.assert_array_equal(y, np.where(np.array(labels) > 0, 1.0, -1.0))


@pytest.mark.parametrize('labels, message', [
    ([0, 1, 2, 1], r'labels must be 0/1 or -1/\+1; row 2 has 2'),
    ([0, 1, 0.5, 1], 'row 2 has 0.5'),
    ([0, 1, -1, 1], 'not a mix of 0, 1 and -1'),
])
def test_other_logistic_labels_are_one_line(tmp_path, labels, message):
  np.savez(tmp_path / 'l.npz', X=np.ones((4, 2)), y=np.array(labels))
  _one_line(lambda: read_design(tmp_path / 'l.npz', 'logistic'), message)
  read_design(tmp_path / 'l.npz', 'linear')  # any number is a regression target


def test_lasso_on_a_file_runs_the_bundled_rounds(tmp_path):
  """diabetes written out: the same λ, the same objective every round."""
  bundled = make_app('lasso', data='diabetes')
  design = bundled.design
  expected = _losses(bundled, 2)
  path = _design_files(tmp_path, design.x, design.y)[0]     # the formats read alike (above)
  app = make_app('lasso', data=str(path))
  assert app.lam == bundled.lam and app.config['data'] == str(path)
  assert _losses(app, 2) == expected


def test_logreg_on_a_file_of_0_1_labels_runs_the_bundled_rounds(tmp_path):
  bundled = make_app('logreg', data='breast_cancer', pad_rows=True)      # 569 rows
  design = bundled.design
  path = _csv(tmp_path / 'cancer.csv', np.column_stack([design.x, design.y > 0]))
  app = make_app('logreg', data=str(path), pad_rows=True)
  assert app.lam == bundled.lam
  assert _losses(app, 2) == _losses(bundled, 2)


def test_rows_that_do_not_split_name_the_set_that_pads_them(tmp_path):
  design = bundled_design('diabetes')
  np.savez(tmp_path / 'd.npz', X=design.x[:441], y=design.y[:441])
  app = make_app('lasso', data=str(tmp_path / 'd.npz'))
  _one_line(lambda: SchmpProgram(app, 1, require_devices(2)),
            r"app 'lasso': 441 rows do not divide over 2 devices; .*"
            r'\(--set model_args.pad_rows=True\)')
  padded = make_app('lasso', data=str(tmp_path / 'd.npz'), pad_rows=True)
  assert padded.host_data(2)['x'].shape == (442, 10)


@pytest.mark.parametrize('kwargs, message', [
    ({'data': 'nope'}, "unknown data 'nope'; choose one of: synthetic, diabetes, or a .npz"),
    ({'data': 'FILE', 'rho': 0.5}, "data '.*d.npz' is a file: rho apply to data='synthetic'"),
])
def test_design_arguments_with_a_file_are_one_line(tmp_path, kwargs, message):
  np.savez(tmp_path / 'd.npz', X=np.ones((4, 2)), y=np.ones(4))
  kwargs = {k: str(tmp_path / 'd.npz') if v == 'FILE' else v for k, v in kwargs.items()}
  _one_line(lambda: make_app('lasso', **kwargs), message)


# -- ratings (matrix factorisation) --------------------------------------------------------------

def test_every_ratings_format_reads_as_written(tmp_path):
  r = zipf_ratings(users=20, items=10, ratings=60, seed=1)
  triples = np.column_stack([r.user, r.item, r.value])
  np.savez(tmp_path / 'r.npz', rows=r.user, cols=r.item, values=r.value, shape=(25, 12))
  np.save(tmp_path / 'r.npy', triples)
  paths = [tmp_path / 'r.npy', _csv(tmp_path / 'r.csv', triples, 'user,item,rating')]
  for path in paths:
    got = read_ratings(path)
    assert (got.users, got.items) == (int(r.user.max()) + 1, int(r.item.max()) + 1)
    for a, b in ((got.user, r.user), (got.item, r.item), (got.value, r.value)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(a, b)
  shaped = read_ratings(tmp_path / 'r.npz')
  assert (shaped.users, shaped.items, shaped.count) == (25, 12, 60)


def test_mf_on_a_file_runs_the_generated_rounds(tmp_path):
  args = {'users': 100, 'items': 50, 'ratings': 1000}
  generated = make_app('mf', devices=2, **args)
  r = generated.ratings
  np.savez(tmp_path / 'r.npz', rows=r.user, cols=r.item, values=r.value, shape=(100, 50))
  app = make_app('mf', devices=2, data=str(tmp_path / 'r.npz'))
  assert app.config['data'] == str(tmp_path / 'r.npz') and 'users' not in app.config
  assert _losses(app, 2) == _losses(generated, 2)
  # The shipped config names the generator's defaults: accepted with a file; others are not.
  make_app('mf', devices=2, data=str(tmp_path / 'r.npz'), users=1000, items=500)
  _one_line(lambda: make_app('mf', devices=2, data=str(tmp_path / 'r.npz'), users=7),
            "MF: data '.*r.npz' is a file: users apply to data='zipf' only")
  _one_line(lambda: make_app('mf', devices=2, data='movielens'), "MF: unknown data 'movielens'")


def test_a_cell_rated_twice_is_one_line(tmp_path):
  np.save(tmp_path / 'r.npy', np.array([[0, 1, 5.0], [2, 0, 3.0], [0, 1, 4.0]]))
  _one_line(lambda: read_ratings(tmp_path / 'r.npy'), r'cell \(0, 1\) is rated 2 times')


# -- corpora (LDA) --------------------------------------------------------------------------------

def test_a_count_matrix_reads_as_documents_most_frequent_word_first(tmp_path):
  counts = np.array([[0, 2, 1], [0, 0, 0], [1, 3, 0]])
  np.save(tmp_path / 'c.npy', counts)
  _csv(tmp_path / 'c.csv', counts, 'apple,pear,fig')
  np.savez(tmp_path / 'c.npz', counts=counts)
  for path, words in ((tmp_path / 'c.npy', ('1', '0', '2')),
                      (tmp_path / 'c.csv', ('pear', 'apple', 'fig')),
                      (tmp_path / 'c.npz', ('1', '0', '2'))):
    docs = read_documents(path)
    assert docs.vocabulary == words                     # pear (5) before apple and fig (1)
    assert [docs.document(d).tolist() for d in range(3)] == [[0, 0, 2], [], [1, 0, 0, 0]]
    assert docs.sources == (f'{path.name}:0', f'{path.name}:1', f'{path.name}:2')


def test_lda_on_a_file_runs_the_bundled_rounds(tmp_path):
  """The stdlib corpus in `Documents`' own form: the same tokens, the same rounds."""
  bundled = make_app('lda', devices=2, topics=8, documents=64, vocabulary=300)
  c = bundled.corpus
  np.savez(tmp_path / 'c.npz', tokens=c.tokens, offsets=c.offsets,
           vocabulary=np.array(c.vocabulary))
  app = make_app('lda', devices=2, topics=8, data=str(tmp_path / 'c.npz'))
  assert app.corpus.vocabulary == c.vocabulary
  np.testing.assert_array_equal(app.corpus.tokens, c.tokens)
  assert _losses(app, 2) == _losses(bundled, 2)
  counts = np.zeros((c.num_documents, len(c.vocabulary)), np.int64)
  for d in range(c.num_documents):
    np.add.at(counts[d], c.document(d), 1)
  np.save(tmp_path / 'counts.npy', counts[:63])
  _one_line(lambda: make_app('lda', devices=2, topics=8, data=str(tmp_path / 'counts.npy')),
            r'lda: 63 documents do not split evenly over 2 devices; '
            r'--set model_args.doc_shares=\(32,31\)')
  app = make_app('lda', devices=2, topics=8, data=str(tmp_path / 'counts.npy'),
                 doc_shares=(32, 31))
  losses = _losses(app, 2)
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  _one_line(lambda: make_app('lda', devices=2, data=str(tmp_path / 'c.npz'), documents=10),
            "lda: data '.*c.npz' is a file: documents apply to data='stdlib' only")


# -- bad files ------------------------------------------------------------------------------------

def _write(tmp_path, name, content):
  path = tmp_path / name
  if isinstance(content, bytes):
    path.write_bytes(content)
  elif isinstance(content, str):
    path.write_text(content)
  elif isinstance(content, dict):
    np.savez(path, **content)
  else:
    np.save(path, content)
  return path


BAD = [
    # (reader, file name, content (None: no file), message)
    ('design', 'missing.csv', None, "data file '.*missing.csv' does not exist"),
    ('design', 'd.txt', '1,2\n', r"data file '.*d.txt': give a .npy, .npz or .csv file"),
    ('design', 'd.npy', b'not numpy at all', "data file '.*d.npy' does not read as .npy: "),
    ('design', 'd.npz', b'PK\x03\x04 broken', "data file '.*d.npz' does not read as .npz: "),
    ('design', 'd.csv', 'a,b\n1,2\n3,x\n', "does not read as .csv: .*could not convert"),
    ('design', 'd.csv', '1,2\n3\n', 'does not read as .csv: '),
    ('design', 'd.csv', 'a,b,y\n', 'has no rows of numbers'),
    ('design', 'd.csv', '', 'has no rows of numbers'),
    ('design', 'd.npz', {'x': np.ones((2, 2)), 'y': np.ones(2)},
     r"has no array 'X' \(it has: x, y\)"),
    ('design', 'd.npz', {'X': np.ones(4), 'y': np.ones(4)}, r'X must be 2-D .* shape \(4,\)'),
    ('design', 'd.npz', {'X': np.ones((4, 2)), 'y': np.ones(3)},
     r'y must have one value per row of X \(4\)'),
    ('design', 'd.npy', np.ones(5), r'need rows of features then the target .* shape \(5,\)'),
    ('design', 'd.npy', np.array([['a', 'b'], ['c', 'd']]), 'X must hold real numbers, not <U1'),
    ('design', 'd.npy', np.array([[1.0, 2.0], [np.nan, 1.0]]),
     r'X must be finite \(in float32\); nan at row 1, column 0'),
    ('design', 'd.npy', np.array([[1.0, 2.0], [1e39, 1.0]]),
     r'X must be finite \(in float32\); 1e\+39 at row 1, column 0'),
    ('design', 'd.npz', {'X': np.ones((0, 2)), 'y': np.ones(0)}, r'X is empty \(shape \(0, 2\)\)'),
    ('ratings', 'r.npy', np.ones((4, 2)), r'need \(row, col, value\) triples'),
    ('ratings', 'r.npy', np.array([[0, 1.5, 3.0]]), r'cols must be whole numbers; 1.5 at row 0'),
    ('ratings', 'r.npy', np.array([[-1, 1, 3.0]]), 'rows must be >= 0; -1 at row 0'),
    ('ratings', 'r.npz', {'rows': [0], 'cols': [4], 'values': [1.0], 'shape': [3, 3]},
     r'ids up to \(0, 4\) do not fit shape \(3, 3\)'),
    ('ratings', 'r.npz', {'rows': [0, 1], 'cols': [1], 'values': [1.0]},
     'rows, cols and values must be 1-D, one entry per rating'),
    ('documents', 'c.npy', np.array([[1, -2]]), 'counts must be >= 0; -2 at'),
    ('documents', 'c.npy', np.zeros((2, 3)), r'has no tokens \(every count is 0\)'),
    ('documents', 'c.npy', np.ones(3), 'the counts must be a 2-D documents × words matrix'),
    ('documents', 'c.csv', 'a,b\n1,2\n3\n', 'does not read as .csv'),
    ('documents', 'c.csv', 'a,b\n1,2,3\n', '2 words for a vocabulary of 3'),
    ('documents', 'c.csv', 'a,b,c\n1,2\n', '3 words for a vocabulary of 2'),
    ('documents', 'c.npz', {'tokens': [0, 1, 2], 'offsets': [0, 2]},
     'offsets must rise from 0 to the 3 tokens'),
    ('documents', 'c.npz', {'tokens': [0, 5], 'offsets': [0, 2], 'vocabulary': ['a', 'b']},
     'word id 5 is beyond the 2 words'),
    ('documents', 'c.npz', {'tokens': [0], 'offsets': [0, 1], 'vocabulary': [1, 2]},
     'vocabulary must be a 1-D array of strings'),
]
_READERS = {'design': lambda p: read_design(p, 'linear'), 'ratings': read_ratings,
            'documents': read_documents}


@pytest.mark.parametrize('reader, name, content, message', BAD,
                         ids=[f'{r}-{m[:30]}' for r, _, _, m in BAD])
def test_a_bad_file_is_one_line(tmp_path, reader, name, content, message):
  path = tmp_path / name if content is None else _write(tmp_path, name, content)
  _one_line(lambda: _READERS[reader](path), message)


def test_the_cli_trains_on_a_file(tmp_path):
  """experiments/schmp.py with --set model_args.data=PATH: 3 rounds, exit 0; rows that do not
  split: one line naming the --set, exit 2."""
  design = bundled_design('diabetes')
  good = _csv(tmp_path / 'even.csv', np.column_stack([design.x[:64], design.y[:64]]))
  odd = _csv(tmp_path / 'odd.csv', np.column_stack([design.x[:63], design.y[:63]]))

  # Both command lines, each in a child forked from one import (tests/workers/cli_cases.py: the
  # real entry point, argv, absl parsing, exit code, a fresh JAX backend per child).
  cases = [['schmp.py', '--app=lasso', '--set', f'model_args.data={path}', '--steps=3',
            f'--workdir={workdir}', '--jax_num_cpu_devices=2']
           for path, workdir in ((good, tmp_path / 'run'), (odd, tmp_path / 'odd'))]
  (tmp_path / 'cases.json').write_text(json.dumps(cases))
  subprocess.run([sys.executable, str(ROOT / 'tests' / 'workers' / 'cli_cases.py'),
                  str(tmp_path / 'cases.json'), str(tmp_path / 'results.json')],
                 cwd=ROOT, check=True, timeout=TIMEOUT)
  result, odd_result = json.loads((tmp_path / 'results.json').read_text())
  assert result['returncode'] == 0, result['stderr']
  rows = [json.loads(line) for line in (tmp_path / 'run' / 'metrics.jsonl').read_text()
          .splitlines()]
  assert [r['step'] for r in rows] == [1, 2, 3]
  assert odd_result['returncode'] == 2
  lines = odd_result['stderr'].strip().splitlines()
  assert len(lines) == 1 and '63 rows do not divide over 2 devices' in lines[0]
  assert '--set model_args.pad_rows=True' in lines[0]
