"""FSDP on a parameter whose named dimension the devices do not divide (issue 44, item 3).

A user's 2-layer MLP on the digits annotates its second matrix ``w2`` ``('mlp', 'embed')`` with
shape (128, 10). On 4 devices FSDP's ``embed`` rule cannot split the 10 classes, so FSDP falls
back to the largest dimension that 4 divides (the 128), as the README promises, says so in the
start-up lines, and trains exactly like one device. A rule the user gave (``parallelism.rules``)
is never set aside: it fails in one line that says how to fix it.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from hetjax import ShardingError, data, run, sharding
from hetjax.sharding import LogicalRules, abstract_model, make_mesh
from hetjax.train import Strategy, Task, Trainer, training_steps
from tests.conftest import require_devices

D = ('data', 'model')
STEPS = 3


class DigitsMLP(nnx.Module):
  """``64 pixels → 128 (relu) → 10 classes``, annotated as the user did."""

  def __init__(self, rngs: nnx.Rngs):
    init = nnx.initializers.lecun_normal()
    self.w1 = nnx.Param(init(rngs.params(), (64, 128)), out_sharding=('embed', 'mlp'))
    self.b1 = nnx.Param(jnp.zeros((128,)), out_sharding=('mlp',))
    self.w2 = nnx.Param(init(rngs.params(), (128, 10)), out_sharding=('mlp', 'embed'))
    self.b2 = nnx.Param(jnp.zeros((10,)), out_sharding=('embed',))

  def __call__(self, x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ self.w1 + self.b1) @ self.w2 + self.b2


def _loss(model: DigitsMLP, batch) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(model(batch['x']), batch['y'])


def digits_task() -> Task:
  """The user's model as a task (``model.name`` ``'<this module>:digits_task'``)."""
  return Task('digits_mlp', DigitsMLP, _loss, data.digits())


def _config(*assignments: str) -> run.Config:
  config = run.Config(
      model=run.ModelConfig(f'{__name__}:digits_task', {}),
      data=run.DataConfig(global_batch=32),
      optimizer=run.OptimizerConfig('momentum', learning_rate=0.05, steps=STEPS),
      logging=run.LoggingConfig(every=1, mfu=False))
  # compilation_cache=False: the test process's JAX config stays as it is.
  return run.override(config, ['compilation_cache=False', *assignments])


def _specs(rules, mesh_shape=(4, 1)):
  mesh = make_mesh(mesh_shape, devices=require_devices(int(np.prod(mesh_shape))))
  _, shapes, names = abstract_model(digits_task().make_model)
  shardings = sharding.param_shardings(shapes, names, mesh, rules.params)
  return {k: tuple(v.spec) for k, v in shardings.items()}, (shapes, names, mesh)


def test_fsdp_falls_back_to_the_largest_divisible_dimension():
  specs, (shapes, names, mesh) = _specs(Strategy.FSDP.rules())
  assert specs == {'w1': (D, None), 'b1': (D,), 'w2': (D, None), 'b2': (None,)}
  assert sharding.fallen_back(shapes, names, mesh, Strategy.FSDP.rules().params) == (
      "w2 (128, 10) along dimension 0 instead of 1 ('embed')",)


@pytest.mark.parametrize('names, shape, expected, relaxed', [
    (('mlp', 'embed'), (128, 10), (D, None), (1,)),       # the user's w2
    (('table', 'embed'), (10, 16), (None, D), (0,)),      # the next rule takes the freed axes
    (('table', 'embed'), (10, 6), (None, None), (0, 1)),  # 4 divides nothing: replicated
    (('embed', None), (8, 10), (D, None), ()),            # divides: nothing set aside
])
def test_a_fallback_table_sets_aside_rules_that_do_not_divide(names, shape, expected, relaxed):
  mesh = make_mesh((2, 2), devices=require_devices(4))
  fsdp = LogicalRules.of({'table': D, 'embed': D}, fallback=D)
  assert fsdp.checked_spec(names, shape, mesh, 'w') == PartitionSpec(*expected)
  assert fsdp.relaxed(names, shape, mesh) == relaxed
  if relaxed:  # without a fallback the table keeps its rules, and fails
    with pytest.raises(ShardingError, match='is not divisible by mesh axes'):
      LogicalRules.of({'table': D, 'embed': D}).checked_spec(names, shape, mesh, 'w')


