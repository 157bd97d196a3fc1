"""A checkpoint of a model that changed since it was saved (issue 44, item 2): ``--resume`` and
`run.load_model` name the parameters that differ in one error, and do not walk back through the
run's older checkpoints (which hold the same parameters); a corrupt checkpoint still does."""

import doctest
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest

from hetjax import ConfigError, run
from hetjax.checkpoint import Checkpointer, _fit
from hetjax.train import TrainState

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: The user's model file, as they first trained it: a 2-layer MLP on arrays of their own.
MODEL = '''
import numpy as np
from flax import nnx

from hetjax.data import ArraySource
from hetjax.run import (CheckpointConfig, Config, DataConfig, LoggingConfig, ModelConfig,
                        OptimizerConfig, ParallelismConfig)
from hetjax.train import Task

HIDDEN = 16
THIRD_LAYER = False


class MLP(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(8, HIDDEN, rngs=rngs)
    self.l2 = nnx.Linear(HIDDEN, 4, rngs=rngs)
    if THIRD_LAYER:
      self.l3 = nnx.Linear(4, 4, rngs=rngs)

  def __call__(self, x):
    y = self.l2(nnx.relu(self.l1(x)))
    return self.l3(y) if THIRD_LAYER else y


def make_task():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((256, 8)).astype(np.float32)
  y = rng.standard_normal((256, 4)).astype(np.float32)
  return Task('changing', MLP, lambda m, b: ((m(b['x']) - b['y']) ** 2).mean(-1),
              ArraySource({'x': x, 'y': y}))


def get_config():
  return Config(model=ModelConfig('changing_model:make_task', {}), data=DataConfig(global_batch=16),
                optimizer=OptimizerConfig('adam', learning_rate=0.01, steps=3),
                parallelism=ParallelismConfig(strategy='data_parallel', mesh='8x1'),
                logging=LoggingConfig(every=1, mfu=False, tensorboard=False),
                checkpoint=CheckpointConfig(every=1))
'''

#: What the user's edit (a wider first layer, a third layer) makes of the resume: every differing
#: parameter named, with its shapes, for the latest checkpoint, and nothing walked back.
CHANGED = (r"checkpoint step 3 in {checkpoints} holds other parameters than this model \(was the "
           r"model changed since it was saved\?\): 2 not in the checkpoint \('params/l3/bias' "
           r"\[4\]; 'params/l3/kernel' \[4, 4\]\); 3 changed \('params/l1/bias' \[16\] saved, "
           r"\[32\] now; 'params/l1/kernel' \[8, 16\] saved, \[8, 32\] now; 'params/l2/kernel' "
           r"\[16, 4\] saved, \[32, 4\] now\); the run's older checkpoints hold the same, so none "
           r"is restored")


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """The user's project (``changing_model.py``, importable) and its run of 3 steps with a
  checkpoint at every one; yields the model's module and the run directory."""
  project = tmp_path_factory.mktemp('project')
  (project / 'changing_model.py').write_text(MODEL)
  with pytest.MonkeyPatch.context() as patch:
    patch.syspath_prepend(str(project))
    import changing_model
    workdir = project / 'runs' / 'mine'
    run.train(changing_model.get_config(), workdir)
    yield changing_model, workdir
    sys.modules.pop('changing_model', None)


def _edit(module, monkeypatch) -> None:
  """The user's edit of their model file: the first layer wider, a third layer."""
  monkeypatch.setattr(module, 'HIDDEN', 32)
  monkeypatch.setattr(module, 'THIRD_LAYER', True)


def test_a_resume_of_a_changed_model_names_the_parameters_and_walks_nothing_back(
    trained, monkeypatch, capsys):
  module, workdir = trained
  _edit(module, monkeypatch)
  capsys.readouterr()
  with pytest.raises(ConfigError, match=f'^{CHANGED.format(checkpoints=workdir / "checkpoints")}$'):
    run.train(run.override(module.get_config(), ['steps=5']), workdir, resume=True)
  assert 'warning' not in capsys.readouterr().err  # no step was skipped for an older one
  assert sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir()) == [1, 2, 3]


def test_load_model_of_a_changed_model_names_the_parameters(trained, monkeypatch, capsys):
  module, workdir = trained
  unchanged = run.load_model(workdir, devices=[jax.devices()[0]])
  assert unchanged.l1.kernel[...].shape == (8, 16)
  _edit(module, monkeypatch)
  capsys.readouterr()
  with pytest.raises(ConfigError, match=f'^{CHANGED.format(checkpoints=workdir / "checkpoints")}$'):
    run.load_model(workdir, devices=[jax.devices()[0]])
  with pytest.raises(ConfigError, match=r'^checkpoint step 1 in .* 3 changed '):  # asked by step
    run.load_model(workdir, step=1, devices=[jax.devices()[0]])
  assert capsys.readouterr().err == ''


