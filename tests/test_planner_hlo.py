"""Collective bytes read from compiled HLO, against the ring formulas on known array sizes.

Every shard_map program below works on an f32[16, 32] block per device (2048 bytes) on 8 CPU
devices, so the expected numbers follow from the module docstring's factors by hand. XLA on CPU
keeps these collectives as written, except that `lax.all_to_all` becomes a tuple all-to-all of
8 f32[2, 32] slices (same total bytes) and a `psum` of two arrays becomes one tuple all-reduce.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hetjax.planner._hlo import KINDS, CollectiveBytes, collective_bytes
from tests.conftest import require_devices

BLOCK = 16 * 32 * 4  # bytes of one device's f32[16, 32] block
GLOBAL = 8 * BLOCK   # bytes of the f32[128, 32] array it is a block of


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
  devices = require_devices(int(np.prod(shape)))
  return Mesh(np.array(devices).reshape(shape), names, axis_types=(AxisType.Auto,) * len(shape))


def _compiled(fn, mesh: Mesh, in_specs, out_specs, *arrays):
  mapped = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
  specs = in_specs if isinstance(in_specs, tuple) else (in_specs,)
  args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s))
          for a, s in zip(arrays, specs, strict=True)]
  return jax.jit(mapped).lower(*args).compile()


def _only(counted: CollectiveBytes, kind: str, nbytes: float, count: int = 1,
          steps: int = 0) -> None:
  """Only ``count`` ops of ``kind``, moving ``nbytes`` in ``steps`` ring steps in all."""
  assert getattr(counted, kind) == nbytes
  assert counted.total == nbytes
  assert counted.counts == {k: count if k == kind else 0 for k in KINDS}
  assert counted.steps == {k: steps if k == kind else 0 for k in KINDS}
  assert counted.total_steps == steps
  assert not counted.unknown_trip_counts


X = jax.ShapeDtypeStruct((128, 32), jnp.float32)


def test_psum_is_an_all_reduce_over_eight():
  mesh = _mesh((8,), ('d',))
  counted = collective_bytes(_compiled(lambda a: lax.psum(a, 'd'), mesh, P('d'), P(), X))
  _only(counted, 'all_reduce', 2 * 7 / 8 * BLOCK, steps=14)  # 3584, 2·7 steps


def test_all_gather_charges_its_output():
  mesh = _mesh((8,), ('d',))
  compiled = _compiled(lambda a: lax.all_gather(a, 'd', tiled=True), mesh, P('d'), P(), X)
  _only(collective_bytes(compiled), 'all_gather', 7 / 8 * GLOBAL, steps=7)  # 14336


def test_psum_scatter_charges_its_input():
  mesh = _mesh((8,), ('d',))
  compiled = _compiled(lambda a: lax.psum_scatter(a, 'd', tiled=True), mesh, P(), P('d'), X)
  _only(collective_bytes(compiled), 'reduce_scatter', 7 / 8 * GLOBAL, steps=7)  # input f32[128, 32]


def test_all_to_all_tuple_form_sums_its_slices():
  mesh = _mesh((8,), ('d',))
  compiled = _compiled(lambda a: lax.all_to_all(a, 'd', 0, 0, tiled=True), mesh, P('d'), P('d'), X)
  assert 'all-to-all' in compiled.as_text()
  _only(collective_bytes(compiled), 'all_to_all', 7 / 8 * BLOCK, steps=7)  # 8 × f32[2, 32]


def test_ppermute_sends_its_block_once():
  mesh = _mesh((8,), ('d',))
  ring = [(i, (i + 1) % 8) for i in range(8)]
  compiled = _compiled(lambda a: lax.ppermute(a, 'd', ring), mesh, P('d'), P('d'), X)
  _only(collective_bytes(compiled), 'collective_permute', BLOCK, steps=1)


def test_psum_over_a_four_device_sub_axis():
  mesh = _mesh((2, 4), ('a', 'b'))
  compiled = _compiled(lambda a: lax.psum(a, 'b'), mesh, P(('a', 'b')), P('a'), X)
  _only(collective_bytes(compiled), 'all_reduce', 2 * 3 / 4 * BLOCK, steps=6)  # 3072


def test_psum_in_fori_loop_counts_every_iteration():
  mesh = _mesh((8,), ('d',))
  body = lambda i, c: lax.psum(c, 'd') * 0.5  # noqa: E731
  compiled = _compiled(lambda a: lax.fori_loop(0, 5, body, a), mesh, P('d'), P('d'), X)
  assert '"known_trip_count":{"n":"5"}' in compiled.as_text()
  _only(collective_bytes(compiled), 'all_reduce', 5 * 2 * 7 / 8 * BLOCK, count=5, steps=70)


def test_nested_loops_multiply():
  mesh = _mesh((8,), ('d',))
  inner = lambda j, d: lax.psum(d, 'd') * 0.5  # noqa: E731
  outer = lambda i, c: lax.fori_loop(0, 4, inner, c)  # noqa: E731
  compiled = _compiled(lambda a: lax.fori_loop(0, 3, outer, a), mesh, P('d'), P('d'), X)
  _only(collective_bytes(compiled), 'all_reduce', 12 * 2 * 7 / 8 * BLOCK, count=12,
        steps=168)


def test_psum_of_two_arrays_is_combined_into_one_tuple_all_reduce():
  mesh = _mesh((8,), ('d',))
  small = jax.ShapeDtypeStruct((8 * 4,), jnp.bfloat16)
  compiled = _compiled(lambda a, b: lax.psum((a, b), 'd'), mesh, (P('d'), P('d')), (P(), P()),
                       X, small)
  # CPU XLA converts the bf16[4] block to f32 and all-reduces (f32[16,32], f32[4]) at once.
  _only(collective_bytes(compiled), 'all_reduce', 2 * 7 / 8 * (BLOCK + 4 * 4), steps=14)


def test_data_dependent_loop_is_counted_once_and_flagged():
  mesh = _mesh((8,), ('d',))
  loop = lambda a: lax.while_loop(  # noqa: E731
      lambda c: c.sum() < 1e6, lambda c: lax.psum(c, 'd'), a)
  counted = collective_bytes(_compiled(loop, mesh, P('d'), P('d'), X))
  assert counted.all_reduce == 2 * 7 / 8 * BLOCK
  assert counted.unknown_trip_counts


def test_gspmd_reductions_over_mesh_axes():
  """A GSPMD program (no shard_map): the contraction over 'b' all-reduces f32[32, 32] in groups
  of 4; the sum over rows all-reduces f32[32] over 'a' (2 devices), printed in mesh-axes form."""
  mesh = _mesh((2, 4), ('a', 'b'))
  x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, P('a', 'b')))
  w = jax.ShapeDtypeStruct((128, 32), jnp.float32, sharding=NamedSharding(mesh, P('b', None)))
  step = jax.jit(lambda x, w: (x @ w).sum(0), out_shardings=NamedSharding(mesh, P()))
  counted = collective_bytes(step.lower(x, w).compile())
  assert counted.all_reduce == 2 * 3 / 4 * (32 * 32 * 4) + 2 * 1 / 2 * (32 * 4)
  assert counted.counts['all_reduce'] == 2
  assert counted.steps['all_reduce'] == 2 * 3 + 2 * 1


@pytest.mark.parametrize('k', [1, 3, 5])
def test_k_all_gathers_are_k_ops_of_seven_steps(k):
  """A program with k all-gathers of k different arrays over 8 devices: k ops (XLA:CPU neither
  combines nor merges them), 7 ring steps and 7/8 of the output each."""
  mesh = _mesh((8,), ('d',))
  gather = lambda *arrays: tuple(lax.all_gather(a, 'd', tiled=True) for a in arrays)  # noqa: E731
  compiled = _compiled(gather, mesh, (P('d'),) * k, (P(),) * k, *[X] * k)
  _only(collective_bytes(compiled), 'all_gather', k * 7 / 8 * GLOBAL, count=k, steps=7 * k)


def test_data_parallel_gradient_all_reduces_every_parameter_once():
  """Replicated parameters, batch split 8 ways: each gradient is all-reduced once (CPU XLA
  combines them all into one tuple all-reduce), so the bytes are 2·7/8 of the parameters'."""
  mesh = _mesh((8,), ('d',))
  model = nnx.eval_shape(lambda: nnx.Sequential(
      nnx.Linear(12, 40, rngs=nnx.Rngs(0)), jax.nn.relu, nnx.Linear(40, 3, rngs=nnx.Rngs(1))))
  graphdef, state = nnx.split(model)

  def grad(state, x):
    return jax.grad(lambda s: jnp.mean(nnx.merge(graphdef, s)(x) ** 2))(state)

  replicated = NamedSharding(mesh, P())
  state = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
                       state)
  x = jax.ShapeDtypeStruct((64, 12), jnp.float32, sharding=NamedSharding(mesh, P('d')))
  counted = collective_bytes(jax.jit(grad, out_shardings=replicated).lower(state, x).compile())
  param_bytes = 4 * (12 * 40 + 40 + 40 * 3 + 3)
  assert counted.all_reduce == 2 * 7 / 8 * param_bytes
  assert counted.total == counted.all_reduce


