"""The loop of steps: hooks at step boundaries, metrics without per-step syncs."""

import io
import json

import optax
import pytest

from hetjax import models
from hetjax.sharding import make_mesh
from hetjax.train import Hook, MetricsLogger, Strategy, Trainer, training_steps
from tests.conftest import require_devices

#: Exactness tests that fit one device: `-m gpu` runs them on an accelerator (issue 27).
pytestmark = pytest.mark.gpu


@pytest.fixture(scope='module')
def trainer():
  mesh = make_mesh((2, 1), devices=require_devices(2))
  return Trainer(models.make_task('mlp', hidden=32, width=16), optax.sgd(0.1), 32, mesh,
                 Strategy.DATA_PARALLEL.rules())


def test_hooks_run_every_n_steps_and_at_the_end(trainer):
  seen = {'every3': [], 'end': [], 'all': []}
  hooks = [Hook(lambda i: seen['every3'].append(i.step), every=3),
           Hook(lambda i: seen['end'].append(i.step), every=100, at_end=True),
           Hook(lambda i: seen['all'].append(int(i.state.step)))]
  steps = [info.step for info in training_steps(trainer, trainer.init_state(), 7, hooks)]
  assert steps == seen['all'] == [1, 2, 3, 4, 5, 6, 7]
  assert seen['every3'] == [3, 6] and seen['end'] == [7]


def test_loop_starts_at_the_state_step(trainer):
  first = list(training_steps(trainer, trainer.init_state(), 3))
  assert list(training_steps(trainer, first[-1].state, 3)) == []  # already there: no step
  rest = [i.step for i in training_steps(trainer, first[-1].state, 5)]
  assert rest == [4, 5]


def test_metrics_logger_writes_every_step_and_prints_every_n(trainer, tmp_path):
  out = io.StringIO()
  logger = MetricsLogger(tmp_path / 'm.jsonl', global_batch=32, total_steps=5, every=2, stream=out)
  for _ in training_steps(trainer, trainer.init_state(), 5, [logger.hook()]):
    pass
  logger.close()
  rows = [json.loads(line) for line in (tmp_path / 'm.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows] == [1, 2, 3, 4, 5]
  assert [r['step'] for r in rows if 'samples_per_s' in r] == [2, 4, 5]
  assert all(r['loss'] > 0 for r in rows)
  lines = out.getvalue().splitlines()
  assert len(lines) == 3 and lines[0].startswith('step 2/5 | loss ')
  summary = logger.summary()
  assert summary['final_step'] == 5 and summary['steady_samples_per_s'] > 0
