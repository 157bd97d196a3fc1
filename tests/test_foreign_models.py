"""Models written the way other projects write them (tests/foreign/: an NNX transformer on
`nnx.MultiHeadAttention` with two logical names on rank-3 kernels, a dropout classifier, a Linen
module through `flax.nnx.bridge`, a model with unannotated and bias-free parameters) train in
hetjax like its own: under every strategy on a 4x2 mesh, on four launched workers under LB-BSP
and under tokens, each equal to one device; and `hetjax.run.load_model` gives back the
parameters a run trained.

One device is the plain step (`hetjax.train.Trainer` on a 1x1 mesh, parameters replicated),
built here from the same config (`hetjax.run.make_task`, `hetjax.run.optimizer_of`).
"""

import json
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hetjax import run
from hetjax.sharding import LogicalRules, ShardingRules, make_mesh
from hetjax.train import Trainer, training_steps
from tests.conftest import require_devices
from tests.foreign import NAMES

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 4
STRATEGIES = ('data_parallel', 'fsdp', 'tensor_parallel', 'hybrid')
#: The launched job: LB-BSP's shares and Fela's tokens on 4 workers of 1 device, worker 3 three
#: times slower. 20 ms a row on the emulated hosts (a uniform share of 4 rows: 80 ms, against
#: these models' few milliseconds of compute), so the padded times, not the machine's noise,
#: are what LB-BSP sees. LB-BSP runs 12 steps: its first move waits until every worker has
#: compiled the micro-batch program it needs in the background (`hetjax.balance.LBBSP`'s ready
#: rule), which four workers compiling at once take several steps to do, more on a loaded
#: machine (6 steps failed 3 of 4 models in a suite run beside another test process).
LAUNCHED = {'lbbsp': (12, ['mode=shares', 'policy=lbbsp']),
            'tokens': (STEPS, ['mode=tokens', 'token_rows=2'])}
SLOWDOWN = 'static:1,1,1,3'
HOST = ['mesh=1x1', 'host_row_s=0.02']
LAUNCH_TIMEOUT = 240
#: Steps of the one-device reference: the longest run's (the learning rate is constant, so a
#: run's steps do not change its first ones).
REFERENCE_STEPS = max(STEPS, *(steps for steps, _ in LAUNCHED.values()))


def _config(name: str, overrides=()) -> run.Config:
  return run.override(run.load_config(f'tests.foreign.{name}:get_config'),
                      [f'steps={STEPS}', *overrides])


def _losses(workdir: pathlib.Path) -> list[float]:
  return [json.loads(line)['loss'] for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def _host(tree):
  """``tree`` on the host, a PRNG key (a dropout stream's) as its key data."""
  return jax.device_get(jax.tree.map(
      lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x,
      tree))


def _assert_same_params(model: nnx.Module, params) -> None:
  """``model``'s state is ``params`` (`_host` of a pure dict) to float32 reduction order, the
  tolerance tests/test_planner_groups.py compares parameters with."""
  got = jax.tree_util.tree_flatten_with_path(_host(nnx.to_pure_dict(nnx.state(model))))[0]
  want = jax.tree_util.tree_flatten_with_path(params)[0]
  assert [jax.tree_util.keystr(p) for p, _ in got] == [jax.tree_util.keystr(p) for p, _ in want]
  for (path, a), (_, b) in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope='module')
def one_device():
  """``(name, *overrides) -> (losses, params after each step)`` of `REFERENCE_STEPS` steps: the
  plain step on one device, once per model for the module."""
  cache = {}

  def get(name, *overrides):
    if (name, overrides) not in cache:
      config = _config(name, overrides)
      mesh = make_mesh((1, 1), devices=require_devices(1))
      trainer = Trainer(run.make_task(config), run.optimizer_of(config)[0],
                        config.data.global_batch, mesh,
                        ShardingRules(LogicalRules(), LogicalRules()), config.data.seed)
      losses, params = [], []
      for info in training_steps(trainer, trainer.init_state(), REFERENCE_STEPS):
        losses.append(float(info.stats.loss))
        params.append(_host(info.state.params))  # before the next step donates it
      cache[name, overrides] = losses, params
    return cache[name, overrides]
  return get


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """``(name, strategy, *overrides) -> run directory``: `hetjax.run.train` on the 4x2 mesh of
  this process's 8 devices, once per case for the module."""
  cache = {}

  def get(name, strategy, *overrides):
    if (name, strategy, overrides) not in cache:
      require_devices(8)
      workdir = tmp_path_factory.mktemp(name) / strategy
      config = _config(name, [f'strategy={strategy}', 'mesh=4x2', 'mode=spmd',
                              'compilation_cache=False', *overrides])  # this process's JAX
      assert run.train(config, workdir)['final_step'] == STEPS
      cache[name, strategy, overrides] = workdir
    return cache[name, strategy, overrides]
  return get


@pytest.mark.parametrize('strategy', STRATEGIES)
@pytest.mark.parametrize('name', NAMES)
def test_every_strategy_equals_one_device(trained, one_device, name, strategy):
  np.testing.assert_allclose(_losses(trained(name, strategy)), one_device(name)[0][:STEPS],
                             rtol=1e-5)


def test_parallelism_rules_map_a_name_no_strategy_maps(trained, one_device):
  """``'kv'``, the head dimension the transformer's attention biases and output kernel name, is
  a name no strategy maps (replicated); ``parallelism.rules`` maps it over ``'model'`` beside
  FSDP's table, and the run is still one device's."""
  workdir = trained('nnx_transformer', 'fsdp', 'parallelism.rules.kv=model')
  rules = json.loads((workdir / 'run.json').read_text())['rules']['params']
  assert ['kv', ['model']] in rules
  np.testing.assert_allclose(_losses(workdir), one_device('nnx_transformer')[0][:STEPS],
                             rtol=1e-5)


