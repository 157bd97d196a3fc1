"""Fine-tuning from a Hugging Face checkpoint (``model.init=hf:PATH``, issue 41): the checkpoint's
weights start a run in every mode, so its first loss is the loss of the checkpoint's model
(`hetjax.run.load_hf`) on the first batch; a finished run is read back without the checkpoint,
resumes, and is written back (`hetjax.run.save_hf`, ``hetjax-export``) for the import to give
the same bits; bad input is one line.

The checkpoint is a tiny random Llama (grouped-query attention, Qwen 2's q, k, v biases), written
here by hetjax's own writer; tests/test_hf_reference.py checks that writer and the reader against
`transformers`' files and logits.
"""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import ConfigError, ps, run
from hetjax.models import hf, hf_files, llama
from hetjax.runtime import LocalChannel
from tests.conftest import require_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT = 240
ARGS = dict(vocab_size=256, d_model=32, heads=8, kv_heads=2, layers=2, mlp=64, seq_len=16,
            qkv_bias=True, rope_base=500_000.0)
#: A short run of `llama_finetune` on the checkpoint: 16 rows of 16 tokens, no evaluation.
SETS = ['model.args.seq_len=16', 'global_batch=16', 'steps=2', 'optimizer.warmup=0',
        'optimizer.learning_rate=1e-3', 'eval.every=0', 'checkpoint.every=2', 'log_every=1']


def _write_checkpoint(path: pathlib.Path, args=ARGS, seed: int = 7, **kwargs) -> pathlib.Path:
  task = llama.make_task(**args)
  with nnx.use_eager_sharding(False):
    model = task.make_model(nnx.Rngs(seed))
  params = nnx.to_pure_dict(nnx.state(model))
  shapes, get = hf.hf_tensors(task.config, params)
  return hf_files.write_safetensors_dir(path, hf.hf_config(task.config), shapes, get,
                                         **kwargs)


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory) -> pathlib.Path:
  """The checkpoint, in three shards with their index (the reader's sharded path)."""
  return _write_checkpoint(tmp_path_factory.mktemp('hf') / 'tiny', max_shard_bytes=60_000)


def _config(checkpoint, *sets):
  return run.override(run.load_config('llama_finetune'),
                      [f'model.init=hf:{checkpoint}', *SETS, *sets])


@pytest.fixture(scope='module')
def reference(checkpoint) -> float:
  """The checkpoint's model's mean loss on the run's first batch."""
  config = _config(checkpoint)
  model = run.load_hf(checkpoint, seq_len=16)
  batch = run.make_task(config, weights=False).data.global_batch(config.data.seed, 0, 16)
  return float(jnp.mean(llama.loss(model, {k: jnp.asarray(v) for k, v in batch.items()})))


def _losses(workdir: pathlib.Path) -> list[float]:
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return [json.loads(line)['loss'] for line in lines]


def test_the_checkpoint_is_sharded_and_load_hf_reads_every_tensor(checkpoint):
  assert (checkpoint / hf_files.INDEX).is_file()
  assert len(list(checkpoint.glob('model-*-of-*.safetensors'))) > 1
  model = run.load_hf(checkpoint, seq_len=16)
  task = llama.make_task(**ARGS)
  with nnx.use_eager_sharding(False):
    original = task.make_model(nnx.Rngs(7))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)))
  np.testing.assert_array_equal(model(tokens), original(tokens))


SPMD = {'data_parallel': '8x1', 'fsdp': '8x1', 'tensor_parallel': '4x2', 'hybrid': '4x2'}


@pytest.mark.parametrize('strategy', SPMD)
def test_spmd_starts_from_the_checkpoint_in_every_strategy(checkpoint, reference, tmp_path,
                                                           strategy):
  """The tensors are read onto each strategy's shardings (tensor parallelism splits the two key
  and value heads over 'model'): the first loss is the checkpoint's, to float32 summation
  order."""
  require_devices(8)
  config = _config(checkpoint, 'mode=spmd', f'strategy={strategy}', f'mesh={SPMD[strategy]}')
  run.train(config, tmp_path / 'run')
  losses = _losses(tmp_path / 'run')
  assert losses[0] == pytest.approx(reference, rel=1e-6)
  assert losses[1] < losses[0]


