"""Plans whose sub-models sit on different device groups train exactly like one device.

A grouped plan trains as pipeline stages (`hetjax.planner.plan_stages`): one per run of
consecutive sub-models on one group of workers, each on its group's mesh with the plan's layout
per sub-model, activations moved between groups by rows. On one process the plan's workers are
slices of the 8 virtual devices, so groups of every kind — subsets, disjoint groups of different
sizes and degrees, groups sharing devices, workers of different device counts — are checked
against the single-device step here; `tests/test_planner_groups_multiprocess.py` does it across
launched workers.
"""

import jax
import numpy as np
import pytest

from hetjax import ConfigError, models
from hetjax.bench import group_factors
from hetjax.pipeline import PipelineTrainer
from hetjax.pipeline._transfer import piece_plan
from hetjax.planner import Plan, compile_plan, plan_stages
from hetjax.sharding import LogicalRules, ShardingRules, make_mesh, submodel_names
from hetjax.train import Trainer, training_steps
from tests.conftest import require_devices
from tests.test_strategies import MODELS, OPTIMIZER, single_device_steps
from tests.test_strategies import STEPS as STRATEGY_STEPS

STEPS = 3

# name → (model, plan JSON). Workers are consecutive device slices of the 8 devices.
CASES = {
    # 2 groups, unequal degrees: table and wide row-sharded over all 8, the tower on 4 (tp2).
    'wide_deep_2_groups': ('wide_deep', {
        'devices': 8, 'workers': 4,
        'submodels': {'embedding': {'tensor': 8}, 'wide': {'tensor': 8},
                      'tower': {'tensor': 2, 'group': [0, 1]}}}),
    # 3 groups of 8, 4 and 2 devices, each with another degree.
    'mlp_3_groups': ('mlp', {
        'devices': 8, 'workers': 4,
        'submodels': {'up': {'tensor': 1}, 'down': {'tensor': 4, 'group': [2, 3]},
                      'head': {'tensor': 1, 'group': [0]}}}),
    # 3 groups of equal size and degree, the first and last on the same devices.
    'mlp_equal_groups': ('mlp', {
        'devices': 8, 'workers': 2,
        'submodels': {'up': {'tensor': 2, 'group': [0]}, 'down': {'tensor': 2, 'group': [1]},
                      'head': {'tensor': 2, 'group': [0]}}}),
    # FSDP on all, two blocks tensor-parallel on one half, the head on the other half.
    'transformer_3_groups': ('transformer', {
        'devices': 8, 'workers': 2,
        'submodels': {'embed': {'tensor': 1, 'fsdp': True},
                      'block_0': {'tensor': 4, 'group': [0]}, 'block_1': {'tensor': 2, 'group': [0]},
                      'head': {'tensor': 2, 'group': [1]}}}),
    # Workers of 4, 2, 1 and 1 devices: the table over all 8, the wide part on the 4-device
    # worker, the tower on the other three (2 + 1 + 1 devices, tp2).
    'wide_deep_unequal_workers': ('wide_deep', {
        'devices': 8, 'workers': 4, 'worker_devices': [4, 2, 1, 1],
        'submodels': {'embedding': {'tensor': 8}, 'wide': {'tensor': 1, 'group': [0]},
                      'tower': {'tensor': 2, 'group': [1, 2, 3]}}}),
}


def _reference(name, spec=None, steps=STEPS):
  """``(task, batch, losses, params after steps)`` of the plain single-device step; ``spec`` is
  ``(make_task kwargs, global batch)`` (default: `MODELS`'s, whose run
  `tests.test_strategies.single_device_steps` holds once per test process)."""
  if spec is None and steps <= STRATEGY_STEPS:
    kwargs, batch = MODELS[name]
    losses, params = single_device_steps(name)
    return models.make_task(name, **kwargs), batch, losses[:steps], params[steps - 1]
  kwargs, batch = MODELS[name] if spec is None else spec
  task = models.make_task(name, **kwargs)
  trainer = Trainer(task, OPTIMIZER, batch, make_mesh((1, 1), devices=require_devices(1)),
                    ShardingRules(LogicalRules(), LogicalRules()), seed=0)
  losses, state = [], trainer.init_state()
  for info in training_steps(trainer, state, steps):
    losses.append(float(info.stats.loss))
    state = info.state
  return task, batch, np.asarray(losses), jax.device_get(state.params)


@pytest.fixture(scope='module')
def references():
  cache = {}

  def get(name):
    if name not in cache:
      cache[name] = _reference(name)
    return cache[name]
  return get


@pytest.fixture(scope='module')
def compiled_plans():
  """``case -> (task, batch, plan, compile_plan's result)``, each case compiled once for the
  module (with 2 micro-batches)."""
  cache = {}

  def get(case):
    if case not in cache:
      name, data = CASES[case]
      kwargs, batch = MODELS[name]
      task = models.make_task(name, **kwargs)
      plan = Plan.from_json({'name': case, **data}, submodel_names(task.make_model))
      cache[case] = task, batch, plan, compile_plan(plan, task, OPTIMIZER, batch,
                                                    devices=require_devices(8), micro_batches=2)
    return cache[case]
  return get