# --- Hand-written HLO. -------------------------------------------------------------------------

def _module(body: str, header: str = 'num_partitions=8', extra: str = '') -> str:
  return f"""HloModule m, {header}
%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}
{extra}
ENTRY %main (p: f32[16,32]) -> f32[16,32] {{
  %p = f32[16,32]{{1,0}} parameter(0)
{body}
}}
"""


@pytest.mark.parametrize(('groups', 'n'), [
    ('{{0,1,2,3},{4,5,6,7}}', 4),
    ('[2,4]<=[8]', 4),
    ('[4,2]<=[2,4]T(1,0)', 2),
    ('[8,1]<=[8]', 1),
    ('{}', 8),
    ("mesh['x'=2,'y'=4] {'y'}", 4),
    ("mesh['x'=2,'y'=4] {'x','y':(1)2}", 4),
    ("mesh['x'=2,'y'=4] {}", 1),
    # As the planner's mixed-layout programs print it (seen in bench_fela): ids reordered.
    ("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}", 4),
])
def test_group_forms(groups, n):
  hlo = _module(f'  ROOT %r = f32[16,32]{{1,0}} all-reduce(%p), channel_id=1, '
                f'replica_groups={groups}, use_global_device_ids=true, to_apply=%add')
  assert collective_bytes(hlo).all_reduce == 2 * (n - 1) / n * BLOCK


