"""Gradient accumulation, schedules, clipping and weight decay from the config: k micro-batches
are one batch of k× rows, in every program that computes a gradient (the launched share and ps
cases are in tests/test_workers.py and tests/test_ps_launched.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import ConfigError, models, run, sharding, train
from hetjax.core import Work
from tests.conftest import require_devices

#: Exactness tests that fit one device: `-m gpu` runs them on an accelerator (issue 27).
pytestmark = pytest.mark.gpu

SGD = optax.sgd(0.1)


def _tiny_lm():
  return models.make_task('transformer', d_model=16, heads=2, layers=1, mlp=32, seq_len=8)


@pytest.mark.parametrize('rows, micro_rows', [(12, 4), (12, 5), (7, 2), (8, 8), (8, 100)])
def test_micro_batches_sum_to_the_whole_batch(rows, micro_rows):
  """Any cut of the rows, padded or not, gives the whole batch's sum and gradient."""
  task = models.make_task('mlp', hidden=16, width=8)
  with nnx.use_eager_sharding(False):  # a model with logical names, built outside a mesh
    graphdef, params = nnx.split(task.make_model(nnx.Rngs(0)))
  batch = {k: jnp.asarray(v) for k, v in task.data.global_batch(0, 0, rows).items()}

  def per_example(p, b):
    return task.loss(nnx.merge(graphdef, p), b)

  whole = train.summed_value_and_grad(per_example, params, batch, rows)
  parts = train.summed_value_and_grad(per_example, params, batch, rows, micro_rows)
  np.testing.assert_allclose(parts[0], whole[0], rtol=1e-6)
  for got, want in zip(jax.tree.leaves(parts[1]), jax.tree.leaves(whole[1]), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_micro_rows_are_rounded_to_the_degree():
  assert train.micro_rows_of(64, 1) is None
  assert train.micro_rows_of(64, 3) == 22
  assert train.micro_rows_of(64, 3, degree=4) == 24
  assert train.micro_rows_of(5, 8, degree=2) == 2
  with pytest.raises(ConfigError, match='accumulate must be'):
    train.micro_rows_of(64, 0)


@pytest.mark.parametrize('accumulate', [2, 4])
def test_spmd_step_with_k_micro_batches_equals_one_batch(accumulate):
  """4 devices, data parallel: 4 steps of 32 rows in k micro-batches of 32/k rows give the
  losses and parameters of 4 steps of 32 rows in one pass (float32 sums in another order)."""
  mesh = sharding.make_mesh((4, 1), devices=require_devices(4))
  task, rules = _tiny_lm(), train.Strategy.DATA_PARALLEL.rules()

  def run_steps(k):
    trainer = train.Trainer(task, SGD, 32, mesh, rules, accumulate=k)
    state, losses = trainer.init_state(), []
    for step in range(4):
      state, stats = trainer.step(state, Work(step, trainer.global_batch_at(step)))
      losses.append(float(stats.loss))
    return losses, jax.device_get(state.params), int(state.step)

  want_losses, want_params, want_step = run_steps(1)
  losses, params, step = run_steps(accumulate)
  assert step == want_step == 4  # optimizer steps, not micro-batches
  np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(want_params), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_spmd_refuses_micro_batches_that_do_not_split_over_the_devices():
  mesh = sharding.make_mesh((4, 1), devices=require_devices(4))
  with pytest.raises(ConfigError, match='not divisible by accumulate 3 x the data-parallel '
                                        'degree 4'):
    train.Trainer(_tiny_lm(), SGD, 32, mesh, train.Strategy.DATA_PARALLEL.rules(), accumulate=3)


def test_worker_trainer_accumulates_its_share():
  require_devices(8)
  """One worker (this process, 8 devices), its 24 rows in micro-batches of 12 rounded up to the
  degree 8: two passes of 16, 8 rows padded: the update of one pass."""
  task = models.make_task('mlp', hidden=16, width=8)
  rules = train.Strategy.DATA_PARALLEL.rules()

  def run_steps(k):
    trainer = train.WorkerTrainer(task, SGD, 24, (8, 1), rules, accumulate=k)
    state, losses = trainer.init_state(), []
    for step in range(3):
      state, stats = trainer.step(state, Work(step, trainer.global_batch_at(step)), (24,))
      losses.append(float(stats.loss))
    trainer.close()
    return losses, jax.device_get(trainer.local_view(state.params))

  want_losses, want_params = run_steps(1)
  losses, params = run_steps(2)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(want_params), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _metrics_losses(workdir):
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [r['loss'] for r in rows if 'loss' in r]


@pytest.mark.parametrize('mode, extra', [('spmd', ['mesh=8x1'])])
def test_accumulate_from_the_config_keeps_the_losses(tmp_path, mode, extra):
  """``optimizer.accumulate=2`` in a run from the config logs the losses of ``accumulate=1``
  (pipelines and plans: ``micro_batches`` × ``accumulate``, in tests/test_lm_modes.py's plan
  case)."""
  require_devices(8)
  base = run.override(run.load_config('mlp'), [
      'steps=4', 'log_every=1', 'checkpoint_every=4', 'model_args.hidden=16',
      'model_args.width=8', 'global_batch=64', 'optimizer=sgd', f'mode={mode}', *extra])
  losses = []
  for k in (1, 2):
    workdir = tmp_path / f'k{k}'
    summary = run.train(run.override(base, [f'optimizer.accumulate={k}']), workdir)
    assert summary['final_step'] == 4
    losses.append(_metrics_losses(workdir))
  assert len(losses[0]) == 4
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)


