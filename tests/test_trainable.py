"""A model whose state is not all float parameters trains in every step program: an
`nnx.Dropout` that keeps its own stream (a uint32 count and a PRNG key) and an integer buffer
beside the parameters. Only the float leaves are differentiated and given optimizer state
(`hetjax.train.split_trainable`); the rest is carried through each step unchanged, so a run
over a 4x2 mesh, one process's `WorkerTrainer` and `OverlapTrainer`, and a parameter-server
job, a two-stage pipeline each equal one device, and an all-float model's optimizer state is
the one it always had.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import models, ps, run, sharding, train
from hetjax.core import Work
from hetjax.data import ArraySource
from hetjax.pipeline import Link, PipelineTrainer
from hetjax.runtime import LocalChannel
from hetjax.sharding import LogicalRules, ShardingRules, make_mesh
from hetjax.train import OverlapTrainer, Strategy, Trainer, WorkerTrainer, training_steps
from tests.conftest import require_devices

FEATURES, HIDDEN, CLASSES, BATCH, STEPS = 8, 16, 4, 16, 4
ADAM = optax.adam(3e-2)
FIXED = ('front/dropout/rngs/count', 'front/dropout/rngs/key', 'front/shift')


class Buffer(nnx.Variable):
  """An integer array a model keeps beside its parameters (not trained)."""


class Front(nnx.Module):
  """Shift by an integer buffer → Linear → ReLU → Dropout (the model's own stream)."""

  def __init__(self, *, rngs: nnx.Rngs):
    init, zeros = nnx.initializers.lecun_normal(), nnx.initializers.zeros_init()
    self.up = nnx.Linear(FEATURES, HIDDEN, rngs=rngs,
                         kernel_init=nnx.with_partitioning(init, ('embed', 'mlp')),
                         bias_init=nnx.with_partitioning(zeros, ('mlp',)))
    self.dropout = nnx.Dropout(0.25, rngs=rngs)
    self.shift = Buffer(jnp.arange(FEATURES, dtype=jnp.int32) % 3 - 1)

  def __call__(self, x):
    return self.dropout(nnx.relu(self.up(x + self.shift[...])))


class Tiny(nnx.Module):
  """`Front` → Linear, also as a pipeline chain of the two (`hetjax.pipeline.HasChain`)."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.front = Front(rngs=rngs)
    self.head = nnx.Linear(HIDDEN, CLASSES, rngs=rngs, kernel_init=nnx.with_partitioning(
        nnx.initializers.lecun_normal(), ('mlp', None)))

  def __call__(self, x):
    return self.head(self.front(x))

  def chain(self) -> tuple[Link, ...]:
    return (Link('front', self.front, lambda front, _, batch: front(batch['x'])),
            Link('head', self.head, lambda head, h, _: head(h)))

  def chain_loss(self, logits, batch):
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])


def _task() -> train.Task:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((256, FEATURES)).astype(np.float32)
  y = np.argmax(x @ rng.standard_normal((FEATURES, CLASSES)), axis=-1).astype(np.int32)

  def loss(model, batch):
    return model.chain_loss(model(batch['x']), batch)

  return train.Task('tiny_dropout', lambda rngs: Tiny(rngs=rngs), loss,
                    ArraySource({'x': x, 'y': y}))


def _host(tree):
  """``tree`` on the host, a PRNG key as its key data."""
  return jax.device_get(jax.tree.map(
      lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x,
      tree))


def _spmd(mesh_shape, rules) -> tuple[list[float], dict, dict]:
  """``(losses, params after STEPS steps, initial params)`` of a `Trainer` on ``mesh_shape``."""
  mesh = make_mesh(mesh_shape, devices=require_devices(int(np.prod(mesh_shape))))
  trainer = Trainer(_task(), ADAM, BATCH, mesh, rules)
  state = trainer.init_state()
  initial, losses = _host(state.params), []
  for info in training_steps(trainer, state, STEPS):
    losses.append(float(info.stats.loss))
    state = info.state
  return losses, _host(state.params), initial


@pytest.fixture(scope='module')
def one_device():
  return _spmd((1, 1), ShardingRules(LogicalRules(), LogicalRules()))


def _assert_same(got, want):
  for (path, a), (_, b) in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                               jax.tree_util.tree_flatten_with_path(want)[0], strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_split_and_merge_keep_every_leaf():
  with nnx.use_eager_sharding(False):
    graphdef, state = nnx.split(Tiny(rngs=nnx.Rngs(0)))
  params = nnx.to_pure_dict(state)
  trainable, fixed = train.split_trainable(params)
  assert jax.tree.structure(train.merge_trainable(trainable, fixed)) == jax.tree.structure(params)
  assert len(jax.tree.leaves(trainable)) == 4 and len(jax.tree.leaves(fixed)) == 3
  assert all(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(trainable))
  _, grads = train.trainable_value_and_grad(
      lambda p: jnp.sum(nnx.merge(graphdef, p)(jnp.ones((2, FEATURES)))))(params)
  assert jax.tree.structure(grads) == jax.tree.structure(trainable)


def test_dropout_stream_and_buffer_train_on_one_device_held_fixed(one_device):
  """It trains (the loss falls), and the stream and the buffer end as they started: the
  stream's count is not advanced, so its masks repeat every step (the documented cost)."""
  losses, params, initial = one_device
  assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
  for path in FIXED:
    keys = path.split('/')
    got, want = params, initial
    for k in keys:
      got, want = got[k], want[k]
    np.testing.assert_array_equal(got, want, err_msg=path)
  assert not np.allclose(params['front']['up']['kernel'], initial['front']['up']['kernel'])


def test_a_4x2_mesh_equals_one_device(one_device):
  """Hybrid rules on a 4x2 mesh: the parameters split over 'model', the batch over 'data';
  one mask is drawn for the whole batch, the same however the mesh splits it."""
  losses, params, _ = _spmd((4, 2), Strategy.HYBRID.rules())
  np.testing.assert_allclose(losses, one_device[0], rtol=1e-5)
  _assert_same(params, one_device[1])


def test_a_worker_trainer_of_one_process_equals_one_device(one_device):
  """`WorkerTrainer`'s fused all-reduce carries the float parameters' gradients only."""
  require_devices(8)
  trainer = WorkerTrainer(_task(), ADAM, BATCH)  # all 8 devices on 'data'
  assert trainer.fused_size == trainer.fused_layout.head + sum(
      x.size for x in jax.tree.leaves(train.split_trainable(_host(one_device[2]))[0]))
  state, losses = trainer.init_state(), []
  for step in range(STEPS):
    state, stats = trainer.step(state, Work(step, trainer.global_batch_at(step)), (BATCH,))
    losses.append(float(stats.loss))
  trainer.close()
  np.testing.assert_allclose(losses, one_device[0], rtol=1e-5)
  _assert_same(_host(trainer.local_view(state.params)), one_device[1])


def test_the_all_reduce_scheduler_of_one_process_equals_one_device(one_device):
  """`OverlapTrainer`: its estimate w̃ moves the float parameters only; flushed after `STEPS`
  steps it is the synchronous recurrence, one device's."""
  require_devices(8)
  program = OverlapTrainer(_task(), ADAM, BATCH)
  state = program.init_state()
  for step in range(STEPS):
    state, _ = program.step(state, Work(step, program.global_batch_at(step)), (BATCH,))
  state = program.flush(state)
  program.close()
  _assert_same(_host(program.local_view(state.train.params)), one_device[1])


def test_a_pipeline_of_two_stages_equals_one_device(one_device):
  """Each stage differentiates and updates its own float parameters; the first stage's
  stream and buffer are carried unchanged. One micro-batch: the mask is one device's."""
  trainer = PipelineTrainer(_task(), ADAM, BATCH, stages=2, devices=require_devices(2))
  state, losses = trainer.init_state(), []
  for step in range(STEPS):
    state, loss = trainer.train_step(state, trainer.global_batch_at(step))
    losses.append(float(loss))
  np.testing.assert_allclose(losses, one_device[0], rtol=1e-5)
  _assert_same(_host(trainer.merge_tree(state.params)), one_device[1])


@pytest.mark.timeout(120)
def test_a_parameter_server_job_equals_one_device(one_device):
  """One server holds the float parameters; the worker holds the stream and the buffer fixed
  and never sends them (bsp: the server's update is one device's)."""
  task, channel, errors, finals = _task(), LocalChannel(), [], []
  config = ps.parse_ps('bsp')

  def server():
    try:
      ps.make_server(task, ADAM, config, ps.PsRole(True, 0, 1, 1), channel,
                     idle_timeout_s=60).serve()
    except Exception as e:  # surfaced below
      errors.append(e)

  def worker():
    try:
      program = ps.make_worker(task, BATCH, config, ps.PsRole(False, 0, 1, 1), channel,
                               timeout_s=60)
      state = program.init_state()
      for info in training_steps(program, state, STEPS):
        state = info.state
      finals.append(program.finish(state))
    except Exception as e:
      errors.append(e)

  threads = [threading.Thread(target=server), threading.Thread(target=worker)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(100)
  assert not errors, errors
  _assert_same(_host(finals[0].params), one_device[1])


@pytest.mark.parametrize('optimizer', [optax.adam(1e-3), optax.sgd(0.1, momentum=0.9)],
                         ids=['adam', 'momentum'])
def test_an_all_float_models_optimizer_state_is_unchanged(optimizer):
  """For a model of float parameters only (every shipped model) the optimizer state is
  ``optimizer.init(params)`` on the whole parameter tree, as before, so its checkpoints are."""
  task = models.make_task('mlp', hidden=16, width=8)
  with nnx.use_eager_sharding(False):
    params = nnx.to_pure_dict(nnx.state(task.make_model(nnx.Rngs(0))))
  want = jax.tree.structure(optimizer.init(params))
  mesh = make_mesh((1, 1), devices=require_devices(1))
  trainer = Trainer(task, optimizer, 8, mesh, Strategy.DATA_PARALLEL.rules())
  assert jax.tree.structure(trainer.abstract_state().opt_state) == want
  assert jax.tree.structure(trainer.init_state().opt_state) == want
  assert train.split_trainable(params)[0] == params


def test_the_start_up_line_names_the_fixed_state(tmp_path, capsys):
  """The runner says once which state is held fixed, and why masks repeat; nothing for a
  model of float parameters only."""
  abstract = sharding.abstract_model(lambda rngs: Tiny(rngs=rngs))[1]
  assert train.fixed_state_notice(abstract) == (
      f'model state that is not a float parameter is held fixed: {", ".join(FIXED)} (a stream '
      'stored in the model repeats its dropout masks every step; pass rngs at call time for '
      'masks that change)')
  mlp = sharding.abstract_model(models.make_task('mlp', hidden=16, width=8).make_model)[1]
  assert train.fixed_state_notice(mlp) is None

  require_devices(8)
  config = run.override(run.load_config('tests.foreign.dropout_mlp:get_config'),
                        ['steps=1', 'mesh=4x2', 'mode=spmd', 'compilation_cache=False',
                         'model.args.masks=stream'])
  run.train(config, tmp_path)
  lines = [line for line in capsys.readouterr().out.splitlines() if 'held fixed' in line]
  assert lines == ['model state that is not a float parameter is held fixed: '
                   'dropout/rngs/count, dropout/rngs/key (a stream stored in the model repeats '
                   'its dropout masks every step; pass rngs at call time for masks that change)']