def test_empty_groups_follow_the_group_mode():
  op = '  ROOT %r = f32[16,32]{{1,0}} all-reduce(%p), {}replica_groups={{}}, to_apply=%add'
  header = 'replica_count=2, num_partitions=4'
  cross_replica = collective_bytes(_module(op.format(''), header))
  assert cross_replica.all_reduce == 2 * 1 / 2 * BLOCK
  flattened = collective_bytes(_module(op.format('channel_id=1, use_global_device_ids=true, '),
                                       header))
  assert flattened.all_reduce == 2 * 7 / 8 * BLOCK
  # cross-replica-and-partition: each replica group of 1 spans all 4 partitions
  replica_and_partition = '  ROOT %r = f32[16,32]{1,0} all-reduce(%p), channel_id=1, ' \
      'replica_groups={{0},{1}}, to_apply=%add'
  assert collective_bytes(_module(replica_and_partition, header)).all_reduce == \
      2 * 3 / 4 * BLOCK


def test_tuple_shapes_and_element_sizes():
  hlo = _module(
      '  %c = bf16[10]{0} constant({...})\n'
      '  %r = (f32[10]{0}, f32[20]{0}, /*index=2*/bf16[10]{0}, pred[3]{0}) all-reduce(%p, %p, '
      '%c, %c), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, '
      'to_apply=%add, metadata={op_name="all-reduce{(}" source_file="x.py"}\n'
      '  ROOT %g = f32[16,32]{1,0} copy(%p)')
  assert collective_bytes(hlo).all_reduce == 2 * 1 / 2 * (40 + 80 + 20 + 3)


def test_async_pairs_count_once():
  hlo = _module("""  %ars = f32[16,32]{1,0} all-reduce-start(%p), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %ard = f32[16,32]{1,0} all-reduce-done(%ars)
  %ags = (f32[16,32]{1,0}, f32[128,32]{1,0}) all-gather-start(%ard), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %agd = f32[128,32]{1,0} all-gather-done(%ags)
  %cps = (f32[16,32]{1,0}, f32[16,32]{1,0}, u32[], u32[]) collective-permute-start(%p), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %cpd = f32[16,32]{1,0} collective-permute-done(%cps)
  %rss = ((f32[128,32]{1,0}), f32[16,32]{1,0}) async-start(%agd), calls=%wrapped_rs
  %rsu = ((f32[128,32]{1,0}), f32[16,32]{1,0}) async-update(%rss), calls=%wrapped_rs
  ROOT %rsd = f32[16,32]{1,0} async-done(%rsu), calls=%wrapped_rs""", extra="""%wrapped_rs (q: f32[128,32]) -> f32[16,32] {
  %q = f32[128,32]{1,0} parameter(0)
  ROOT %rs = f32[16,32]{1,0} reduce-scatter(%q), channel_id=4, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
}""")
  counted = collective_bytes(hlo)
  assert counted.all_reduce == 2 * 7 / 8 * BLOCK
  assert counted.all_gather == 7 / 8 * GLOBAL
  assert counted.collective_permute == BLOCK
  assert counted.reduce_scatter == 7 / 8 * GLOBAL
  assert counted.counts == {'all_reduce': 1, 'all_gather': 1, 'reduce_scatter': 1,
                            'all_to_all': 0, 'collective_permute': 1}
  assert counted.steps == {'all_reduce': 14, 'all_gather': 7, 'reduce_scatter': 7,
                           'all_to_all': 0, 'collective_permute': 1}