def test_schedules_rise_then_decay():
  cosine = train.learning_rate_schedule(1.0, 100, 'cosine', warmup=10, final_fraction=0.1)
  linear = train.learning_rate_schedule(1.0, 100, 'linear', warmup=10, final_fraction=0.1)
  for rate in (cosine, linear):
    assert float(rate(0)) == 0.0 and float(rate(5)) == pytest.approx(0.5)
    assert float(rate(10)) == pytest.approx(1.0)
    assert float(rate(100)) == pytest.approx(0.1)
  assert float(linear(55)) == pytest.approx(0.55)
  assert float(cosine(55)) == pytest.approx(0.1 + 0.9 * 0.5)
  assert train.learning_rate_schedule(0.3, 100) == 0.3
  assert float(train.learning_rate_schedule(0.3, 100, warmup=3)(50)) == pytest.approx(0.3)


def test_optimizer_from_the_config_clips_and_decays():
  config = run.override(run.Config('mlp'), [
      'optimizer.name=sgd', 'optimizer.learning_rate=1.0', 'optimizer.clip_norm=1.0',
      'optimizer.weight_decay=0.5'])
  tx, rate = run.optimizer_of(config)
  params = {'w': jnp.array([2.0, 0.0])}
  updates, _ = tx.update({'w': jnp.array([30.0, 40.0])}, tx.init(params), params)
  # clipped to norm 1: (0.6, 0.8); plus 0.5 · w = (1, 0); times -lr
  np.testing.assert_allclose(updates['w'], [-1.6, -0.8], rtol=1e-6)
  assert rate(7) == 1.0


@pytest.mark.parametrize('assignment, message', [
    ('optimizer.schedule=step', "unknown optimizer.schedule 'step'; choose one of: constant"),
    ('optimizer.accumulate=0', 'optimizer.accumulate must be >= 1, got 0'),
    ('optimizer.clip_norm=-1', 'optimizer.clip_norm must be >= 0'),
    ('optimizer.final_fraction=2', r'optimizer.final_fraction must be in \[0, 1\]'),
    ('model.remat=some', "unknown model.remat 'some'; choose one of: none, full, save_dots"),
    ('model.dtype=int8', "unknown model.dtype 'int8'; choose one of: float32, bfloat16, float16"),
    ('eval.batches=0', 'eval.batches must be >= 1, got 0'),
])
def test_bad_training_options_fail_in_one_line(assignment, message):
  with pytest.raises(ConfigError, match=message):
    run.override(run.Config('mlp'), [assignment])


def test_a_run_shorter_than_its_warmup_only_warms_up():
  config = run.override(run.Config('mlp'), ['optimizer.schedule=cosine', 'optimizer.warmup=100',
                                            'optimizer.steps=10', 'optimizer.learning_rate=1'])
  rate = run.optimizer_of(config)[1]
  assert [round(float(rate(s)), 6) for s in (0, 5, 9)] == [0.0, 0.05, 0.09]


def test_precision_for_a_model_without_it_is_named():
  config = run.override(run.Config('mlp'), ['model.dtype=bfloat16'])
  with pytest.raises(ConfigError, match=r"model.dtype: model 'mlp' takes no dtype argument"):
    run.make_task(config)
