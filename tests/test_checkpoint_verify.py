"""Checkpoints verified on restore: a checksum of our own, the same under any sharding; a latest
checkpoint that orbax reads silently wrong, or not at all, skipped for the one before it (in
every process of a job alike); and the last good checkpoint kept until a newer one is complete.
"""

import doctest
import io
import os
import re
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint._src.path import atomicity  # only to make a commit fail, below

from hetjax import ConfigError
from hetjax.checkpoint import Checkpointer, _checksum
from hetjax.checkpoint._checksum import checksums, first_difference
from hetjax.runtime import launch_local
from hetjax.sharding import make_mesh
from hetjax.train import TrainState
from tests.conftest import require_devices

UNSIGNED = {np.float32: np.uint32, np.int32: np.uint32, ml_dtypes.bfloat16: np.uint16,
            np.int8: np.uint8}


def test_doctests():
  assert doctest.testmod(_checksum).failed == 0


def _values(dtype, shape=(8, 6), seed=0):
  return np.clip(np.random.default_rng(seed).standard_normal(shape) * 50, -120, 120).astype(dtype)


def _flip_bit(values, index, bit):
  flipped = values.copy()
  flipped.reshape(-1).view(UNSIGNED[values.dtype.type])[index] ^= 1 << bit
  return flipped


