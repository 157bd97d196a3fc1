"""Evaluating a finished run (`hetjax.run.evaluate`, ``experiments/evaluate.py``): the run's own
final evaluation again, from its checkpoint, on one device."""

import json
import pathlib
import subprocess
import sys

import jax
import pytest

from hetjax import ConfigError, run
from tests.conftest import require_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ['steps=2', 'model.args.layers=1', 'model.args.d_model=32', 'model.args.heads=2',
        'model.args.mlp=64', 'model.args.seq_len=16', 'global_batch=8', 'mesh=8x1',
        'eval.batches=2', 'eval.every=0', 'logging.mfu=False', 'logging.tensorboard=False',
        'checkpoint_every=1']


@pytest.fixture(scope='module')
def gpt_run(tmp_path_factory):
  """A 2-step gpt run on the 8-device mesh, checkpointed at both steps and evaluated at its
  end on 2 held-out batches."""
  require_devices(8)
  workdir = tmp_path_factory.mktemp('gpt')
  summary = run.train(run.override(run.load_config('gpt'), TINY), workdir, overwrite=True)
  return workdir, summary


def test_evaluate_is_the_runs_final_evaluation(gpt_run):
  """The same two batches under the same parameters (the last checkpoint is the last step's).
  The run's forward was split over 8 devices (one row each, the mean an all-reduce); here it
  runs on one device, or on all 8 again: only float32 summation order can differ. One ulp of a
  loss near ln 256 ≈ 5.5 is 4.8e-7, 8.6e-8 relative; a batch's mean off by a few ulp stays
  under 1e-6 (measured: 4.3e-8 on one device, equal on 8). The perplexity, exp(loss), has the
  loss's absolute error as its relative one: 5.5e-6 at most, under 1e-5."""
  workdir, summary = gpt_run
  one = run.evaluate(workdir, batches=2, devices=jax.devices()[:1])
  assert (one['step'], one['batches'], one['batch'], one['devices']) == (2, 2, 8, 1)
  assert one['eval_loss'] == pytest.approx(summary['eval_loss'], rel=1e-6)
  assert one['eval_perplexity'] == pytest.approx(summary['eval_perplexity'], rel=1e-5)
  every = run.evaluate(workdir, batches=2)  # the 8 devices: rows split like the run's
  assert every['devices'] == 8
  assert every['eval_loss'] == pytest.approx(summary['eval_loss'], rel=1e-6)
  first = run.evaluate(workdir, batches=1, devices=jax.devices()[:1])
  assert first['eval_loss'] != one['eval_loss']  # batch 1 counts in the mean of two


def test_an_earlier_step_and_what_is_refused(gpt_run, tmp_path):
  workdir, summary = gpt_run
  earlier = run.evaluate(workdir, step=1, batches=2, devices=jax.devices()[:1])
  assert earlier['step'] == 1 and earlier['eval_loss'] != summary['eval_loss']
  with pytest.raises(ConfigError, match='holds no run'):
    run.evaluate(tmp_path)
  with pytest.raises(ConfigError, match='batches must be >= 1'):
    run.evaluate(workdir, batches=0)
  (tmp_path / 'config.json').write_text(json.dumps(run.load_config('wide_deep').to_json()))
  with pytest.raises(ConfigError, match='model wide_deep, which has no held-out split'):
    run.evaluate(tmp_path)
  for name in ('config.json', 'run.json'):  # the run without its checkpoints
    (tmp_path / name).write_text((workdir / name).read_text())
  with pytest.raises(ConfigError, match='holds no checkpoint'):
    run.evaluate(tmp_path)


def _cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'experiments/evaluate.py', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_the_cli_writes_eval_json_and_refuses_a_dir_without_a_run(gpt_run, tmp_path):
  workdir, summary = gpt_run
  result = _cli(f'--workdir={workdir}', '--batches=2')
  assert result.returncode == 0, result.stderr[-2000:]
  written = json.loads((workdir / 'eval.json').read_text())
  assert written['step'] == 2
  assert written['eval_loss'] == pytest.approx(summary['eval_loss'], rel=1e-6)
  assert f'eval_loss {written["eval_loss"]:.4f}' in result.stdout
  refused = _cli(f'--workdir={tmp_path}')
  assert refused.returncode == 2
  assert refused.stderr.strip() == f'evaluate.py: error: {tmp_path} holds no run (no config.json)'