def test_a_users_rule_that_does_not_divide_fails_naming_the_fix():
  with pytest.raises(ShardingError) as err:
    _specs(Strategy.FSDP.rules({'embed': D}))
  assert str(err.value) == (
      "parameter 'b2': dimension 0 ('embed', size 10) is not divisible by mesh axes ('data', "
      "'model') of total size 4 (parallelism.rules['embed']); replicate it with "
      'parallelism.rules.embed=None')
  with pytest.raises(ShardingError) as err:
    _specs(Strategy.FSDP.rules({'embed': D}), mesh_shape=(2, 2))
  assert "parameter 'b2'" in str(err.value)  # the first parameter in tree order
  mesh = make_mesh((4, 1), devices=require_devices(4))
  with pytest.raises(ShardingError) as err:
    Strategy.FSDP.rules({'embed': D}).params.checked_spec(('mlp', 'embed'), (128, 10), mesh,
                                                          "parameter 'w2'")
  assert str(err.value) == (
      "parameter 'w2': dimension 1 ('embed', size 10) is not divisible by mesh axes ('data', "
      "'model') of total size 4 (parallelism.rules['embed']); replicate it with "
      "parallelism.rules.embed=None, or split dimension 0 ('mlp', size 128), which 4 divides")
  # A strategy without a fallback keeps its rules too, and names the dimension that divides.
  with pytest.raises(ShardingError) as err:
    Strategy.TENSOR_PARALLEL.rules().params.checked_spec(('embed', 'mlp'), (64, 10), mesh, 'w')
  assert str(err.value).endswith("; split dimension 0 ('embed', size 64), which 4 divides")


@pytest.fixture(scope='module')
def one_device():
  """Losses and final parameters of `STEPS` steps on one device, every parameter whole."""
  config = _config()
  trainer = Trainer(digits_task(), run.optimizer_of(config)[0], config.data.global_batch,
                    make_mesh((1, 1), devices=require_devices(1)),
                    Strategy.DATA_PARALLEL.rules(), seed=config.data.seed)
  losses, state = [], trainer.init_state()
  for info in training_steps(trainer, state, STEPS):
    losses.append(float(info.metrics['loss']))
    state = info.state
  return np.asarray(losses), jax.device_get(state.params)


def test_an_fsdp_run_that_fell_back_equals_one_device(tmp_path, capsys, one_device):
  # The run's mesh takes every device of the test process: 8, which no more divides 10.
  require_devices(8)
  workdir = tmp_path / 'run'
  assert run.train(_config('strategy=fsdp', 'mesh=4x2'), workdir)['final_step'] == STEPS
  out = capsys.readouterr().out
  assert ("fsdp: 1 parameter split along another dimension, 8 devices not dividing the named "
          "one: w2 (128, 10) along dimension 0 instead of 1 ('embed')\n"
          "fsdp: 1 parameter (0.1% of the weights) left replicated, no dimension divisible by 8 "
          "devices: b2 (10,)\n") in out
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  # The tolerances of tests/test_strategies.py: float32 reduction order, nothing more.
  np.testing.assert_allclose([r['loss'] for r in rows], one_device[0], rtol=1e-5, atol=0)
  model = run.load_model(workdir)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.device_get(nnx.to_pure_dict(nnx.state(model))), one_device[1])


@pytest.mark.parametrize('mode', ['shares', 'tokens'])
def test_the_fallback_is_announced_and_exact_in_every_mode(tmp_path, capsys, one_device, mode):
  # The placements fall back alike where each worker shards its own copy (modes shares and
  # tokens, one worker here): the same start-up line, the same SGD.
  require_devices(8)
  workdir = tmp_path / mode
  config = _config('strategy=fsdp', 'mesh=4x2', f'mode={mode}')
  assert run.train(config, workdir)['final_step'] == STEPS
  assert ("fsdp: 1 parameter split along another dimension, 8 devices not dividing the named "
          "one: w2 (128, 10) along dimension 0 instead of 1 ('embed')") in capsys.readouterr().out
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  np.testing.assert_allclose([r['loss'] for r in rows], one_device[0], rtol=1e-5, atol=0)