def test_a_pipeline_and_a_plan_start_from_the_checkpoint(checkpoint, reference, tmp_path,
                                                         capsys):
  """Two pipeline stages on one process read each link's tensors at its path in the whole
  model (and give it whole for a sample at the end); a plan's one SPMD step reads them onto its
  layout."""
  require_devices(8)
  pipe = _config(checkpoint, 'mode=pipeline', 'stages=2', 'micro_batches=2', 'mesh=4x1',
                 'eval.sample=4')
  run.train(pipe, tmp_path / 'pipeline')
  assert 'sample at step 2: ' in capsys.readouterr().out
  plan = tmp_path / 'plan.json'
  plan.write_text(json.dumps({'name': 'dp4-tp2', 'devices': 8,
                              'submodels': {'*': {'data': 4, 'tensor': 2}}}))
  run.train(_config(checkpoint, 'mode=plan', f'plan={plan}'), tmp_path / 'plan')
  for name in ('pipeline', 'plan'):
    assert _losses(tmp_path / name)[0] == pytest.approx(reference, rel=1e-6), name


def test_a_finished_run_is_read_resumed_and_exported_without_the_checkpoint(
    checkpoint, reference, tmp_path):
  """The run directory's config.json holds the checkpoint's architecture, so `load_model`
  reads the run after the checkpoint is gone; the export is what the run trained, and its
  import gives the same bits."""
  copy = tmp_path / 'hf'
  _write_checkpoint(copy, max_shard_bytes=60_000)
  workdir = tmp_path / 'run'
  run.train(_config(copy, 'mode=spmd', 'mesh=8x1'), workdir)
  written = json.loads((workdir / 'config.json').read_text())['model']
  assert written['args']['d_model'] == 32 and written['args']['qkv_bias'] is True
  assert written['init'] == f'hf:{copy}'
  run.train(_config(copy, 'mode=spmd', 'mesh=8x1', 'steps=3'), workdir, resume=True)
  assert len(_losses(workdir)) == 3
  for path in copy.iterdir():
    path.unlink()
  copy.rmdir()
  model = run.load_model(workdir)
  out = run.save_hf(workdir, tmp_path / 'export', max_shard_bytes=60_000)
  assert (out / hf_files.INDEX).is_file()
  assert json.loads((out / 'config.json').read_text())['num_key_value_heads'] == 2
  back = run.load_hf(out, seq_len=16)
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(back)),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ConfigError, match='is not empty'):
    run.save_hf(workdir, out)


