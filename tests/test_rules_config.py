"""Flax models as Flax and JAX read them: fewer logical names than dimensions replicate the
trailing ones, names no rule maps are replicated and listed at start-up, and a run's
``parallelism.rules`` go on top of its strategy's tables.

The model is Flax's own ``nnx.MultiHeadAttention`` over the 8 rows of a digit's 8x8 image: its
query, key and value kernels, of shape (in_features, heads, head_dim), carry two names
(``('embed', 'kv')``) and its output kernel (heads, head_dim, out) one (``('heads',)``), as
models from elsewhere annotate them.
"""

import json

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from hetjax import ConfigError, ShardingError, configs, data, run, sharding
from hetjax.pipeline import Link
from hetjax.sharding import LogicalRules, abstract_model, make_mesh, unmapped_names
from hetjax.train import Strategy, Task, Trainer, training_steps
from tests.conftest import require_devices

HELD_OUT = 180
D = ('data', 'model')
QUERY, OUT = 'attn/query/kernel', 'attn/out/kernel'


class Attention(nnx.Module):
  """Digits → 8 tokens of 8 pixels → ``proj`` to 16 → Flax attention (head_dim 2) → mean →
  10 classes."""

  def __init__(self, heads: int, *, rngs: nnx.Rngs):
    init = nnx.initializers.lecun_normal()
    self.proj = nnx.Linear(8, 16, kernel_init=nnx.with_partitioning(init, ('pixels', 'embed')),
                           rngs=rngs)
    self.attn = nnx.MultiHeadAttention(
        num_heads=heads, in_features=16, qkv_features=2 * heads, decode=False, rngs=rngs,
        kernel_init=nnx.with_partitioning(init, ('embed', 'kv')),
        out_kernel_init=nnx.with_partitioning(init, ('heads',)))
    self.head = nnx.Linear(16, 10, kernel_init=nnx.with_partitioning(init, ('embed', 'classes')),
                           rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.head(_attend(self.attn, _project(self.proj, x)))

  def chain(self) -> tuple[Link, ...]:
    """The three layers as a pipeline chain (`hetjax.pipeline.HasChain`)."""
    return (Link('proj', self.proj, lambda layer, _, batch: _project(layer, batch['x'])),
            Link('attn', self.attn, lambda layer, h, _: _attend(layer, h)),
            Link('head', self.head, lambda layer, h, _: layer(h)))

  def chain_loss(self, logits: jax.Array, batch) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])


def _project(layer: nnx.Linear, x: jax.Array) -> jax.Array:
  return layer(x.reshape(x.shape[0], 8, 8))


def _attend(layer: nnx.MultiHeadAttention, h: jax.Array) -> jax.Array:
  return layer(h).mean(axis=1)


def _loss(model: Attention, batch) -> jax.Array:
  return model.chain_loss(model(batch['x']), batch)


def attention_task(heads: int = 8) -> Task:
  """The model as a task on the digits (``model.name`` ``'<this module>:attention_task'``)."""
  digits = data.digits()
  train = data.ArraySource({k: a[:-HELD_OUT] for k, a in digits.arrays.items()})
  held_out = data.ArraySource({k: a[-HELD_OUT:] for k, a in digits.arrays.items()})
  return Task('attention', lambda rngs: Attention(heads, rngs=rngs), _loss, train,
              eval_data=held_out, config={'heads': heads})


def _specs(rules, heads=8, mesh_shape=(4, 2)):
  """``{path: spec tuple padded to the rank}`` of the parameters under ``rules`` on a mesh."""
  mesh = make_mesh(mesh_shape, devices=require_devices(int(np.prod(mesh_shape))))
  _, shapes, names = abstract_model(attention_task(heads).make_model)
  shardings = sharding.param_shardings(shapes, names, mesh, rules.params)
  flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
  return {'/'.join(str(k.key) for k in path): tuple(s.spec) + (None,) * (
      3 - len(s.spec)) for path, s in flat}


def test_fewer_names_than_dimensions_replicate_the_trailing_ones():
  mesh = make_mesh((4, 2), devices=require_devices(8))
  rules = LogicalRules.of({'heads': 'model', 'embed': 'data'})
  assert rules.checked_spec(('embed', 'heads'), (16, 8, 2), mesh, 'w') == PartitionSpec(
      'data', 'model', None)
  assert rules.checked_spec((), (16, 8), mesh, 'w') == PartitionSpec(None, None)
  with pytest.raises(ShardingError) as err:
    rules.checked_spec(('embed', 'heads', None), (16, 8), mesh, "parameter 'w'")
  assert str(err.value) == (
      "parameter 'w': 3 logical names ('embed', 'heads', None) for a rank-2 array (at most one "
      'a dimension; fewer leave the trailing dimensions replicated)')
  _, _, names = abstract_model(attention_task().make_model)
  assert names['attn']['query']['kernel'] == ('embed', 'kv', None)
  assert names['attn']['out']['kernel'] == ('heads', None, None)


