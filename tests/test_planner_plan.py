"""Plans as data (JSON, validation) and as scoped sharding rules that train exactly like one
device, whatever layout each sub-model gets."""

import json

import jax
import numpy as np
import pytest

from hetjax import ConfigError, configs, models
from hetjax.bench import mesh_factors, tensor_degrees
from hetjax.planner import Layout, Plan
from hetjax.sharding import LogicalRules, submodel_names
from hetjax.train import Trainer, training_steps
from tests.conftest import require_devices
from tests.test_strategies import MODELS, OPTIMIZER, STEPS, single_device_steps


def test_mesh_factors_put_workers_first_and_degrees_are_suffix_products():
  assert mesh_factors(8) == (2, 2, 2)
  assert mesh_factors(12, workers=3) == (3, 2, 2)
  assert tensor_degrees((3, 2, 2)) == (1, 2, 4, 12)
  with pytest.raises(ConfigError, match='cannot be split evenly over 3 workers'):
    mesh_factors(8, workers=3)


def test_layout_rules_split_tensor_axes_last_and_batch_over_the_rest():
  factors = (2, 2, 2)
  layout = Layout(tensor=4, fsdp=True)
  assert layout.split_axes(factors) == (('p0',), ('p1', 'p2'))
  assert layout.name(8) == 'dp2×tp4+fsdp'
  assert Layout(8).name(8) == 'tp8' and Layout(1).name(8) == 'dp8'
  assert layout.compute_rules(factors).spec(('batch', 'mlp')) == jax.sharding.PartitionSpec(
      'p0', ('p1', 'p2'))
  assert layout.params_rules(factors).spec(('embed', 'mlp')) == jax.sharding.PartitionSpec(
      'p0', ('p1', 'p2'))
  with pytest.raises(ConfigError, match='tensor-parallel degree 3'):
    Layout(3).split_axes(factors)


def test_scoped_rules_override_only_inside_their_scope():
  inner = LogicalRules.of({'mlp': 'model'})
  rules = LogicalRules.of({'batch': 'data'})
  rules = LogicalRules(rules.rules, scopes=(('tower', inner),))
  assert rules.in_scope('tower') is inner
  assert rules.in_scope('other') is rules and rules.in_scope(None) is rules


def test_json_round_trip_and_wildcard():
  plan = Plan.from_json({'name': 'h', 'devices': 8,
                         'submodels': {'*': {'data': 2, 'tensor': 4}, 'embedding': {'tensor': 8}}},
                        ['embedding', 'wide', 'tower'])
  assert [s.layout for s in plan.submodels] == [Layout(8), Layout(4), Layout(4)]
  again = Plan.from_json(json.loads(json.dumps(plan.to_json())), ['embedding', 'wide', 'tower'])
  assert again == plan


@pytest.mark.parametrize('data, message', [
    ({'devices': 8, 'submodels': {'*': {'data': 2, 'tensor': 2}}},
     r"sub-model 'up' has data 2 × tensor 2 = 4, not the 8 devices"),
    ({'devices': 8, 'submodels': {'*': {'tensor': 8}, 'tower': {'tensor': 8}}},
     r"no sub-model named 'tower'; the model has up, down, head"),
    ({'devices': 8, 'submodels': {'up': {'tensor': 8}}}, r"sub-model 'down' has no layout"),
    ({'submodels': {}}, r'needs "devices"'),
    ({'devices': 8, 'submodels': {'*': {'tensor': 'two'}}}, r'must be integers'),
    ({'devices': 12, 'workers': 3, 'submodels': {'*': {'data': 2, 'tensor': 6}}},
     r'tensor-parallel degree 6 is not one of \(1, 2, 4, 12\)'),
])
def test_bad_plans_are_one_line_config_errors(data, message):
  with pytest.raises(ConfigError, match=message) as error:
    Plan.from_json(data, ['up', 'down', 'head'])
  assert '\n' not in str(error.value)


def test_shipped_plans_load(tmp_path):
  root = configs.PLANS
  names = {p.stem: Plan.load(p, ['embedding', 'wide', 'tower']) for p in root.glob('*.json')}
  assert set(names) >= {'pure_dp', 'pure_mp', 'hybrid'}
  assert {s.layout.tensor for s in names['pure_mp'].submodels} == {8}
  names['hybrid'].save(tmp_path / 'h.json')
  assert Plan.load(tmp_path / 'h.json', ['embedding', 'wide', 'tower']) == names['hybrid']


