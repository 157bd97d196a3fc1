"""hetjax against the reference implementation, Hugging Face ``transformers``: three tiny random
checkpoints that transformers itself wrote (`tests/fixtures/hf`: ``llama`` sharded with Llama
3's rope scaling, ``qwen2`` tied with q/k/v biases and one key/value head, ``mistral`` with
head_dim 12), with transformers' logits and loss on fixed tokens, and transformers' logits after
it loaded hetjax's export of the same weights. No torch here: the fixtures' script
(`tests/fixtures/hf/make_fixtures.py`) ran transformers once.

Read: `hetjax.run.load_hf` gives transformers' logits and loss. Written: hetjax's export has
transformers' tensor names, shapes and dtypes, bit for bit the tensors transformers wrote, a
config.json of the same architecture, and is what transformers loaded to give its logits again.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from flax import nnx

import hetjax.run
from hetjax.models import llama
from hetjax.models.hf import hf_config, hf_tensors, llama_args
from hetjax.models.hf_files import (
  INDEX,
  SINGLE,
  SafetensorsDir,
  read_config,
  write_safetensors_dir,
)

pytestmark = pytest.mark.gpu

FIXTURES = pathlib.Path(__file__).parent / 'fixtures' / 'hf'
NAMES = ('llama', 'qwen2', 'mistral')
TOLERANCE = 1e-5  # absolute, on float32 logits of |x| < 4 (transformers' float32 rounding ~2e-6)
#: hetjax writes Mistral's checkpoint in the Llama layout (`hetjax.models.hf.hf_config`): the
#: same tensors and forward pass once the sliding window covers the context.
EXPORTED_TYPE = {'llama': 'llama', 'qwen2': 'qwen2', 'mistral': 'llama'}
ARCHITECTURE = ('model_type', 'vocab_size', 'hidden_size', 'num_attention_heads',
                'num_key_value_heads', 'num_hidden_layers', 'intermediate_size', 'head_dim',
                'rope_theta', 'rms_norm_eps', 'tie_word_embeddings', 'rope_scaling')


class Fixture:
  """One model directory of `FIXTURES`, loaded by hetjax once, and its export."""

  def __init__(self, name: str, out: pathlib.Path):
    self.name, self.path = name, FIXTURES / name
    reference = np.load(self.path / 'reference.npz', allow_pickle=False)
    self.tokens, self.logits = reference['tokens'], reference['logits']
    self.loss, self.export_logits = reference['loss'], reference['export_logits']
    self.rounding = reference['rounding']
    self.expected = json.loads((self.path / 'tensors.json').read_text())
    self.seq_len = self.tokens.shape[1]
    self.model = hetjax.run.load_hf(self.path, seq_len=self.seq_len)
    self.export = export(self.model, self.path, out / name, self.seq_len)


def export(model: nnx.Module, source: pathlib.Path, out: pathlib.Path,
           seq_len: int) -> pathlib.Path:
  """``model`` written by hetjax's writer, as `hetjax.run.save_hf` writes a run."""
  args = llama_args(read_config(source), seq_len)
  shapes, get = hf_tensors(args, nnx.to_pure_dict(nnx.state(model)))
  return write_safetensors_dir(out, hf_config(args), shapes, get)


@pytest.fixture(scope='module', params=NAMES)
def fixture(request, tmp_path_factory) -> Fixture:
  return Fixture(request.param, tmp_path_factory.mktemp('export'))


def _table(directory: pathlib.Path) -> dict[str, list]:
  """``{name: [shape, dtype]}`` as the fixtures' script records it (safetensors' headers)."""
  from safetensors import safe_open

  table = {}
  for file in sorted(directory.glob('*.safetensors')):
    with safe_open(str(file), framework='np') as f:
      for key in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
        part = f.get_slice(key)
        table[key] = [list(part.get_shape()), part.get_dtype()]
  return dict(sorted(table.items()))