def test_self_permute_and_single_device_groups_move_nothing():
  hlo = _module("""  %a = f32[16,32]{1,0} collective-permute(%p), channel_id=1, source_target_pairs={{0,0},{1,1}}
  ROOT %b = f32[16,32]{1,0} all-gather(%a), channel_id=2, replica_groups={{0},{1}}, dimensions={0}, use_global_device_ids=true""")
  counted = collective_bytes(hlo)
  assert counted.total == 0
  assert counted.counts['collective_permute'] == counted.counts['all_gather'] == 1
  assert counted.total_steps == 0  # ops that move nothing wait for no message


_LOOP = """%body (t: (s32[], f32[16,32])) -> (s32[], f32[16,32]) {
  %t = (s32[], f32[16,32]{1,0}) parameter(0)
  %x = f32[16,32]{1,0} get-tuple-element(%t), index=1
  %i = s32[] get-tuple-element(%t), index=0
  %r = f32[16,32]{1,0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %o = (s32[], f32[16,32]{1,0}) tuple(%i, %r)
}
%cond (u: (s32[], f32[16,32])) -> pred[] {
  %u = (s32[], f32[16,32]{1,0}) parameter(0)
  ROOT %k = pred[] constant(true)
}"""
_WHILE = ('  %z = s32[] constant(0)\n  %t0 = (s32[], f32[16,32]{{1,0}}) tuple(%z, %p)\n'
          '  ROOT %w = (s32[], f32[16,32]{{1,0}}) while(%t0), condition=%cond, body=%body{}')


def test_known_and_unknown_trip_counts():
  known = collective_bytes(_module(
      _WHILE.format(', backend_config={"known_trip_count":{"n":"7"}}'), extra=_LOOP))
  assert known.all_reduce == 7 * 2 * 7 / 8 * BLOCK
  assert known.counts['all_reduce'] == 7
  assert known.steps['all_reduce'] == 7 * 2 * 7
  assert not known.unknown_trip_counts
  unknown = collective_bytes(_module(_WHILE.format(''), extra=_LOOP))
  assert unknown.all_reduce == 2 * 7 / 8 * BLOCK
  assert unknown.unknown_trip_counts


def test_conditional_charges_its_busiest_branch_and_json():
  hlo = _module("""  %k = s32[] constant(1)
  ROOT %c = f32[16,32]{1,0} conditional(%k, %p, %p, %p), branch_computations={%b0, %b1, %b2}""",
                extra="""%b0 (x0: f32[16,32]) -> f32[16,32] {
  ROOT %x0 = f32[16,32]{1,0} parameter(0)
}
%b1 (x1: f32[16,32]) -> f32[16,32] {
  %x1 = f32[16,32]{1,0} parameter(0)
  ROOT %r1 = f32[16,32]{1,0} all-reduce(%x1), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
}
%b2 (x2: f32[16,32]) -> f32[16,32] {
  %x2 = f32[16,32]{1,0} parameter(0)
  ROOT %r2 = f32[16,32]{1,0} all-reduce(%x2), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
}""")
  counted = collective_bytes(hlo)
  assert counted.all_reduce == 2 * 3 / 4 * BLOCK
  assert counted.to_json() == {
      'all_reduce': 3072.0, 'all_gather': 0.0, 'reduce_scatter': 0.0, 'all_to_all': 0.0,
      'collective_permute': 0.0, 'total': 3072.0, 'unknown_trip_counts': False,
      'counts': {'all_reduce': 1, 'all_gather': 0, 'reduce_scatter': 0, 'all_to_all': 0,
                 'collective_permute': 0},
      'steps': {'all_reduce': 6, 'all_gather': 0, 'reduce_scatter': 0, 'all_to_all': 0,
                'collective_permute': 0}}


def test_unreadable_text_is_an_error():
  with pytest.raises(ValueError, match='no HLO computation'):
    collective_bytes('not hlo')
  odd = _module('  ROOT %r = f32[16,32]{1,0} all-reduce(%p), channel_id=1, '
                'replica_groups=someday, to_apply=%add')
  with pytest.raises(ValueError, match='replica_groups'):
    collective_bytes(odd)
