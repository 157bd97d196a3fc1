"""PipelineTrainer: GPipe and 1F1B on 8 virtual CPU devices compute the unpipelined gradients.

The reference is `jax.value_and_grad` of the plain model's mean loss over the whole global batch
on one device. Every case compares the loss and every parameter's gradient, for both schedules on
the same compiled programs, over 2 and 4 stages, 1, 2 and 4 micro-batches and 1 or 2 devices per
stage. XLA:CPU compiles dominate the runtime (a model's initialiser alone takes seconds), so
trainers are built once per case and shared, and the cases are the fewest that reach every path.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import ConfigError, models
from hetjax.bench import dispatch_order
from hetjax.pipeline import (
  HasChain,
  Link,
  PipelineTrainer,
  gpipe,
  one_f_one_b,
  split_stages,
)
from hetjax.planner import profile_split
from hetjax.train import Task
from tests.conftest import require_devices

SMALL = {'d_model': 32, 'heads': 4, 'layers': 2, 'mlp': 64, 'seq_len': 16}
BATCH = 16
LR = 0.1
# (stages, devices per stage, micro-batches); both schedules run in each case. The executor's
# paths: stage 0, a middle stage (4 stages) and the last one; one device per stage or several
# (data-parallel inside); several micro-batches accumulating and in flight at once, more than
# the stages (1F1B's steady state) and fewer. (2, 2, 2) also serves the SGD test; one micro-batch
# (both schedules are then one order) is the profile-split case's; a middle stage with several
# micro-batches is also the MLP's.
CASES = [(2, 2, 2), (2, 1, 4), (4, 2, 2)]


@pytest.fixture(scope='module')
def task():
  return models.make_task('transformer', **SMALL)


def _plain(task: Task):
  """``(params, jitted value_and_grad of the mean loss)`` of the unpipelined model."""
  with nnx.use_eager_sharding(False):
    graphdef, state = nnx.split(nnx.jit(lambda: task.make_model(nnx.Rngs(0)))())

  def mean_loss(params, batch):
    return jnp.mean(task.loss(nnx.merge(graphdef, params), batch))

  return nnx.to_pure_dict(state), jax.jit(jax.value_and_grad(mean_loss))


@pytest.fixture(scope='module')
def reference(task):
  params, value_and_grad = _plain(task)
  loss, grads = value_and_grad(params, task.data.global_batch(0, 0, BATCH))
  return params, value_and_grad, loss, grads


@pytest.fixture(scope='module')
def trainers(task):
  """Builds each (stages, devices per stage, micro-batches) trainer once for the module."""
  cache = {}

  def get(stages: int, per: int, micro: int) -> PipelineTrainer:
    if (stages, per, micro) not in cache:
      cache[stages, per, micro] = PipelineTrainer(
          task, optax.sgd(LR), BATCH, stages, micro, devices=require_devices(stages * per))
    return cache[stages, per, micro]

  return get


def _assert_close(actual, expected, diffs: list[float] | None = None):
  def one(a, e):
    a, e = np.asarray(a), np.asarray(e)
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    if diffs is not None:
      diffs.append(float(np.max(np.abs(a - e))))
  jax.tree.map(one, actual, expected)


def _devices(tree) -> set:
  return set().union(*(leaf.sharding.device_set for leaf in jax.tree.leaves(tree)))


def test_transformer_is_a_chain(task):
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(0)))
  assert isinstance(model, HasChain)
  assert [link.name for link in model.chain()] == list(model.submodels())


@pytest.mark.parametrize(('stages', 'per', 'micro'), CASES)
def test_gradients_equal_unpipelined(task, reference, trainers, stages, per, micro):
  params, _, ref_loss, ref_grads = reference
  trainer = trainers(stages, per, micro)
  state = trainer.init_state(params)
  host = task.data.global_batch(0, 0, BATCH)
  devices = require_devices(stages * per)
  for s in range(stages):
    assert _devices(state.params[s]) == set(devices[s * per:(s + 1) * per])
  diffs: list[float] = []
  for schedule in (gpipe(stages, micro), one_f_one_b(stages, micro)):
    grads, loss = trainer.gradients(state, host, schedule)
    for s in range(stages):
      assert _devices(grads[s]) == set(devices[s * per:(s + 1) * per])
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    _assert_close(trainer.merge_tree(grads), ref_grads, diffs)
  print(f'{stages} stages x {per} devices, {micro} micro-batches: max |diff| {max(diffs):.2e}')


@pytest.fixture(scope='module')
def mlp():
  """``(task, params, value_and_grad, 3-stage trainer with 2 micro-batches of 4)`` of a small
  MLP, whose initialiser compiles in a fraction of the transformer's."""
  task = models.make_task('mlp', hidden=16, width=8)
  params, value_and_grad = _plain(task)
  trainer = PipelineTrainer(task, optax.sgd(LR), 8, stages=3, micro_batches=2,
                            devices=require_devices(3))
  return task, params, value_and_grad, trainer


def test_default_init_equals_unpipelined(mlp):
  """Seeded init equals the plain model's (for the transformer across processes too: each
  process initialises its own stages, tests/test_pipeline_multiprocess.py)."""
  _, params, _, trainer = mlp
  state = trainer.init_state()
  jax.tree.map(np.testing.assert_array_equal, trainer.merge_tree(state.params), params)