@pytest.mark.parametrize('dtype', [np.float32, ml_dtypes.bfloat16, np.int32, np.int8])
@pytest.mark.parametrize('spec', [P('data', 'model'), P(None, 'model'), P(('data', 'model'))])
def test_checksum_is_the_same_on_one_device_and_sharded_over_eight(dtype, spec):
  mesh = make_mesh((4, 2), devices=require_devices(8))
  values = _values(dtype)
  one = checksums({'x': jax.device_put(values, jax.devices()[0])})
  sharded = jax.device_put(values, NamedSharding(mesh, spec))
  assert len(sharded.addressable_shards) == 8 and checksums({'x': sharded}) == one
  assert one['x']['shape'] == [8, 6] and one['x']['dtype'] == np.dtype(dtype).name
  bits = 8 * np.dtype(dtype).itemsize
  for index, bit in [(0, 0), (17, bits - 1), (47, bits // 2)]:  # any one bit of any element
    other = checksums({'x': jax.device_put(_flip_bit(values, index, bit), NamedSharding(mesh, spec))})
    assert first_difference(one, other) == "leaf 'x' checksum differs"


@pytest.mark.parametrize('dtype', [np.float32, ml_dtypes.bfloat16, np.int32, np.int8, np.bool_,
                                   np.float16, ml_dtypes.float8_e4m3fn])
@pytest.mark.parametrize('shape', [(), (7,), (8, 6)])
def test_the_host_sum_is_the_devices_sum(dtype, shape):
  """A leaf held whole on CPU devices is summed by numpy (`_checksum._host_sum`); a global
  array of a multi-process job by a jitted collective (`_checksum._sums`): the same value, so a
  checkpoint saved by either verifies under the other, also sharded over eight devices."""
  values = _values(dtype, shape) if dtype != np.bool_ else _values(np.float32, shape) > 0
  mesh = make_mesh((4, 2), devices=require_devices(8))
  spec = P('data', 'model') if len(shape) == 2 else P()
  for x in (jax.device_put(values, jax.devices()[0]),
            jax.device_put(values, NamedSharding(mesh, spec))):
    assert _checksum._on_host(x)
    assert _checksum._host_sum(np.asarray(x)) == int(_checksum._scalar(_checksum._sums([x])[0]))


def test_the_host_sum_goes_over_chunks_and_skips_what_it_cannot_take():
  big = jax.device_put(_values(np.float32, (3 * _checksum._HOST_CHUNK // 2,)), jax.devices()[0])
  assert _checksum._host_sum(np.asarray(big)) == int(_checksum._scalar(_checksum._sums([big])[0]))
  assert not _checksum._on_host(jnp.zeros(3, jnp.int4))
  assert not _checksum._on_host(jax.random.key(0))
  assert checksums({'k': jax.random.key(0)})['k']['shape'] == []  # on the devices' path


def test_checksum_of_a_tree_names_each_leaf_and_ignores_the_layout():
  mesh = make_mesh((4, 2), devices=require_devices(8))
  tree = TrainState(np.int32(7), {'w': _values(np.float32), 'e': _values(ml_dtypes.bfloat16)},
                    {'mask': _values(np.float32) > 0, 'count': 3})
  one = checksums(tree)
  sharded = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(
      mesh, P('data', 'model') if np.ndim(x) == 2 else P())), tree)
  assert checksums(sharded) == one
  assert sorted(one) == ['opt_state/count', 'opt_state/mask', 'params/e', 'params/w', 'step']
  assert one['opt_state/count'] == {'sum': 3, 'shape': [], 'dtype': 'int32'}
  swapped = TrainState(tree.step, {'w': tree.params['e'].astype(np.float32), 'e': tree.params['e']},
                       tree.opt_state)
  assert first_difference(one, checksums(swapped)) == "leaf 'params/w' checksum differs"
  cast = TrainState(tree.step, {**tree.params, 'e': tree.params['e'].astype(np.float32)},
                    tree.opt_state)
  assert first_difference(one, checksums(cast)) == \
      "leaf 'params/e' dtype (bfloat16 saved, float32 restored) differs"


def _state(step):
  w = np.random.default_rng(step).standard_normal(2048, dtype=np.float32)  # barely compressible
  return TrainState(jnp.int32(step), {'w': jnp.asarray(w), 'b': jnp.arange(8) * step}, {})


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      state)


def _saved(directory, steps=(1, 2), **kwargs):
  ckpt = Checkpointer(directory, **kwargs)
  for step in steps:
    ckpt.save(_state(step), {'k': 1})
  ckpt.wait()
  return ckpt


def _flip_one_data_bit(state_dir, values):
  """Flips one bit in the largest array-data file of a checkpoint's state, at the first place
  from its middle where orbax still restores it without an error but with ``values`` changed
  (orbax compresses the data, so some flips fail to decode instead: those are put back)."""
  path = max(state_dir.glob('ocdbt.process_*/d/*'), key=lambda p: p.stat().st_size)
  original = path.read_bytes()
  abstract = _abstract(_state(2))
  for at in range(len(original) // 2, len(original)):
    data = bytearray(original)
    data[at] ^= 0x01
    path.write_bytes(data)
    try:
      restored = ocp.StandardCheckpointer().restore(state_dir, abstract)
    except Exception:
      continue
    if (np.asarray(restored.params['w']) != np.asarray(values)).any():
      return
  path.write_bytes(original)
  raise AssertionError(f'no single-bit flip in {path} restores silently')


def test_flipped_data_that_orbax_reads_silently_is_caught_and_skipped(tmp_path, capsys):
  ckpt = _saved(tmp_path / 'ckpt')
  _flip_one_data_bit(tmp_path / 'ckpt' / '2' / 'state', _state(2).params['w'])
  abstract = _abstract(_state(2))
  unchecked = ocp.StandardCheckpointer().restore(tmp_path / 'ckpt' / '2' / 'state', abstract)
  changed = np.asarray(unchecked.params['w']) != np.asarray(_state(2).params['w'])
  assert changed.sum() >= 1  # orbax: no error, values different

  restored, meta = ckpt.restore(abstract)
  assert int(restored.step) == 1 and meta['step'] == 1 and meta['k'] == 1
  jax.tree.map(np.testing.assert_array_equal, restored, _state(1))
  assert capsys.readouterr().err.strip().splitlines() == [
      f"warning: checkpoint step 2 in {tmp_path / 'ckpt'} failed verification (leaf 'params/w' "
      'checksum differs); using step 1']
  with pytest.raises(ConfigError) as e:  # asked for by step: no fallback
    ckpt.restore(abstract, step=2)
  assert str(e.value) == (f"checkpoint step 2 in {tmp_path / 'ckpt'} failed verification "
                          "(leaf 'params/w' checksum differs)")
  _flip_one_data_bit(tmp_path / 'ckpt' / '1' / 'state', _state(1).params['w'])
  with pytest.raises(ConfigError, match=r"^checkpoint step 1 in .* failed verification \(leaf "
                     r"'params/w' checksum differs\); no older one is good$"):
    ckpt.restore(abstract)
  ckpt.close()


def test_a_checkpoint_saved_without_checksums_restores_unverified(tmp_path, capsys):
  ckpt = _saved(tmp_path / 'ckpt')
  record = tmp_path / 'ckpt' / '2' / 'meta' / 'metadata'  # the JSON item as orbax writes it
  assert '"checksums"' in record.read_text()
  record.write_text('{"k": 1, "step": 2}')  # what a save before checksums wrote
  restored, meta = ckpt.restore(_abstract(_state(2)))
  assert meta == {'k': 1, 'step': 2} and capsys.readouterr().err == ''
  jax.tree.map(np.testing.assert_array_equal, restored, _state(2))
  ckpt.close()


def test_an_unfinished_newer_save_leaves_the_last_good_checkpoint(tmp_path):
  """What a process killed while saving step 3 leaves (orbax's temporary, never renamed) is
  ignored: steps 1 and 2 stay, and step 2 restores, although max_to_keep=2 would drop step 1
  once step 3 is complete."""
  _saved(tmp_path / 'ckpt', max_to_keep=2).close()
  partial = tmp_path / 'ckpt' / f'3{ocp.step.TMP_DIR_SUFFIX}-1234567890'
  (partial / 'state' / 'd').mkdir(parents=True)
  (partial / 'state' / 'd' / 'garbage').write_bytes(os.urandom(64))
  ckpt = Checkpointer(tmp_path / 'ckpt', max_to_keep=2)
  assert ckpt.latest_step() == 2 and ckpt.all_steps() == [1, 2]
  restored, meta = ckpt.restore(_abstract(_state(2)))
  assert meta['step'] == 2
  jax.tree.map(np.testing.assert_array_equal, restored, _state(2))
  ckpt.close()


def test_a_save_whose_commit_fails_deletes_nothing(tmp_path, monkeypatch):
  """With max_to_keep=1, saving step 2 is to delete step 1 — after step 2 is renamed into
  place. When that rename fails (disk full, a process killed), step 1 stays the checkpoint."""
  ckpt = _saved(tmp_path / 'ckpt', steps=(1,), max_to_keep=1)

  async def fail(self):
    raise OSError('disk full')

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, 'finalize', fail)
  ckpt.save(_state(2), {'k': 1})
  with pytest.raises(OSError, match='disk full'):
    ckpt.wait()
  monkeypatch.undo()
  ckpt.close()
  assert sorted(p.name for p in (tmp_path / 'ckpt').iterdir()) == \
      ['1', f'2{ocp.step.TMP_DIR_SUFFIX}']
  ckpt = Checkpointer(tmp_path / 'ckpt', max_to_keep=1)
  assert ckpt.all_steps() == [1]
  restored, _ = ckpt.restore(_abstract(_state(1)))
  jax.tree.map(np.testing.assert_array_equal, restored, _state(1))
  ckpt.close()


# Two processes, one device each, save an array sharded over both. Worker 1 then flips a bit in
# its own shard of step 2 (both restore step 1: the checksum is global), then truncates that
# file (only worker 1 cannot read step 2; both still restore step 1).
WORKER = '''
import pathlib, sys
import numpy as np
from hetjax import runtime
ctx = runtime.initialize(init_timeout_s=30)
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from hetjax.checkpoint import Checkpointer
from hetjax.train import TrainState

directory = pathlib.Path(sys.argv[1])
mesh = Mesh(np.array(jax.devices()), ('x',))

def global_array(values, spec):
  return jax.make_array_from_callback(values.shape, NamedSharding(mesh, spec),
                                      lambda i: values[i])

def state(step):
  w = np.random.default_rng(step).standard_normal(4096, dtype=np.float32)
  return TrainState(global_array(np.int32(step), P()), {'w': global_array(w, P('x'))}, {}), w

ckpt = Checkpointer(directory)
for step in (1, 2):
  ckpt.save(state(step)[0], {})
ckpt.wait()
abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        state(2)[0])
mine = max((directory / '2' / 'state').glob(f'ocdbt.process_{ctx.worker}/d/*'),
           key=lambda p: p.stat().st_size)
channel = runtime.Channel('test')
for damage in ('flip', 'truncate'):
  if ctx.worker == 1:
    data = bytearray(mine.read_bytes())
    if damage == 'flip':
      data[len(data) // 2] ^= 0x01
    mine.write_bytes(data if damage == 'flip' else data[:len(data) // 2])
  channel.barrier(damage)
  restored, meta = ckpt.restore(abstract)
  shard = restored.params['w'].addressable_shards[0]
  good = np.array_equal(np.asarray(shard.data), state(1)[1][shard.index])
  print(f'{damage}: restored step {int(restored.step)}, meta step {meta["step"]}, '
        f'values {"equal" if good else "DIFFER"}', flush=True)
ckpt.close()
'''


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_workers_agree_to_skip_a_latest_checkpoint_that_fails_in_any_of_them(tmp_path):
  out = io.StringIO()
  directory = tmp_path / 'ckpt'
  result = launch_local([sys.executable, '-c', textwrap.dedent(WORKER), str(directory)], 2,
                        timeout=60, init_timeout=30, stdout=out)
  lines = out.getvalue().splitlines()
  assert result.returncode == 0, '\n'.join(lines[-30:])
  for worker in (0, 1):
    mine = [m[1] for m in (re.fullmatch(rf'\[w{worker}\] (.*)', line) for line in lines) if m]
    warnings = [line for line in mine if line.startswith('warning:')]
    assert warnings[0] == (f"warning: checkpoint step 2 in {directory} failed verification "
                           "(leaf 'params/w' checksum differs); using step 1")
    unreadable = rf'warning: checkpoint step 2 in {re.escape(str(directory))} is unreadable \('
    assert re.match(unreadable + r'.*\)' + ('' if worker == 1 else ' in process 1') +
                    '; using step 1$', warnings[1]), warnings
    assert len(warnings) == 2
    for damage in ('flip', 'truncate'):
      assert f'{damage}: restored step 1, meta step 1, values equal' in mine, mine