@pytest.mark.parametrize('masks', ['stream', 'off'])
def test_dropout_from_the_models_own_stream_over_a_mesh_equals_one_device(
    trained, one_device, masks):
  """The Flax default: `nnx.Dropout`'s masks from the model's own `nnx.Rngs` stream (in its
  state beside the parameters). One mask is drawn for the whole batch, and JAX's partitionable
  threefry draws the same bits however the mesh splits it, so a run over one mesh equals one
  device with dropout on; ``'off'`` (``set_attributes(deterministic=True)``) too. Workers that
  compute their own shares draw masks of their own shapes instead
  (`test_dropout_stream_trains_on_launched_workers`)."""
  args = (f'model.args.masks={masks}',)
  losses = _losses(trained('dropout_mlp', 'hybrid', *args))
  np.testing.assert_allclose(losses, one_device('dropout_mlp', *args)[0][:STEPS], rtol=1e-5)


@pytest.mark.parametrize('name', NAMES)
def test_load_model_gives_the_trained_parameters(trained, one_device, name):
  """A hybrid run's directory read back by `hetjax.run.load_model`: one device's parameters
  after the same steps (to float32 reduction order, the tolerance tests/test_planner_groups.py
  uses), in the user's own model class, ready to call."""
  model = run.load_model(trained(name, 'hybrid'))
  _assert_same_params(model, one_device(name)[1][STEPS - 1])
  task = run.make_task(_config(name))
  batch = task.data.global_batch(0, STEPS, 16)
  assert math.isfinite(float(jnp.mean(nnx.jit(task.loss)(model, batch))))


def _runs(tmp: pathlib.Path) -> dict[tuple[str, str, str], dict]:
  """Every launched run, keyed by ``(model, LAUNCHED mode, dropout masks or '')``; the
  dropout stream's runs take `STEPS` steps in either mode (they check training, not LB-BSP's
  moves)."""
  cases = [(name, mode, '', LAUNCHED[mode][0]) for name in NAMES for mode in LAUNCHED]
  cases += [('dropout_mlp', 'lbbsp', 'stream', STEPS)]  # one mode: the job's runs are the time
  return {(name, mode, masks): {
      'config': f'tests.foreign.{name}:get_config',
      'overrides': [f'steps={steps}', *HOST, *LAUNCHED[mode][1],
                    *([f'model.args.masks={masks}'] if masks else [])],
      'workdir': str(tmp / f'{name}-{mode}{"-" + masks if masks else ""}')}
      for name, mode, masks, steps in cases}


@pytest.fixture(scope='module')
def launched(tmp_path_factory):
  """One job of 4 launched workers running every `_runs` case in sequence (tests/foreign/
  _worker.py): the job's start is paid once. ``case -> run directory``."""
  tmp = tmp_path_factory.mktemp('launched')
  runs = _runs(tmp)
  (tmp / 'runs.json').write_text(json.dumps(list(runs.values())))
  result = subprocess.run(
      [sys.executable, '-m', 'hetjax.launch', '--workers', '4', '--devices-per-worker', '1',
       '--slowdown', SLOWDOWN, '--timeout', str(LAUNCH_TIMEOUT), '--log-dir', str(tmp), '--',
       sys.executable, str(ROOT / 'tests' / 'foreign' / '_worker.py'), str(tmp / 'runs.json')],
      cwd=ROOT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT + 60)
  assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
  return {case: pathlib.Path(spec['workdir']) for case, spec in runs.items()}


def _finished(workdir: pathlib.Path) -> dict:
  """The run's summary; the first worker's error if it raised."""
  errors = sorted(workdir.glob('error-*.txt'))
  assert not errors, errors[0].read_text()[-3000:]
  return json.loads((workdir / 'summary.json').read_text())


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 120)
@pytest.mark.parametrize('mode', LAUNCHED)
@pytest.mark.parametrize('name', NAMES)
def test_launched_workers_equal_one_device(launched, one_device, name, mode):
  """Each worker computes its own rows (an LB-BSP share, or the tokens it pulls); their
  gradients, weighted by rows, are one device's to float32 reduction order: the losses, and
  the parameters `hetjax.run.load_model` reads from the job's last checkpoint."""
  summary = _finished(launched[name, mode, ''])
  steps = LAUNCHED[mode][0]
  assert summary['final_step'] == steps
  losses, params = one_device(name)
  np.testing.assert_allclose(_losses(launched[name, mode, '']), losses[:steps], rtol=1e-5)
  _assert_same_params(run.load_model(launched[name, mode, '']), params[steps - 1])
  if mode == 'lbbsp':
    assert summary['last_shares'][3] < summary['last_shares'][0]  # the slow worker: fewer rows


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 120)
@pytest.mark.parametrize('mode', ['lbbsp'])
def test_dropout_stream_trains_on_launched_workers(launched, mode):
  """With the model's own stream, a worker draws one mask for the rows it computes: masks of
  its share's or token's shape, which no split of one device's mask gives, so the run cannot
  equal one device's (the per-example keys of ``masks='example'`` can, and do, in
  `test_launched_workers_equal_one_device`). It trains: every loss finite, the last below the
  first."""
  _finished(launched['dropout_mlp', mode, 'stream'])
  losses = _losses(launched['dropout_mlp', mode, 'stream'])
  assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
