"""The run as a library: `hetjax.run.train` from Python, `load_model`, and a model of the user's
own trained and planned from the user's own directory through the console entries."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from hetjax import ConfigError, run
from tests.conftest import require_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """An mlp trained 6 steps on a 4x2 hybrid mesh of 8 devices, from Python."""
  require_devices(8)
  workdir = tmp_path_factory.mktemp('run') / 'mlp'
  config = run.override(run.load_config('mlp'), [
      'steps=6', 'checkpoint_every=3', 'log_every=3', 'model_args.hidden=32',
      'model_args.width=16', 'global_batch=64'])
  summary = run.train(config, workdir)
  return workdir, summary


def test_train_from_python_writes_the_run_the_cli_writes(trained):
  workdir, summary = trained
  assert summary['final_step'] == 6 and summary['checkpoint_steps'] == [3, 6]
  assert json.loads((workdir / 'config.json').read_text())['parallelism']['mesh'] == '4x2'
  assert json.loads((workdir / 'summary.json').read_text())['final_step'] == 6
  with pytest.raises(ConfigError, match='already holds a run'):
    run.train(run.load_config('mlp'), workdir)


def test_load_model_on_any_device_count_gives_the_same_model(trained):
  """The 8-device run's parameters loaded onto 1 device and onto 8 compute the same outputs,
  and step 3's differ from step 6's (the step asked for is the one loaded)."""
  workdir, _ = trained
  task = run.make_task(run.Config.from_json(json.loads((workdir / 'config.json').read_text())))
  x = task.data.global_batch(seed=5, step=0, size=16)['x']
  one = run.load_model(workdir, devices=[jax.devices()[0]])
  eight = run.load_model(workdir, devices=require_devices(8))
  np.testing.assert_allclose(np.asarray(one(x)), np.asarray(eight(x)), rtol=1e-6, atol=1e-6)
  earlier = run.load_model(workdir, step=3, devices=[jax.devices()[0]])
  assert not np.allclose(np.asarray(earlier(x)), np.asarray(one(x)))


def test_load_model_refuses_in_one_line(tmp_path):
  with pytest.raises(ConfigError, match='holds no run'):
    run.load_model(tmp_path)
  (tmp_path / 'config.json').write_text(json.dumps(run.load_config('mlp').to_json()))
  (tmp_path / 'run.json').write_text(json.dumps({'mode': 'pipeline'}))
  with pytest.raises(ConfigError, match='mode pipeline: load_model reads'):
    run.load_model(tmp_path)
  (tmp_path / 'config.json').write_text(json.dumps({'model': 'mlp', 'learning_rat': 0.1}))
  with pytest.raises(ConfigError, match="unknown config field 'learning_rat'"):
    run.load_model(tmp_path)


def _user_project(root: pathlib.Path) -> pathlib.Path:
  """A package of the user's own (`examples/regression.py` as ``mypkg/mymodel.py``) and a config
  file beside it, in a directory outside the checkout."""
  (root / 'mypkg').mkdir()
  (root / 'mypkg' / '__init__.py').write_text('')
  source = (ROOT / 'examples' / 'regression.py').read_text()
  (root / 'mypkg' / 'mymodel.py').write_text(
      source.replace('examples.regression:make_task', 'mypkg.mymodel:make_task'))
  (root / 'mymodel.py').write_text('from mypkg.mymodel import get_config  # noqa: F401\n')
  return root


def _entry(name: str, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  return subprocess.run([str(BIN / name), *args], cwd=cwd, capture_output=True, text=True,
                        timeout=300, env=env)


@pytest.mark.skipif(not (BIN / 'hetjax-train').exists(),
                    reason='the console entries are not installed in this environment')
def test_a_model_of_your_own_from_your_own_directory_with_no_pythonpath(tmp_path):
  project = _user_project(tmp_path)
  for spec in ('mymodel.py', 'mypkg.mymodel:get_config'):
    result = _entry('hetjax-train', f'--config={spec}', '--steps=2', '--workdir=runs/mine',
                    '--overwrite', cwd=project)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (project / 'runs' / 'mine' / 'summary.json').is_file()
  result = _entry('hetjax-plan', '--config=mymodel.py', cwd=project)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "lists no submodels(), so it is planned whole, as one part 'model'" in result.stdout


def test_a_resume_that_moves_a_decaying_schedule_says_so(tmp_path, capsys):
  require_devices(8)
  config = run.override(run.load_config('mlp'), [
      'model_args.hidden=16', 'model_args.width=8', 'global_batch=16', 'log_every=1',
      'checkpoint_every=2', 'optimizer.schedule=cosine', 'logging.mfu=False',
      'logging.tensorboard=False', 'eval.enabled=False'])
  run.train(run.override(config, ['steps=2']), tmp_path)
  capsys.readouterr()
  run.train(run.override(config, ['steps=3']), tmp_path, resume=True)
  assert ('resume: the cosine schedule now decays over 3 steps, the run it resumes over 2'
          in capsys.readouterr().out)
  run.train(run.override(config, ['steps=4', 'optimizer.decay_steps=4']), tmp_path, resume=True)
  assert 'schedule now decays' not in capsys.readouterr().out