# What each strategy does to the two-name kernel (16, 8, 2) and the one-name kernel (8, 2, 16) on
# 4x2: 'kv' has no rule anywhere; FSDP's fallback splits the output kernel's 16 over all 8.
EXPECTED = {
    Strategy.DATA_PARALLEL: {QUERY: (None, None, None), OUT: (None, None, None)},
    Strategy.FSDP: {QUERY: (D, None, None), OUT: (None, None, D)},
    Strategy.TENSOR_PARALLEL: {QUERY: (None, None, None), OUT: (D, None, None)},
    Strategy.HYBRID: {QUERY: (None, None, None), OUT: ('model', None, None)},
}


STEPS = 3
RULES = ('parallelism.rules.kv=model', 'parallelism.rules.heads=None')


def _config(*assignments: str) -> run.Config:
  """A run of `STEPS` steps of 16 rows with SGD and momentum, then ``--set``-style
  ``assignments`` (`hetjax.run.override`)."""
  config = run.Config(
      model=run.ModelConfig(f'{__name__}:attention_task', {'heads': 8}),
      data=run.DataConfig(global_batch=16),
      optimizer=run.OptimizerConfig('momentum', learning_rate=0.05, steps=STEPS),
      logging=run.LoggingConfig(every=1, mfu=False))
  # compilation_cache=False: the test process's JAX config stays as it is.
  return run.override(config, ['compilation_cache=False', *assignments])


def _train(mesh_shape, rules):
  """`STEPS` steps of `_config`'s optimizer and batches under ``rules``: (losses, params)."""
  config = _config()
  mesh = make_mesh(mesh_shape, devices=require_devices(int(np.prod(mesh_shape))))
  trainer = Trainer(attention_task(), run.optimizer_of(config)[0], config.data.global_batch,
                    mesh, rules, seed=config.data.seed)
  losses, state = [], trainer.init_state()
  for info in training_steps(trainer, state, STEPS):
    losses.append(float(info.metrics['loss']))
    state = info.state
  return np.asarray(losses), jax.device_get(state.params)


@pytest.fixture(scope='module')
def one_device():
  """Losses and final parameters on one device, every parameter whole: the reference that
  every layout and every mode's run must equal."""
  return _train((1, 1), Strategy.DATA_PARALLEL.rules())


@pytest.mark.parametrize('strategy', list(Strategy), ids=lambda s: s.value)
def test_flax_attention_under_every_strategy_equals_one_device(strategy, one_device):
  specs = _specs(strategy.rules())
  for path, expected in EXPECTED[strategy].items():
    assert specs[path] == expected, (path, specs[path])
  losses, params = _train((4, 2), strategy.rules())
  # The tolerances of tests/test_strategies.py: float32 reduction order, nothing more.
  np.testing.assert_allclose(losses, one_device[0], rtol=1e-5, atol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               params, one_device[1])


def test_unmapped_names_are_those_no_rule_names():
  _, _, names = abstract_model(attention_task().make_model)
  assert unmapped_names(names, Strategy.HYBRID.rules().params) == ('kv', 'pixels')
  assert unmapped_names(names, Strategy.FSDP.rules({'kv': None}).params) == ('pixels',)
  assert unmapped_names(names, LogicalRules()) == ('embed', 'kv', 'heads', 'classes', 'pixels')
  scoped = LogicalRules(scopes=(('attn', LogicalRules.of({'kv': 'model', 'heads': None})),))
  assert unmapped_names(names, scoped) == ('embed', 'classes', 'pixels')
  # Every built-in table decides the names of hetjax's own models.
  from hetjax import models

  for name in ('mlp', 'transformer', 'wide_deep'):
    shipped = abstract_model(models.make_task(name).make_model)[2]
    assert all(unmapped_names(shipped, s.rules().params) == () for s in Strategy), name


def test_parallelism_rules_override_the_strategy():
  # None replicates what the strategy splits; a new name is split where the rule says.
  assert _specs(Strategy.TENSOR_PARALLEL.rules({'heads': None}))[OUT] == (None, None, None)
  # Under FSDP a replicated name also keeps its dimension out of the fallback's choice.
  assert _specs(Strategy.FSDP.rules())[QUERY] == (D, None, None)
  assert _specs(Strategy.FSDP.rules({'embed': None}))[QUERY] == (None, D, None)
  hybrid = Strategy.HYBRID.rules({'kv': 'model'})
  assert _specs(hybrid)[QUERY] == (None, 'model', None)
  assert hybrid.compute.spec(('batch', None, 'kv')) == PartitionSpec('data', None, 'model')
  # A mesh axis the rule already took elsewhere in the array falls back to the strategy's rule.
  both = Strategy.HYBRID.rules({'embed': 'model', 'heads': ('data',)})
  assert both.params.spec(('embed', 'heads')) == PartitionSpec('model', 'data')
  assert Strategy.HYBRID.rules({}) == Strategy.HYBRID.rules()
  assert Strategy.describe(hybrid) == 'strategy hybrid with parallelism.rules'


