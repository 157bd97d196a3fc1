"""A model that lists no ``submodels()`` is planned whole, as one part named ``'model'``: the
best of data-parallel, FSDP, tensor-parallel and hybrid layouts and of the worker groups, from
the same profile and cost model as sub-models get; the plan round-trips through JSON and trains
exactly like one device, on all devices (one SPMD step) or on a group of workers (one stage)."""

import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import ConfigError, planner
from hetjax import data as hdata
from hetjax import run as run_lib
from hetjax.pipeline import PipelineTrainer
from hetjax.planner import (
  WHOLE_MODEL,
  AnalyticCost,
  ClusterSpec,
  Cost,
  Plan,
  SubmodelProfile,
  WorkerSpec,
  compile_plan,
  search,
)
from hetjax.planner._cost import fsdp_axes, group_devices, infeasibility
from hetjax.planner._search import candidate_groups, group_layouts
from hetjax.sharding import LogicalRules, ShardingRules, make_mesh, submodel_names
from hetjax.train import Task, Trainer, training_steps

ROOT = pathlib.Path(__file__).resolve().parents[1]

HIDDEN, WIDTH, FEATURES, CLASSES, BATCH, STEPS = 32, 16, 8, 4, 32, 3
PARAMS = (FEATURES * HIDDEN + HIDDEN) + (HIDDEN * WIDTH + WIDTH) + WIDTH + (WIDTH * CLASSES + CLASSES)
#: The run: `make_task` by its import path, and `hetjax.run.train`'s settings.
MODEL = ['model=tests.test_planner_whole_model:make_task', f'model_args.hidden={HIDDEN}',
         f'model_args.width={WIDTH}', f'global_batch={BATCH}']
RUN = [*MODEL, 'optimizer=momentum', 'learning_rate=0.05', f'steps={STEPS}', 'log_every=1',
       'compilation_cache=False', 'logging.mfu=False', 'logging.tensorboard=False']
_INIT = nnx.initializers.lecun_normal()


def _dense(din: int, dout: int, names: tuple[str, str] | None, rngs: nnx.Rngs) -> nnx.Linear:
  kernel = _INIT if names is None else nnx.with_partitioning(_INIT, names)
  return nnx.Linear(din, dout, kernel_init=kernel, rngs=rngs)