@pytest.mark.parametrize('case', sorted(CASES))
def test_grouped_plan_trains_exactly_like_one_device(case, references, compiled_plans):
  name, _ = CASES[case]
  _, _, ref_losses, ref_params = references(name)
  _, _, plan, compiled = compiled_plans(case)
  assert plan.grouped
  trainer = compiled.trainer
  assert isinstance(trainer, PipelineTrainer)
  groups = [tuple(plan.members(s)) for s in plan.submodels]
  assert trainer.stages == sum(1 for i, g in enumerate(groups) if i == 0 or g != groups[i - 1])
  state, losses = trainer.init_state(), []
  for info in training_steps(trainer, state, STEPS):
    losses.append(float(info.stats.loss))
    state = info.state
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  got = jax.device_get(trainer.merge_tree(state.params))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # Each stage's parameters live on its group's devices only, laid out as the plan says.
  devices = require_devices(8)
  edges = np.cumsum((0, *plan.counts))
  for s, links in enumerate(trainer.stage_links):
    sub = plan.submodels[trainer.ranges[s][0]]
    want = {d for w in plan.members(sub) for d in devices[edges[w]:edges[w + 1]]}
    for leaf in jax.tree.leaves(state.params[s]):
      assert leaf.sharding.device_set == want, (links, leaf.sharding)
  assert compiled.memory_bytes > 0 and len(compiled.stage_memory) == trainer.stages


def test_stage_parameters_follow_each_sub_models_layout():
  task = models.make_task('mlp', **MODELS['mlp'][0])
  plan = Plan.from_json({'name': 'g', **CASES['mlp_3_groups'][1]}, ['up', 'down', 'head'])
  trainer = PipelineTrainer(task, OPTIMIZER, 64, plan_stages(plan, ['up', 'down', 'head'],
                                                              require_devices(8)))
  state = trainer.init_state()
  up, down, head = state.params
  assert up['up']['kernel'].sharding.is_fully_replicated  # dp8: replicated
  down_kernel = down['down']['kernel']  # ('mlp', 'embed') split 4 ways over the group's mesh
  assert down_kernel.sharding.shard_shape(down_kernel.shape) == (down_kernel.shape[0] // 4,
                                                                 down_kernel.shape[1])
  assert len(head['head']['kernel'].sharding.device_set) == 2


def test_memory_is_checked_per_stage_and_names_the_group(compiled_plans):
  task, batch, plan, compiled = compiled_plans('wide_deep_2_groups')  # fits with no cap
  with pytest.raises(ConfigError, match=r"plan 'wide_deep_2_groups' does not fit: stage \d "
                                        r'\(.*on workers \[.*\]\) needs [\d,]+ bytes') as error:
    compile_plan(plan, task, OPTIMIZER, batch, memory_cap=compiled.memory_bytes - 1,
                 devices=require_devices(8), micro_batches=2)
  assert '\n' not in str(error.value)


def test_a_grouped_plan_needs_a_chain_in_order():
  data = CASES['mlp_3_groups'][1]
  plan = Plan.from_json({'name': 'g', **data}, ['up', 'down', 'head'])
  with pytest.raises(ConfigError, match=r'need the model\'s chain links in order'):
    plan_stages(plan, ['down', 'up', 'head'], require_devices(8))
  with pytest.raises(ConfigError, match=r'is for 8 devices, 4 are available'):
    plan_stages(plan, ['up', 'down', 'head'], require_devices(4))


def test_group_factors_put_equal_workers_first():
  assert group_factors((2, 2)) == (2, 2)
  assert group_factors((4, 4)) == (2, 2, 2)
  assert group_factors((2, 1, 1)) == (2, 2)
  assert group_factors((3,)) == (3,)
  assert group_factors((4, 2)) == (3, 2)
  with pytest.raises(ConfigError, match='at least one device'):
    group_factors((2, 0))


@pytest.mark.parametrize('data, message', [
    ({'devices': 8, 'workers': 3, 'submodels': {'*': {'tensor': 1}}},
     'cannot be split evenly over 3 workers'),
    ({'devices': 8, 'workers': 3, 'worker_devices': [4, 2, 1],
      'submodels': {'*': {'tensor': 1}}}, r'worker_devices \[4, 2, 1\] must be 3 positive'),
    ({'devices': 8, 'workers': 3, 'worker_devices': [4, 2, 2],
      'submodels': {'*': {'tensor': 1, 'group': [1, 2]}}},
     None),
])
def test_unequal_worker_devices(data, message):
  if message is None:
    plan = Plan.from_json({'name': 'u', **data}, ['up', 'down', 'head'])
    assert plan.counts == (4, 2, 2) and plan.group_devices(plan.submodels[0]) == 4
    assert Plan.from_json(plan.to_json(), ['up', 'down', 'head']) == plan
    return
  with pytest.raises(ConfigError, match=message):
    Plan.from_json({'name': 'u', **data}, ['up', 'down', 'head'])


def test_piece_plan_cuts_rows_between_groups_of_any_size():
  devices = require_devices(8)
  mesh = lambda ds: make_mesh((len(ds),), ('r',), ds)  # noqa: E731
  rows = lambda ds: jax.sharding.NamedSharding(mesh(ds), jax.sharding.PartitionSpec('r'))  # noqa: E731
  two_to_four = piece_plan((8, 3), rows(devices[:2]), rows(devices[4:8]))
  assert [(p.src, p.dst, p.start, p.offset, p.rows) for p in two_to_four] == [
      (devices[0], devices[4], 0, 0, 2), (devices[0], devices[5], 2, 0, 2),
      (devices[1], devices[6], 0, 0, 2), (devices[1], devices[7], 2, 0, 2)]
  four_to_two = piece_plan((8,), rows(devices[4:8]), rows(devices[:2]))
  assert [(p.dst, p.offset, p.rows) for p in four_to_two] == [
      (devices[0], 0, 2), (devices[0], 2, 2), (devices[1], 0, 2), (devices[1], 2, 2)]
  # A replicated source sends each row range once, from its first holder.
  replicated = jax.sharding.NamedSharding(mesh(devices[:2]), jax.sharding.PartitionSpec())
  assert {p.src for p in piece_plan((4,), replicated, rows(devices[2:4]))} == {devices[0]}
