"""Periodic evaluation: every program's `evaluate` is the loss its next step reports on the same
rows (a forward pass under the same parameters), and the hook averages fixed held-out batches
(the launched modes evaluate through the runner: tests/test_train_cli.py)."""

import math

import numpy as np
import optax
import pytest

from hetjax import models, sharding, train
from hetjax.core import Work
from hetjax.pipeline import PipelineTrainer
from tests.conftest import require_devices

#: Exactness tests that fit one device: `-m gpu` runs them on an accelerator (issue 27).
pytestmark = pytest.mark.gpu

SMALL = {'d_model': 16, 'heads': 2, 'layers': 2, 'mlp': 32, 'seq_len': 8}


@pytest.fixture(scope='module')
def task():
  return models.make_task('transformer', **SMALL)


def _first_step_matches_evaluate(program, state, decision=None):
  batch = program.global_batch_at(0)
  before = program.evaluate(state, batch)['loss']
  state, stats = program.step(state, Work(0, batch), decision)
  np.testing.assert_allclose(before, float(stats.loss), rtol=1e-6)
  after = program.evaluate(state, batch)['loss']
  assert after < before  # the step moved the parameters evaluate reads
  return state


def test_spmd_evaluate_is_the_step_loss(task):
  mesh = sharding.make_mesh((2, 2), devices=require_devices(4))
  trainer = train.Trainer(task, optax.sgd(0.5), 16, mesh, train.Strategy.HYBRID.rules())
  _first_step_matches_evaluate(trainer, trainer.init_state())


def test_worker_evaluate_is_the_step_loss(task):
  require_devices(8)
  trainer = train.WorkerTrainer(task, optax.sgd(0.5), 16, (8, 1))
  _first_step_matches_evaluate(trainer, trainer.init_state(), (16,))
  trainer.close()


def test_pipeline_evaluate_is_the_step_loss(task):
  trainer = PipelineTrainer(task, optax.sgd(0.5), 16, 2, 2, devices=require_devices(2))
  _first_step_matches_evaluate(trainer, trainer.init_state())


def test_the_hook_averages_fixed_held_out_batches(task):
  mesh = sharding.make_mesh((1, 1), devices=require_devices(1))
  trainer = train.Trainer(task, optax.sgd(0.5), 8, mesh, train.Strategy.DATA_PARALLEL.rules())
  records = []
  evaluation = train.Evaluation(task.data, seed=3, batch=8, batches=2, on_result=records.append)
  state = trainer.init_state()
  want = np.mean([trainer.evaluate(state, task.data.global_batch(3, i, 8))['loss']
                  for i in range(2)])
  assert evaluation.run(trainer, state, 0)['eval_loss'] == pytest.approx(want, rel=1e-6)
  hook = evaluation.hook(trainer, every=2, until=5)
  for info in train.training_steps(trainer, state, 5, hooks=[hook]):
    state = info.state
  assert [r['step'] for r in records] == [0, 2, 4, 5]
  assert records[-1]['eval_perplexity'] == pytest.approx(math.exp(records[-1]['eval_loss']))
  assert records[-1]['eval_loss'] < records[0]['eval_loss']


def test_a_classifier_reports_its_accuracy_on_held_out_rows():
  """The mlp holds out the last 10% of the digits; evaluation reports accuracy beside the loss,
  and it rises above chance in a few steps."""
  task = models.make_task('mlp', hidden=32, width=16)
  assert task.eval_data.num_examples == 180 and task.data.num_examples == 1617
  mesh = sharding.make_mesh((1, 1), devices=require_devices(1))
  trainer = train.Trainer(task, optax.adam(1e-2), 64, mesh, train.Strategy.DATA_PARALLEL.rules())
  evaluation = train.Evaluation(task.eval_data, seed=0, batch=90, batches=2)
  state = trainer.init_state()
  for info in train.training_steps(trainer, state, 30):
    state = info.state
  record = evaluation.run(trainer, state, 30)
  assert record['eval_accuracy'] > 0.5 and record['eval_loss'] < 1.5
