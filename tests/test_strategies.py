"""Every model under every built-in strategy trains exactly like one device.

The reference is the same Trainer on a 1x1 mesh (no sharding rules). Losses over 5 steps and the
parameters after them must agree to float32 reduction-order noise: the parallel programs sum the
same terms in a different order, nothing more.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from hetjax import ConfigError, ShardingError, models
from hetjax.sharding import LogicalRules, ShardingRules, make_mesh
from hetjax.train import Strategy, Task, Trainer, training_steps
from tests.conftest import require_devices

STEPS = 5
# SGD with momentum, not Adam: Adam divides by sqrt(v) per coordinate, so coordinates whose
# gradient is ~1e-8 turn reduction-order noise into O(learning rate) parameter differences.
OPTIMIZER = optax.sgd(0.05, momentum=0.9)
# Small variants of the shipped models; every split dimension still divides by 8.
MODELS = {
    'mlp': ({}, 64),
    'transformer': ({'d_model': 64, 'heads': 8, 'layers': 2, 'mlp': 128, 'seq_len': 32}, 16),
    'wide_deep': ({'rows': 4096, 'dim': 16, 'hidden': 64, 'hidden2': 32}, 64),
}
LAYOUTS = {
    Strategy.DATA_PARALLEL: (8, 1),
    Strategy.FSDP: (4, 2),
    Strategy.TENSOR_PARALLEL: (1, 8),
    Strategy.HYBRID: (4, 2),
}


def _run(name, strategy, shape):
  kwargs, batch = MODELS[name]
  mesh = make_mesh(shape, devices=require_devices(int(np.prod(shape))))
  task = models.make_task(name, **kwargs)
  trainer = Trainer(task, OPTIMIZER, batch, mesh, strategy.rules(), seed=0)
  losses, state = [], trainer.init_state()
  for info in training_steps(trainer, state, STEPS):
    losses.append(info.metrics['loss'])
    state = info.state
  return np.asarray(jax.device_get(losses)), jax.device_get(state.params)


@functools.cache
def single_device_steps(name):
  """``(losses, params)`` of the plain single-device run of ``MODELS[name]``: the Trainer on a
  1x1 mesh with no sharding rules, its `STEPS` losses and its parameters (on the host) after
  each step. Computed once per test process and shared by the modules that check against it
  (here, tests/test_planner_groups.py, tests/test_planner_plan.py), each of which used to
  compile and run the same single-device program again."""
  kwargs, batch = MODELS[name]
  trainer = Trainer(models.make_task(name, **kwargs), OPTIMIZER, batch,
                    make_mesh((1, 1), devices=require_devices(1)),
                    ShardingRules(LogicalRules(), LogicalRules()), seed=0)
  losses, params = [], []
  for info in training_steps(trainer, trainer.init_state(), STEPS):
    losses.append(float(info.metrics['loss']))
    params.append(jax.device_get(info.state.params))  # before the next step donates them
  return np.asarray(losses), tuple(params)


@pytest.fixture(scope='module')
def reference():
  """`single_device_steps` (module-scoped, so that this module's tests share one test process
  and its single-device runs)."""
  return single_device_steps


@pytest.mark.parametrize('strategy', list(LAYOUTS), ids=lambda s: s.value)
@pytest.mark.parametrize('name', list(MODELS))
def test_strategy_matches_single_device(name, strategy, reference):
  ref_losses, ref_params = reference(name)
  ref_params = ref_params[-1]
  losses, params = _run(name, strategy, LAYOUTS[strategy])
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               params, ref_params)


def test_batch_must_divide_over_the_data_parallel_degree():
  mesh = make_mesh((4, 2), devices=require_devices(8))
  with pytest.raises(ConfigError, match=r'global batch 12 is not divisible by the data-parallel '
                     r'degree 8 \(batch split over mesh axes \(\'data\', \'model\'\)'):
    Trainer(models.make_task('mlp'), optax.sgd(0.1), 12, mesh, Strategy.FSDP.rules())


def test_parameter_that_does_not_divide_is_named():
  mesh = make_mesh((1, 8), devices=require_devices(8))
  with pytest.raises(ShardingError, match=r"^parameter 'down/kernel': dimension 0 \('mlp', size 60\)"):
    Trainer(models.make_task('mlp', hidden=60), optax.sgd(0.1), 64, mesh,
            Strategy.TENSOR_PARALLEL.rules())


def test_unknown_strategy_and_model():
  with pytest.raises(ConfigError, match="unknown strategy 'pipeline'; choose one of: data_para"):
    Strategy.parse('pipeline')
  with pytest.raises(ConfigError, match="unknown model 'resnet'"):
    models.make_task('resnet')
  with pytest.raises(ConfigError, match="model 'mlp' has no argument 'depth'"):
    models.make_task('mlp', depth=3)


D = ('data', 'model')  # both mesh axes, as one split
# What each strategy must do to representative parameters (spec entries per dimension). The
# equivalence test above would also pass if a strategy silently replicated everything.
EXPECTED_SPECS = {
    Strategy.FSDP: {
        # A parameter naming no 'table' or 'embed' dimension is split along its largest
        # dimension that 8 divides ('mlp' biases, the tower's (72, 64) first matrix), and stays
        # replicated when none divides (the 10 classes' bias), which the notice names.
        'mlp': {'up/kernel': (D, None), 'down/kernel': (None, D), 'head/kernel': (D, None),
                'up/bias': (D,), 'head/bias': (None,)},
        'wide_deep': {'embedding/table': (D, None), 'tower/up/kernel': (D, None),
                      'wide/linear/kernel': (D, None), 'tower/head/bias': (None,)},
        'transformer': {'blocks/0/attn/query': (D, None, None),
                        'blocks/0/attn/out': (None, None, D)},
    },
    Strategy.TENSOR_PARALLEL: {
        'mlp': {'up/kernel': (None, D), 'down/kernel': (D, None), 'head/kernel': (None, None)},
        'wide_deep': {'embedding/table': (D, None), 'tower/up/kernel': (None, D)},
        'transformer': {'blocks/0/attn/query': (None, D, None),
                        'blocks/0/attn/out': (D, None, None)},
    },
    Strategy.HYBRID: {
        'mlp': {'up/kernel': (None, 'model'), 'down/kernel': ('model', None),
                'head/kernel': (None, None)},
        'wide_deep': {'embedding/table': ('model', None), 'tower/up/kernel': (None, 'model')},
        'transformer': {'blocks/0/attn/query': (None, 'model', None),
                        'blocks/0/attn/out': ('model', None, None)},
    },
}

# Only parameters with no dimension that the 8 devices divide stay replicated under FSDP.
FSDP_NOTICES = {
    'mlp': 'fsdp: 1 parameter (<0.1% of the weights) left replicated, no dimension divisible by '
           '8 devices: head/bias (10,)',
    'transformer': None,
    'wide_deep': 'fsdp: 2 parameters (<0.1% of the weights) left replicated, no dimension '
                 'divisible by 8 devices: tower/head/bias (1,), wide/linear/bias (1,)',
}


def _param_specs(name, strategy):
  """``({path: spec tuple}, trainer)`` for the parameters of ``name`` under ``strategy``."""
  from flax import traverse_util

  kwargs, batch = MODELS[name]
  shape = LAYOUTS[strategy]
  mesh = make_mesh(shape, devices=require_devices(int(np.prod(shape))))
  trainer = Trainer(models.make_task(name, **kwargs), OPTIMIZER, batch, mesh, strategy.rules())
  flat = traverse_util.flatten_dict(trainer.state_shardings.params)
  return {'/'.join(map(str, k)): tuple(v.spec) for k, v in flat.items()}, trainer


def _padded(spec, ndim):
  return tuple(spec) + (None,) * (ndim - len(spec))


@pytest.mark.parametrize('strategy', list(EXPECTED_SPECS), ids=lambda s: s.value)
@pytest.mark.parametrize('name', list(MODELS))
def test_strategy_shards_the_parameters_it_must(name, strategy):
  specs, trainer = _param_specs(name, strategy)
  for path, expected in EXPECTED_SPECS[strategy][name].items():
    assert _padded(specs[path], len(expected)) == expected, (path, specs[path], expected)
  # The optimizer's momentum of each parameter is laid out like the parameter.
  momentum = [_padded(s.spec, 3) for s in jax.tree.leaves(trainer.state_shardings.opt_state)]
  for expected in EXPECTED_SPECS[strategy][name].values():
    assert _padded(expected, 3) in momentum
  if strategy is Strategy.FSDP:
    from hetjax import bench

    assert bench.fsdp_notice(trainer) == FSDP_NOTICES[name]


@pytest.mark.parametrize('name', list(MODELS))
def test_data_parallel_replicates_every_parameter(name):
  specs, _ = _param_specs(name, Strategy.DATA_PARALLEL)
  assert specs and all(all(e is None for e in spec) for spec in specs.values()), specs


class _Unnamed(nnx.Module):
  """Parameters without logical names: FSDP must still shard what divides."""

  def __init__(self, rngs: nnx.Rngs):
    del rngs
    self.w = nnx.Param(jnp.ones((6, 8)))    # 4 divides dimension 1 only
    self.odd = nnx.Param(jnp.ones((3, 5)))  # 4 divides neither


def test_fsdp_shards_an_unnamed_parameter_and_names_what_it_cannot():
  from hetjax import bench

  mesh = make_mesh((4, 1), devices=require_devices(4))
  task = Task('unnamed', _Unnamed, lambda model, batch: model.w.sum(), models.make_task('mlp').data)
  trainer = Trainer(task, OPTIMIZER, 4, mesh, Strategy.FSDP.rules())
  specs = trainer.state_shardings.params
  assert specs['w'].spec == PartitionSpec(None, D)
  assert specs['odd'].spec == PartitionSpec(None, None)
  assert bench.fsdp_notice(trainer) == (
      'fsdp: 1 parameter (23.8% of the weights) left replicated, no dimension divisible by 4 '
      'devices: odd (3, 5)')
