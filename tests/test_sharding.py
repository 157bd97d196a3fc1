"""Logical-axis rules, mesh building, and sharded initialisation."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

from hetjax import ConfigError, ShardingError
from hetjax.sharding import LogicalRules, init_sharded, make_mesh, parse_mesh_shape
from tests.conftest import require_devices


def test_spec_maps_names_and_replicates_unknown_ones():
  rules = LogicalRules.of({'batch': 'data', 'mlp': 'model', 'table': ('data', 'model')})
  assert rules.spec(('batch', 'mlp')) == PartitionSpec('data', 'model')
  assert rules.spec(('embed', 'mlp')) == PartitionSpec(None, 'model')
  assert rules.spec(('table', None)) == PartitionSpec(('data', 'model'), None)


def test_a_mesh_axis_shards_at_most_one_dimension():
  # Flax semantics: 'embed' wants 'data' too, but 'batch' took it, so 'embed' is replicated.
  rules = LogicalRules.of({'batch': 'data', 'embed': 'data'})
  assert rules.spec(('batch', 'embed')) == PartitionSpec('data', None)
  assert rules.spec(('embed',)) == PartitionSpec('data')


def test_later_rules_for_a_name_are_fallbacks():
  rules = LogicalRules((('embed', ('data',)), ('embed', ('model',)), ('batch', ('data',))))
  assert rules.spec(('batch', 'embed')) == PartitionSpec('data', 'model')


def test_checked_spec_names_parameter_dimension_and_sizes():
  mesh = make_mesh((4, 2), devices=require_devices(8))
  rules = LogicalRules.of({'mlp': ('data', 'model')})
  with pytest.raises(ShardingError) as err:
    rules.checked_spec(('embed', 'mlp'), (64, 12), mesh, "parameter 'up/kernel'")
  message = str(err.value)
  assert "parameter 'up/kernel'" in message and "dimension 1 ('mlp', size 12)" in message
  assert "('data', 'model') of total size 8" in message and '\n' not in message


@pytest.mark.parametrize('names, shape, expected', [
    ((None, None), (6, 8), (None, 'data')),          # 4 divides dimension 1 only
    ((None, None), (8, 12), (None, 'data')),         # the largest that 4 divides
    ((None, None, None), (8, 4, 8), ('data', None, None)),  # a tie: the first
    (('mlp', None), (12, 8), ('data', None)),        # 'mlp' has no rule here: unknown
    ((None, None), (3, 5), (None, None)),            # 4 divides neither: replicated
    (('embed', None), (8, 12), ('data', None)),      # a rule splits it: no fallback
    ((), (), ()),                                    # a scalar
])
def test_fallback_splits_the_largest_divisible_dimension(names, shape, expected):
  mesh = make_mesh((4, 1), devices=require_devices(4))
  rules = LogicalRules.of({'embed': 'data'}, fallback='data')
  assert rules.checked_spec(names, shape, mesh, 'w') == PartitionSpec(*expected)
  assert LogicalRules.of({'embed': 'data'}).checked_spec(names, shape, mesh, 'w') == (
      PartitionSpec(*[e if n == 'embed' else None for n, e in zip(names, expected, strict=True)]))


def test_fallback_needs_more_than_one_device_and_a_known_mesh_axis():
  mesh = make_mesh((1, 1), devices=require_devices(1))
  one = LogicalRules.of({}, fallback=('data', 'model'))
  assert one.checked_spec((None,), (8,), mesh, 'w') == PartitionSpec(None)
  with pytest.raises(ShardingError, match="mesh axis 'fsdp'"):
    LogicalRules.of({}, fallback='fsdp').checked_spec((None,), (8,), mesh, 'w')


def test_checked_spec_rejects_unknown_mesh_axis():
  mesh = make_mesh((1, 1), devices=require_devices(1))
  with pytest.raises(ShardingError, match="mesh axis 'tensor'"):
    LogicalRules.of({'mlp': 'tensor'}).checked_spec(('mlp',), (8,), mesh, 'x')


def test_make_mesh_uses_auto_axes():
  mesh = make_mesh((4, 2), devices=require_devices(8))
  assert dict(mesh.shape) == {'data': 4, 'model': 2}
  assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)


def test_make_mesh_rejects_wrong_device_count_with_hint():
  with pytest.raises(ConfigError, match=r'mesh 4x4 needs 16 devices but 8 cpu .*--jax_num_cpu'):
    make_mesh((4, 4), devices=require_devices(8))


@pytest.mark.parametrize('text', ['4', '4x', 'axb', '0x8', '4x2x1', '-1x8'])
def test_parse_mesh_shape_rejects_bad_text(text):
  with pytest.raises(ConfigError, match='positive sizes'):
    parse_mesh_shape(text)


def test_parse_mesh_shape():
  assert parse_mesh_shape('4x2') == (4, 2)
  assert parse_mesh_shape(' 1X8 ') == (1, 8)


class _Pair(nnx.Module):
  def __init__(self, rngs):
    init = nnx.initializers.normal()
    self.a = nnx.Param(nnx.with_partitioning(init, ('embed', 'mlp'))(rngs.params(), (16, 32)))
    self.b = nnx.Param(nnx.with_partitioning(init, ('mlp',))(rngs.params(), (32,)))


def test_init_sharded_creates_parameters_in_their_layout():
  mesh = make_mesh((4, 2), devices=require_devices(8))
  rules = LogicalRules.of({'mlp': 'model', 'embed': 'data'})
  graphdef, params, shardings = init_sharded(_Pair, mesh, rules, seed=3)
  assert params['a'].sharding.spec == PartitionSpec('data', 'model')
  assert params['a'].addressable_shards[0].data.shape == (4, 16)
  assert shardings['b'].spec == PartitionSpec('model')
  with nnx.use_eager_sharding(False):
    reference = nnx.to_pure_dict(nnx.state(_Pair(nnx.Rngs(3))))
  # Same values as an eager init; jit fuses the normal sampler, hence ulp-level differences.
  np.testing.assert_allclose(jax.device_get(params['a']), reference['a'], rtol=1e-6, atol=1e-8)
  assert isinstance(nnx.merge(graphdef, params), _Pair)


class _Odd(nnx.Module):
  def __init__(self, rngs):
    init = nnx.initializers.normal()
    self.w = nnx.Param(nnx.with_partitioning(init, ('embed', 'mlp'))(rngs.params(), (16, 12)))


def test_init_sharded_rejects_indivisible_parameter():
  mesh = make_mesh((1, 8), devices=require_devices(8))
  with pytest.raises(ShardingError, match=r"^parameter 'w': dimension 1 \('mlp', size 12\)"):
    init_sharded(_Odd, mesh, LogicalRules.of({'mlp': ('data', 'model')}))


def test_an_optional_name_splits_where_it_divides_and_is_left_whole_where_not():
  mesh = make_mesh((4, 2), devices=require_devices(8))
  rules = LogicalRules.of({'heads': 'model', 'kv_heads': 'model'}, optional=['kv_heads'])
  names = ('embed', 'kv_heads', 'head_dim')
  assert rules.checked_spec(names, (16, 2, 8), mesh, 'k') == PartitionSpec(None, 'model', None)
  assert rules.checked_spec(names, (16, 1, 8), mesh, 'k') == PartitionSpec(None, None, None)
  assert rules.relaxed(names, (16, 1, 8), mesh) == (1,)
  activation = ('batch', 'seq', 'kv_heads', 'head_dim')
  assert rules.spec_for(activation, (4, 8, 1, 8), mesh) == PartitionSpec(None, None, None, None)
  assert rules.spec_for(activation, (4, 8, 2, 8), mesh) == PartitionSpec(None, None, 'model',
                                                                         None)
  with pytest.raises(ShardingError, match=r"dimension 1 \('heads', size 3\)"):
    rules.checked_spec(('embed', 'heads'), (16, 3), mesh, 'q')  # a required name still fails
  # A run's own rule for it is the user's word: never set aside.
  given = rules.overlay({'kv_heads': 'model'}, 'parallelism.rules')
  with pytest.raises(ShardingError, match=r"parallelism\.rules\['kv_heads'\]"):
    given.checked_spec(names, (16, 1, 8), mesh, 'k')