def _train(task, rules, mesh, batch):
  trainer = Trainer(task, OPTIMIZER, batch, mesh, rules, seed=0)
  losses, state = [], trainer.init_state()
  for info in training_steps(trainer, state, STEPS):
    losses.append(info.metrics['loss'])
    state = info.state
  return np.asarray(jax.device_get(losses)), jax.device_get(state.params), state


# A different layout per sub-model: the activations are resharded between them.
MIXED = {
    'wide_deep': {'embedding': {'tensor': 8}, 'wide': {'tensor': 2, 'fsdp': True},
                  'tower': {'tensor': 4}},
    'mlp': {'up': {'tensor': 1}, 'down': {'tensor': 8}, 'head': {'tensor': 2, 'fsdp': True}},
    'transformer': {'embed': {'tensor': 1, 'fsdp': True}, 'block_0': {'tensor': 8},
                    'block_1': {'tensor': 2}, 'head': {'tensor': 4}},
}


@pytest.mark.parametrize('name', sorted(MIXED))
def test_a_mixed_plan_trains_exactly_like_one_device(name):
  kwargs, batch = MODELS[name]
  task = models.make_task(name, **kwargs)
  order = submodel_names(task.make_model)
  plan = Plan.from_json({'name': 'mixed', 'devices': 8, 'submodels': MIXED[name]}, order)
  # The plain single-device run (the Trainer on a 1x1 mesh, no rules), shared per process.
  ref_losses, ref_params = single_device_steps(name)
  ref_params = ref_params[-1]
  losses, params, state = _train(task, plan.rules(), plan.mesh(require_devices(8)), batch)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  # The layouts really differ per sub-model: a tensor-parallel weight is split 8 ways.
  specs = {str(leaf.sharding.spec) for leaf in jax.tree.leaves(state.params)}
  assert len(specs) > 2


def test_compile_plan_checks_memory_before_training():
  from hetjax.planner import compile_plan

  kwargs, batch = MODELS['wide_deep']
  task = models.make_task('wide_deep', **kwargs)
  plan = Plan.load(configs.PLANS / 'hybrid.json', submodel_names(task.make_model))
  compiled = compile_plan(plan, task, OPTIMIZER, batch, devices=require_devices(8))
  assert compiled.memory_bytes > 0 and compiled.trainer.mesh.devices.size == 8
  with pytest.raises(ConfigError, match=r"plan 'hybrid' does not fit: its compiled step needs"):
    compile_plan(plan, task, OPTIMIZER, batch, memory_cap=compiled.memory_bytes - 1,
                 devices=require_devices(8))


def test_subset_groups_round_trip_and_train_as_stages():
  from hetjax.pipeline import PipelineTrainer
  from hetjax.planner import compile_plan

  data = {'name': 'g', 'devices': 8, 'workers': 2,
          'submodels': {'*': {'tensor': 1}, 'tower': {'tensor': 2, 'group': [1]}}}
  plan = Plan.from_json(data, ['embedding', 'wide', 'tower'])
  assert plan.group_devices(plan.submodels[2]) == 4
  assert Plan.from_json(plan.to_json(), ['embedding', 'wide', 'tower']) == plan
  with pytest.raises(ConfigError, match=r'not distinct workers among 2'):
    Plan.from_json({**data, 'submodels': {'*': {'tensor': 1, 'group': [2]}}},
                   ['embedding', 'wide', 'tower'])
  kwargs, batch = MODELS['wide_deep']
  compiled = compile_plan(plan, models.make_task('wide_deep', **kwargs), OPTIMIZER, batch,
                          devices=require_devices(8))
  assert isinstance(compiled.trainer, PipelineTrainer) and compiled.trainer.stages == 2


def test_a_grouped_plan_needs_a_model_with_a_chain():
  from flax import nnx

  from hetjax.planner import compile_plan
  from hetjax.train import Task

  class TwoParts(nnx.Module):  # names its sub-models but is no chain
    def __init__(self, rngs):
      self.a, self.b = nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, x):
      return self.b(self.a(x))[:, 0]

    def submodels(self):
      return {'a': self.a, 'b': self.b}

  task = Task('two', TwoParts, lambda m, b: (m(b['x']) - b['y']) ** 2,
              models.make_task('mlp').data)
  plan = Plan.from_json({'name': 'g', 'devices': 8, 'workers': 2,
                         'submodels': {'a': {'tensor': 1}, 'b': {'tensor': 1, 'group': [0]}}},
                        ['a', 'b'])
  with pytest.raises(ConfigError, match=r"model 'two' has no chain\(\)"):
    compile_plan(plan, task, OPTIMIZER, 8, devices=require_devices(8))