class Plain(nnx.Module):
  """An MLP of the user's own, with no ``submodels()``: its kernels name logical axes (the
  Megatron pair: ``up`` splits its columns, ``down`` its rows), ``scale`` and the biases none."""

  def __init__(self, hidden: int, width: int, rngs: nnx.Rngs):
    self.up = _dense(FEATURES, hidden, ('embed', 'mlp'), rngs)
    self.down = _dense(hidden, width, ('mlp', 'embed'), rngs)
    self.scale = nnx.Param(jnp.linspace(0.5, 1.5, width))
    self.head = _dense(width, CLASSES, ('embed', 'classes'), rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(self.down(jax.nn.relu(self.up(x)))) * self.scale
    return self.head(h)


def make_task(hidden: int = HIDDEN, width: int = WIDTH) -> Task:
  """`Plain`'s task, a seeded classification of 512 rows; ``tests.test_planner_whole_model:
  make_task`` for `hetjax.run.train` and the planner's CLI."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((512, FEATURES)).astype(np.float32)
  y = x[:, :CLASSES].argmax(-1).astype(np.int32)

  def loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch['x']), batch['y'])

  return Task('plain', lambda rngs: Plain(hidden, width, rngs), loss,
              hdata.ArraySource({'x': x, 'y': y}), config={'hidden': hidden, 'width': width})


def test_the_whole_model_is_profiled_as_one_part():
  task = make_task()
  [profile] = planner.profile_submodels(task, batch_size=BATCH)
  assert profile.name == WHOLE_MODEL == 'model'
  assert profile.params == PARAMS
  assert profile.split_sizes == {'mlp': HIDDEN} and profile.shard_sizes == {'embed': FEATURES}
  assert profile.output_bytes_per_example == 4  # the per-example loss
  # Tensor parallelism all-reduces `down`'s output (its kernel is row-parallel), not the loss.
  assert profile.tensor_reductions == 1 and profile.tensor_bytes_per_example == 4 * WIDTH
  assert profile.flops_per_example > 2 * (FEATURES * HIDDEN + HIDDEN * WIDTH)
  assert SubmodelProfile.from_json(profile.to_json()) == profile


# -- the search: the best option of one part, as brute force over the same table finds it --------


class RandomCost:
  """A `CostModel` drawing each option's (time, bytes, memory) at random, once: a made-up cost
  table over (layout, group), no devices."""

  def __init__(self, rng):
    self.rng, self.table = rng, {}

  def node(self, profile, layout, batch, cluster, group):
    key = (layout, tuple(group))
    if key not in self.table:
      time, comm, memory = self.rng.uniform((0.1, 0.0, 1.0), (1.0, 10.0, 10.0))
      self.table[key] = Cost(time, comm, memory)
    return self.table[key]

  def edge(self, *args):
    raise AssertionError('one part has no edge')


def _brute_force(profile, cluster, batch, cost, tolerance):
  """The (group, layout) of least time among every option that fits, or with a tolerance the
  fewest bytes among those within it of the least."""
  options = []
  for group in candidate_groups(cluster):
    n = group_devices(cluster, group)
    for layout in group_layouts(cluster, group):
      if infeasibility(profile, layout, n) or (layout.fsdp and not fsdp_axes(profile, layout)):
        continue
      c = cost.node(profile, layout, batch, cluster, group)
      if all(c.memory_bytes <= cluster.workers[w].memory_bytes for w in group):
        options.append((c.time_s, c.comm_bytes, group, layout))
  least = min(t for t, *_ in options)
  if not tolerance:
    return min(options)[2:]
  return min((b, t, g, lay) for t, b, g, lay in options if t <= least * (1 + tolerance))[2:]


@pytest.mark.parametrize('seed', range(6))
def test_the_whole_model_search_is_brute_force_over_its_options(seed):
  rng = np.random.default_rng(seed)
  speeds = rng.choice([1e9, 2e9, 4e9], size=4)
  cluster = ClusterSpec(tuple(WorkerSpec(2, float(s), float(m))
                              for s, m in zip(speeds, rng.uniform(4.0, 10.0, 4), strict=True)),
                        alpha_s=1e-5, beta_bytes_per_s=1e9)
  profile = SubmodelProfile(WHOLE_MODEL, 10**5, 4e5, rng.uniform(1e5, 1e7),
                            activation_bytes_per_example=1e3, split_sizes={'mlp': 64},
                            shard_sizes={'embed': 32}, tensor_bytes_per_example=256.0)
  for cost in (RandomCost(rng), AnalyticCost()):
    if isinstance(cost, AnalyticCost):  # memory in bytes: caps that some layouts exceed
      cluster = ClusterSpec(tuple(WorkerSpec(2, w.flops_per_s, 1.4e6) for w in cluster.workers),
                            alpha_s=1e-5, beta_bytes_per_s=1e9)
    for tolerance in (0.0, 0.5):
      plan = search([profile], cluster, 256, cost, tie_tolerance=tolerance)
      [part] = plan.submodels
      assert (part.group, part.layout) == _brute_force(profile, cluster, 256, cost, tolerance)


# -- the plan: one part, named 'model', that lays out the whole model ---------------------------


def test_a_plan_of_a_model_without_submodels_names_one_part():
  plan = Plan.from_json({'devices': 8, 'submodels': {'*': {'tensor': 2}}}, ())
  assert [s.name for s in plan.submodels] == [WHOLE_MODEL] and plan.whole_model
  rules = plan.rules()  # the top-level tables, for parameters and activations outside any scope
  assert rules.params.spec(('mlp', 'embed')) == jax.sharding.PartitionSpec('p2', None)
  assert rules.compute.spec(('batch', 'mlp')) == jax.sharding.PartitionSpec(('p0', 'p1'), 'p2')
  assert rules.params.in_scope(WHOLE_MODEL).rules == rules.params.rules  # a stage scopes its link
  with pytest.raises(ConfigError, match=r"^plan 'plan': no sub-model named 'up'; the model "
                                        r"lists no submodels\(\), so its one part is 'model'$"):
    Plan.from_json({'devices': 8, 'submodels': {'up': {'tensor': 2}}}, ())


# -- the plan trains: one SPMD step on every device, one stage on a group ---------------------


def _config(*sets: str) -> run_lib.Config:
  return run_lib.override(run_lib.load_config('mlp'), [*RUN, *sets])


def _devices(n: int) -> list[jax.Device]:
  from tests.conftest import require_devices  # here: the CLI imports this module to build tasks

  return require_devices(n)


@pytest.fixture(scope='module')
def one_device() -> list[float]:
  """The losses of the plain step on one device, with the run's optimizer and seed."""
  config = _config()
  trainer = Trainer(make_task(), run_lib.optimizer_of(config)[0], BATCH,
                    make_mesh((1, 1), devices=_devices(1)),
                    ShardingRules(LogicalRules(), LogicalRules()), seed=config.data.seed)
  return [float(info.stats.loss) for info in training_steps(trainer, trainer.init_state(), STEPS)]


def _run_losses(workdir: pathlib.Path, plan: pathlib.Path) -> list[float]:
  """`hetjax.run.train` of the task under ``plan`` (mode plan, as ``train.py --plan``)."""
  _devices(8)
  assert run_lib.train(_config(f'plan={plan}'), workdir)['final_step'] == STEPS
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [r['loss'] for r in rows]


@pytest.mark.parametrize('data, shard', [
    # tp2 × FSDP over 4: 'mlp' split 2 ways, 'embed' 4 ways; one SPMD step on the 8 devices.
    ({'devices': 8, 'submodels': {'*': {'data': 4, 'tensor': 2, 'fsdp': True}}}, (16, 4)),
    # Workers 2 and 3 of four, tp2: one stage on their 4 devices, the others idle.
    ({'devices': 8, 'workers': 4, 'submodels': {'model': {'tensor': 2, 'group': [2, 3]}}},
     (16, 16)),
], ids=['tp2_fsdp_on_8', 'one_stage_on_workers_2_3'])
def test_a_whole_model_plan_lays_out_every_parameter_and_trains_like_one_device(
    data, shard, one_device):
  task, devices = make_task(), _devices(8)
  names = submodel_names(task.make_model)
  plan = Plan.from_json({'name': 'whole', **data}, names)
  assert names == () and plan.whole_model and Plan.from_json(plan.to_json(), names) == plan
  compiled = compile_plan(plan, task, run_lib.optimizer_of(_config())[0], BATCH, devices=devices)
  trainer, state, losses = compiled.trainer, compiled.trainer.init_state(), []
  for info in training_steps(trainer, state, STEPS):
    losses.append(float(info.stats.loss))
    state = info.state
  np.testing.assert_allclose(losses, one_device, rtol=1e-5)
  if plan.grouped:  # a stage of one link, the whole loss, on the group's devices only
    assert isinstance(trainer, PipelineTrainer) and trainer.stage_links == ((WHOLE_MODEL,),)
    params = state.params[0][WHOLE_MODEL]
    assert {d for leaf in jax.tree.leaves(params) for d in leaf.sharding.device_set} == set(
        devices[4:])
  else:
    assert not compiled.stage_memory
    params = state.params
  # The layout reaches every parameter: the named ones split, the unnamed ones replicated.
  kernel = params['down']['kernel']
  assert kernel.sharding.shard_shape(kernel.shape) == shard
  assert params['scale'].sharding.is_fully_replicated
  assert params['down']['bias'].sharding.is_fully_replicated


def test_a_plan_searched_on_8_devices_trains_from_its_json(tmp_path, one_device):
  profiles = planner.profile_submodels(make_task(), batch_size=BATCH)
  cluster = ClusterSpec.uniform(1, 8, 1e10, 4e9, beta_bytes_per_s=1e9)
  plan = search(profiles, cluster, BATCH, micro_batches=1)
  assert [s.name for s in plan.submodels] == [WHOLE_MODEL] and not plan.grouped
  plan.save(tmp_path / 'plan.json')
  np.testing.assert_allclose(_run_losses(tmp_path / 'run', tmp_path / 'plan.json'), one_device,
                             rtol=1e-5)


def test_the_cli_plans_a_heterogeneous_cluster_and_its_plan_trains(tmp_path, one_device):
  out = tmp_path / 'plan.json'
  result = subprocess.run(
      [sys.executable, str(ROOT / 'experiments' / 'plan.py'), '--jax_num_cpu_devices=8',
       '--config=mlp', *[arg for s in MODEL for arg in ('--set', s)], '--worker_devices=2,2,2,2',
       '--slowdown=static:1,1,3,3', '--cost=analytic', f'--json={out}'],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert sum('lists no submodels(), so it is planned whole, as one part' in line
             for line in lines) == 1, result.stdout
  assert any(re.match(rf'model +{PARAMS:,} ', line) for line in lines), result.stdout  # table
  assert any(line.strip().startswith('model: worker') and 'Elsewhere: ' in line
             for line in lines), result.stdout
  [(name, part)] = json.loads(out.read_text())['submodels'].items()
  # On the two fast workers (or one of them): the slow ones would set every step's pace.
  assert name == WHOLE_MODEL and part['group'] and set(part['group']) <= {0, 1}, part
  np.testing.assert_allclose(_run_losses(tmp_path / 'run', out), one_device, rtol=1e-5)