def test_bad_rules_fail_in_one_line_naming_the_rule():
  with pytest.raises(ConfigError) as err:
    Strategy.HYBRID.rules({'kv': ('model', 'tensor')})
  assert str(err.value) == ("parallelism.rules['kv']: mesh axis 'tensor' is not an axis of the "
                            "strategy mesh ('data', 'model')")
  with pytest.raises(ShardingError) as err:  # 6 heads over data's 4
    _specs(Strategy.HYBRID.rules({'kv': 'data'}), heads=6)
  assert str(err.value) == (
      "parameter 'attn/key/kernel': dimension 1 ('kv', size 6) is not divisible by mesh axes "
      "('data',) of total size 4 (parallelism.rules['kv']); replicate it with "
      "parallelism.rules.kv=None, or split dimension 0 ('embed', size 16), which 4 divides")
  with pytest.raises(ShardingError, match=r"^parameter 'w': dimension 0 \('kv'\) maps onto mesh "
                     r"axis 'tensor', which mesh \{'data': 4, 'model': 2\} lacks \(mine\['kv'\]\)$"):
    LogicalRules().overlay({'kv': 'tensor'}, 'mine').checked_spec(
        ('kv',), (8,), make_mesh((4, 2), devices=require_devices(8)), "parameter 'w'")


# Every mode on the 8 devices: the strategy modes with parallelism.rules on top, pipeline stages
# and a plan (which take no parallelism.rules) with the kernels as they are.
MODES = {
    'spmd': ('strategy=hybrid', 'mesh=4x2', *RULES),
    'shares': ('mode=shares', 'strategy=tensor_parallel', 'mesh=2x4', *RULES),
    'tokens': ('mode=tokens', 'strategy=fsdp', 'mesh=4x2', *RULES),
    'pipeline': ('mode=pipeline',),
    'plan': (f'plan={configs.PLANS / "hybrid.json"}',),
}


@pytest.mark.parametrize('mode', list(MODES))
def test_every_mode_trains_flax_attention_like_one_device(tmp_path, capsys, mode, one_device):
  require_devices(8)
  workdir = tmp_path / 'run'
  assert run.train(_config(*MODES[mode]), workdir)['final_step'] == STEPS
  out = capsys.readouterr().out
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  np.testing.assert_allclose([r['loss'] for r in rows], one_device[0], rtol=1e-5, atol=0)
  info = json.loads((workdir / 'run.json').read_text())
  if mode in ('pipeline', 'plan'):
    assert 'rules' not in info and 'rules:' not in out
    return
  # The strategy's tables with parallelism.rules first; 'pixels' is named by no rule.
  assert info['rules']['params'][:2] == [['kv', ['model']], ['heads', []]]
  fallback = ' unless the fallback splits their parameters' if mode == 'tokens' else ''
  assert out.count(f'rules: logical names no rule maps, replicated{fallback}: pixels\n') == 1
  model = run.load_model(workdir)  # every parameter whole on this process's devices
  assert model.attn.query.kernel.shape == (16, 8, 2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.device_get(nnx.to_pure_dict(nnx.state(model))), one_device[1])
  if mode == 'spmd':
    result = run.evaluate(workdir, batches=1)
    assert result['step'] == STEPS and np.isfinite(result['eval_loss'])


@pytest.mark.parametrize('mode, why', [
    ('pipeline', "mode pipeline replicates each stage's parameters on the stage's devices"),
    ('plan', "mode plan takes each sub-model's layout from its plan"),
])
def test_modes_without_a_strategy_refuse_parallelism_rules(tmp_path, mode, why):
  with pytest.raises(ConfigError) as err:
    run.train(_config(f'mode={mode}', 'parallelism.rules.kv=model'), tmp_path / 'run')
  message = str(err.value)
  assert message.startswith(f'mode {mode} takes no parallelism.rules (parallelism.rules maps '
                            'logical names onto the strategy mesh: modes spmd, shares and '
                            f'tokens); {why}'), message
  assert message.endswith(': drop it or pick a mode that takes it')
  assert not (tmp_path / 'run').exists()


def test_a_bad_axis_in_the_config_fails_before_the_run_directory(tmp_path):
  with pytest.raises(ConfigError, match=r"^parallelism.rules\['kv'\]: mesh axis 'tensor'"):
    run.train(_config('parallelism.rules.kv=tensor'), tmp_path / 'run')
  assert not (tmp_path / 'run').exists()