def test_two_sgd_steps_equal_unpipelined(task, reference, trainers):
  params, value_and_grad, _, _ = reference
  sgd = optax.sgd(LR)
  plain_update = jax.jit(lambda p, g: optax.apply_updates(p, sgd.update(g, sgd.init(p), p)[0]))
  trainer = trainers(2, 2, 2)
  state = trainer.init_state(params)
  plain = params
  for step in range(2):
    host = task.data.global_batch(0, step, BATCH)
    plain_loss, grads = value_and_grad(plain, host)
    plain = plain_update(plain, grads)
    state, loss = trainer.train_step(state, trainer.global_batch_at(step))
    np.testing.assert_allclose(float(loss), float(plain_loss), rtol=1e-6)
  assert state.step == 2
  _assert_close(trainer.merge_tree(state.params), plain)


def test_mlp_chain_gradients_equal_unpipelined(mlp):
  task, params, value_and_grad, trainer = mlp
  host = task.data.global_batch(0, 0, 8)
  ref_loss, ref_grads = value_and_grad(params, host)
  grads, loss = trainer.gradients(trainer.init_state(params), host)
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  _assert_close(trainer.merge_tree(grads), ref_grads)


def test_profile_split_uses_the_planners_costs_and_trains_exactly(task, reference, monkeypatch):
  from hetjax.planner import _profile_split

  profiles = []  # what the planner measured for profile_split (profiling takes seconds)

  def profile_submodels(*args, **kwargs):
    profiles.append(real(*args, **kwargs))
    return profiles[-1]

  real = _profile_split.profile_submodels
  monkeypatch.setattr(_profile_split, 'profile_submodels', profile_submodels)
  ranges = profile_split(task, 2)
  assert len(profiles) == 1
  flops = [p.flops_per_example for p in profiles[0]]
  assert ranges == split_stages(flops, 2)
  # The embedding and head cost unlike a block, so the split need not be 2 + 2 links.
  assert ranges[0][0] == 0 and ranges[-1][1] == len(flops)
  params, _, ref_loss, ref_grads = reference
  trainer = PipelineTrainer(task, optax.sgd(LR), BATCH, stages=ranges,  # one micro-batch
                            devices=require_devices(2))
  assert trainer.ranges == ranges and trainer.micro_batches == 1
  grads, loss = trainer.gradients(trainer.init_state(params), task.data.global_batch(0, 0, BATCH))
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  _assert_close(trainer.merge_tree(grads), ref_grads)


def test_profile_split_needs_links_that_are_sub_models():
  from hetjax.models.mlp import MLP

  class Renamed(MLP):
    def chain(self):
      return tuple(dataclasses.replace(link, name=f'x_{link.name}') for link in super().chain())

  base = models.make_task('mlp', hidden=16, width=8)
  features = base.data.arrays['x'].shape[1]
  task = dataclasses.replace(base, make_model=lambda rngs: Renamed(features, 16, 8, 10,
                                                                    rngs=rngs))
  with pytest.raises(ConfigError, match=r"links \['x_up'"):
    profile_split(task, 2)


@pytest.mark.parametrize('build', [gpipe, one_f_one_b])
def test_dispatch_order_respects_dependencies_and_stage_order(build):
  schedule = build(3, 4)
  order = dispatch_order(schedule)
  seen = set()
  for action in order:
    assert set(action.needs(3)) <= seen
    seen.add(action)
  for s in range(3):
    assert tuple(a for a in order if a.stage == s) == schedule.per_stage[s]


# --- errors ------------------------------------------------------------------------------------


class _Unchained(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.first = nnx.Linear(2, 2, rngs=rngs)
    self.second = nnx.Linear(2, 2, rngs=rngs)

  def __call__(self, x):
    return self.second(self.first(x))


class _Partial(_Unchained):
  """Its chain leaves out ``second``: not every parameter has a stage."""

  def chain(self):
    return (Link('first', self.first, lambda m, _, b: m(b['x'])),)

  def chain_loss(self, carry, batch):
    return jnp.sum(carry, axis=-1)


def _toy_task(model_cls) -> Task:
  return Task('toy', lambda rngs: model_cls(rngs=rngs), lambda m, b: jnp.sum(m(b['x']), -1),
              data=None)


@pytest.mark.parametrize(('kwargs', 'match'), [
    ({'stages': 3}, r'8 devices do not split evenly over 3 stages'),
    ({'stages': 2, 'micro_batches': 8}, r'micro-batch of 2 rows does not divide over the 4 devices'),
    ({'stages': 2, 'micro_batches': 3}, r'global batch 16 does not divide into 3 micro-batches'),
    ({'stages': 5}, r'cannot split 4 sub-models into 5 stages'),
    ({'stages': [(0, 1), (2, 4)]}, r'not contiguous'),
    ({'stages': [(0, 1), (1, 3)]}, r'do not cover the 4 links'),
    ({'schedule': 'zigzag'}, r"unknown schedule 'zigzag'"),
    ({'schedule': gpipe(2, 4)}, r'is for 2 stages and 4 micro-batches, not 2 and 1'),
])
def test_config_errors(task, kwargs, match):
  with pytest.raises(ConfigError, match=match):
    PipelineTrainer(task, optax.sgd(LR), BATCH, devices=require_devices(8), **kwargs)


def test_wrong_batch_rows(task, reference, trainers):
  trainer = trainers(2, 1, 1)
  with pytest.raises(ConfigError, match=r'batch has \[8\] rows, the pipeline takes global batch 16'):
    trainer.gradients(trainer.init_state(reference[0]), task.data.global_batch(0, 0, 8))


@pytest.mark.parametrize(('model_cls', 'match'), [
    (_Unchained, r'_Unchained has no chain\(\) and chain_loss\(\), so it cannot be pipelined'),
    (_Partial, r'does not partition the parameters: parameter second/bias is in no link'),
])
def test_models_without_a_proper_chain(model_cls, match):
  with pytest.raises(ConfigError, match=match):
    PipelineTrainer(_toy_task(model_cls), optax.sgd(LR), 4, stages=1, devices=require_devices(1))