def test_the_export_command_writes_a_run_and_refuses_bad_input_in_one_line(checkpoint, tmp_path):
  workdir = tmp_path / 'run'
  run.train(_config(checkpoint, 'mode=spmd', 'mesh=8x1'), workdir)
  def export(*args):
    return subprocess.run([sys.executable, 'experiments/export.py', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  done = export(f'--workdir={workdir}', f'--out={tmp_path / "out"}')
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'model.safetensors' in done.stdout and (tmp_path / 'out' / 'config.json').is_file()
  again = export(f'--workdir={workdir}', f'--out={tmp_path / "out"}')
  assert again.returncode == 2
  assert again.stderr.strip().splitlines() == [
      f'export.py: error: hf export: {tmp_path / "out"} is not empty (overwrite=True, '
      '--overwrite, replaces it)']


def test_a_parameter_server_starts_from_the_checkpoint(checkpoint):
  """A server's share of the model is the checkpoint's (`hetjax.sharding.initial_params`,
  where the workers pull their first parameters from)."""
  task = run.make_task(_config(checkpoint))
  server = ps.make_server(task, optax.sgd(0.1), ps.parse_ps('asp'), ps.PsRole(True, 0, 1, 1),
                          LocalChannel())
  held = server.layout.merge([server.params])
  want = nnx.to_pure_dict(nnx.state(run.load_hf(checkpoint, seq_len=16)))
  for a, b in zip(jax.tree.leaves(held), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('sets, message', [
    (['model.name=gpt'], "a Hugging Face checkpoint is read into model 'llama', not 'gpt'"),
    (['model.args.d_model=64'], 'model.args.d_model=64, but'),
    (['model.args.heads=8', 'model.args.layers=3'], 'model.args.layers=3, but'),
])
def test_a_config_that_disagrees_with_the_checkpoint_is_one_line(checkpoint, sets, message):
  with pytest.raises(ConfigError, match=message.replace('(', r'\(')) as refused:
    run.make_task(_config(checkpoint, *sets))
  assert '\n' not in str(refused.value)


def test_a_checkpoint_that_is_not_there_or_not_whole_is_one_line(checkpoint, tmp_path):
  with pytest.raises(ConfigError, match='no directory'):
    run.make_task(_config(tmp_path / 'missing'))
  with pytest.raises(ConfigError, match='must be hf:PATH'):
    run.override(run.load_config('llama_finetune'), ['model.init=/some/dir'])
  broken = tmp_path / 'broken'
  _write_checkpoint(broken, max_shard_bytes=60_000)
  next(broken.glob('model-00002-*.safetensors')).unlink()
  with pytest.raises(ConfigError, match=r'names shard model-00002-of-\d+\.safetensors, which is '):
    run.make_task(_config(broken))
  other = _write_checkpoint(tmp_path / 'wider', {**ARGS, 'mlp': 96})
  config = json.loads((other / 'config.json').read_text())
  (other / 'config.json').write_text(json.dumps({**config, 'intermediate_size': 64}))
  with pytest.raises(ConfigError, match=r"tensor 'model.layers.0.mlp.gate_proj.weight' has "
                     r'shape \(96, 32\), the model needs \(64, 32\)'):
    run.make_task(_config(other))


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_launched_workers_start_from_the_checkpoint_in_every_mode(checkpoint, reference,
                                                                  tmp_path):
  """Two launched workers, one job, a run per mode: SPMD over both processes, LB-BSP shares
  (the second worker 2x slow), tokens, and a plan's pipeline stages on groups of the workers
  (the embedding on both, a block on each, the head on the second). Every first loss is the
  checkpoint's."""
  plan = tmp_path / 'plan.json'
  plan.write_text(json.dumps({'name': 'groups', 'devices': 2, 'workers': 2, 'submodels': {
      'embed': {'tensor': 1}, 'block_0': {'tensor': 1, 'group': [0]},
      'block_1': {'tensor': 1, 'group': [1]}, 'head': {'tensor': 1, 'group': [1]}}}))
  modes = {'spmd': ['mode=spmd', 'strategy=fsdp', 'mesh=2x1'],
           'shares': ['mode=shares', 'policy=lbbsp', 'emulation.slowdown=static:1,2',
                      'mesh=1x1'],
           'tokens': ['mode=tokens', 'mesh=1x1'],
           'plan': [f'plan={plan}', 'micro_batches=2']}
  runs = [{'config': 'llama_finetune', 'workdir': str(tmp_path / mode),
           'overrides': [f'model.init=hf:{checkpoint}', *SETS, *sets]}
          for mode, sets in modes.items()]
  (tmp_path / 'runs.json').write_text(json.dumps(runs))
  result = subprocess.run(
      [sys.executable, '-m', 'hetjax.launch', '--workers', '2', '--devices-per-worker', '1',
       '--timeout', str(TIMEOUT - 30), '--log-dir', str(tmp_path),
       '--', sys.executable, str(ROOT / 'tests' / 'foreign' / '_worker.py'),
       str(tmp_path / 'runs.json')],
      cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  for mode in modes:
    errors = sorted((tmp_path / mode).glob('error-*.txt'))
    assert not errors, errors[0].read_text()[-3000:]
    assert _losses(tmp_path / mode)[0] == pytest.approx(reference, rel=1e-6), mode