def _architecture(config: dict) -> dict:
  """`ARCHITECTURE`'s keys of a ``config.json``, the rope read from either the top-level keys
  (``rope_theta``, ``rope_scaling``) or transformers 5's ``rope_parameters``, as the fixtures'
  script records transformers' own reading."""
  rope = dict(config.get('rope_parameters') or config.get('rope_scaling') or {})
  theta = rope.pop('rope_theta', config.get('rope_theta'))
  rope.pop('type', None)
  scaling = None if rope.get('rope_type', 'default') == 'default' else rope
  found = {key: config.get(key) for key in ARCHITECTURE}
  return found | {'head_dim': config.get('head_dim') or
                  config['hidden_size'] // config['num_attention_heads'],
                  'rope_theta': None if theta is None else float(theta), 'rope_scaling': scaling}


def test_fixture_rounding_is_under_the_tolerance(fixture):
  # transformers' float32 logits against its own float64 forward: the tolerance is meaningful.
  assert fixture.rounding < TOLERANCE / 3
  assert 0.5 < np.std(fixture.logits) < 2  # random, not trivial


def test_import_gives_the_reference_logits(fixture):
  logits = np.asarray(fixture.model(fixture.tokens))
  assert logits.dtype == np.float32 and logits.shape == fixture.logits.shape
  np.testing.assert_allclose(logits, fixture.logits, rtol=0, atol=TOLERANCE)


def test_import_gives_the_reference_loss(fixture):
  # transformers shifts labels=input_ids inside (logits[:, :-1] against tokens[:, 1:], the mean
  # over every position); hetjax's loss predicts tokens[:, 1:] from tokens[:, :-1], per row.
  losses = np.asarray(llama.loss(fixture.model, {'tokens': fixture.tokens}))
  assert losses.shape == (fixture.tokens.shape[0],)
  np.testing.assert_allclose(losses.mean(), fixture.loss, rtol=0, atol=TOLERANCE)


def test_export_then_import_is_bit_identical(fixture):
  again = hetjax.run.load_hf(fixture.export, seq_len=fixture.seq_len)
  before = nnx.to_pure_dict(nnx.state(fixture.model))
  after = nnx.to_pure_dict(nnx.state(again))
  leaves, tree = _flat(before), _flat(after)
  assert leaves.keys() == tree.keys()
  for path, array in leaves.items():
    assert np.array_equal(np.asarray(array), np.asarray(tree[path])), path


def _flat(tree, prefix=()) -> dict:
  if isinstance(tree, dict):
    return {k: v for key, sub in tree.items() for k, v in _flat(sub, (*prefix, key)).items()}
  return {prefix: tree}


def test_export_has_the_reference_tensors(fixture):
  assert _table(fixture.export) == fixture.expected['tensors']
  with SafetensorsDir(fixture.path) as theirs, SafetensorsDir(fixture.export) as ours:
    for name in fixture.expected['tensors']:
      assert np.array_equal(ours.get(name), theirs.get(name)), name


def test_export_config_has_the_reference_architecture(fixture):
  ours = _architecture(json.loads((fixture.export / 'config.json').read_text()))
  theirs = fixture.expected['architecture'] | {'model_type': EXPORTED_TYPE[fixture.name]}
  assert ours == {key: theirs[key] for key in ARCHITECTURE}


def test_reference_reads_the_export(fixture):
  # export_logits are transformers' on hetjax's export as the fixtures' script wrote it; today's
  # export is that one (same config, tensors bit-identical to transformers' own: the test above).
  recorded = fixture.expected['export_config']
  assert json.loads((fixture.export / 'config.json').read_text()) == recorded, (
      'hetjax writes another config.json than transformers was shown: rerun make_fixtures.py')
  assert fixture.expected['export_loading_problems'] == {}
  assert fixture.expected['export_architecture'] == (
      fixture.expected['architecture'] | {'model_type': EXPORTED_TYPE[fixture.name],
                                          'sliding_window': None})
  np.testing.assert_allclose(fixture.export_logits, fixture.logits, rtol=0, atol=TOLERANCE)


def test_sharded_checkpoint_is_read_through_its_index():
  path = FIXTURES / 'llama'
  index = json.loads((path / INDEX).read_text())['weight_map']
  assert not (path / SINGLE).exists() and len(set(index.values())) > 1
  with SafetensorsDir(path) as tensors:
    assert tensors.keys() == sorted(index)
  for name in ('qwen2', 'mistral'):
    assert (FIXTURES / name / SINGLE).is_file() and not (FIXTURES / name / INDEX).exists()