def test_the_cli_resume_of_an_edited_model_file_is_one_line_and_exit_2(trained, tmp_path):
  """The user's case as they ran it: the model file edited, then ``train.py --resume``."""
  _, workdir = trained
  edited = MODEL.replace('HIDDEN = 16', 'HIDDEN = 32').replace('THIRD_LAYER = False',
                                                                'THIRD_LAYER = True')
  (tmp_path / 'changing_model.py').write_text(edited)
  run_dir = tmp_path / 'runs' / 'mine'
  shutil.copytree(workdir, run_dir)
  result = subprocess.run(
      [sys.executable, str(ROOT / 'experiments' / 'train.py'),
       '--config=changing_model:get_config', '--workdir=runs/mine', '--resume', '--steps=5',
       '--jax_num_cpu_devices=8'],
      cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = result.stderr.strip().splitlines()
  assert line.startswith('train.py: error: checkpoint step 3 in runs/mine/checkpoints holds '
                         'other parameters than this model'), line
  assert "'params/l3/kernel' [4, 4]" in line and 'warning' not in result.stderr


def _state(optimizer, hidden=8, step=1):
  params = {'w': jnp.ones((4, hidden)), 'b': jnp.zeros((hidden,))}
  return TrainState(jnp.int32(step), params, optimizer.init(params))


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      state)


def test_another_optimizers_state_is_named_as_such(tmp_path, capsys):
  """Parameters alike, optimizer state not (sgd saved, adam now): the state is named, not the
  parameters, and nothing is walked back either."""
  ckpt = Checkpointer(tmp_path / 'ckpt', asynchronous=False)
  for step in (1, 2):
    ckpt.save(_state(optax.sgd(0.1), step=step), {})
  with pytest.raises(ConfigError, match=(
      r"^checkpoint step 2 in .* holds another state than this run's \(was the optimizer changed "
      r"since it was saved\?\): 5 not in the checkpoint \('opt_state/0/count' \[\]; "
      r"'opt_state/0/mu/b' \[8\]; .*\); the run's older checkpoints hold the same")):
    ckpt.restore(_abstract(_state(optax.adam(0.1))))
  assert capsys.readouterr().err == ''
  ckpt.close()


def test_a_latest_checkpoint_whose_record_is_corrupt_is_still_skipped(tmp_path, capsys):
  """A record that does not read back says nothing about the model: the step is bad, and the
  one before it is restored with one warning, as for any corrupt checkpoint."""
  ckpt = Checkpointer(tmp_path / 'ckpt', asynchronous=False)
  for step in (1, 2):
    ckpt.save(_state(optax.sgd(0.1), step=step), {})
  (tmp_path / 'ckpt' / '2' / 'meta' / 'metadata').write_text('{"step": 2, "checks')
  restored, meta = ckpt.restore(_abstract(_state(optax.sgd(0.1))))
  assert int(restored.step) == meta['step'] == 1
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line.startswith(f'warning: checkpoint step 2 in {tmp_path / "ckpt"} is unreadable (')
  assert line.endswith('); using step 1')
  ckpt.close()


def test_difference_doctest_and_what_it_names():
  assert doctest.testmod(_fit).failed == 0

  def spec(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)

  def record(tree):
    return {jax.tree_util.keystr(p, simple=True, separator='/'): {
        'sum': 0, 'shape': list(x.shape), 'dtype': str(x.dtype)}
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}

  model = {'params': {'w': spec(8, 16), 'b': spec(16)}, 'step': spec()}
  assert _fit.difference(record(model), model) is None
  retyped = {'params': {'w': spec(8, 16, dtype=jnp.bfloat16), 'b': spec(16)}, 'step': spec()}
  assert _fit.difference(record(model), retyped) == (
      'holds other parameters than this model (was the model changed since it was saved?): '
      "1 changed ('params/w' float32[8, 16] saved, bfloat16[8, 16] now)")
  smaller = {'params': {'w': spec(8, 16)}, 'step': spec()}
  assert _fit.difference(record(model), smaller).endswith(
      "1 only in the checkpoint ('params/b' [16])")
  # A part another process restores (None: a pipeline stage it does not hold) is not compared.
  stages = {'params': ({'w': spec(8, 16)}, {'w': spec(16, 4)})}
  assert _fit.difference(record(stages), {'params': (None, {'w': spec(16, 4)})}) is None
  assert '[16, 4] saved, [16, 8] now' in _fit.difference(record(stages),
                                                         {'params': (None, {'w': spec(16, 8)})})
  # At most LISTED leaves are named; the rest are counted.
  wide = {'params': {f'w{i:02d}': spec(i + 1) for i in range(14)}}
  message = _fit.difference(record(wide), {'params': {}})
  assert message.endswith("'params/w09' [10]; and 4 more)") and message.count("'params/") == 10
  assert all(f"'params/w{i:02d}'" in message for i in range(10))
