"""GroupAverager (SDPipe's group averaging of stage replicas) and `consensus_distance`.

The multiprocess cases launch 4 real worker processes (`tests/workers/replicas_averaging.py`)
through `hetjax.runtime.launch_local`, always with a timeout. Each worker starts from its own
tree and walks the same sequence of groups (`OPS`): two groups at once, everyone, a middle
pair, a group of one, and the first pair again (which must reuse its compiled program). The
reference is the same sequence of means in float64 numpy from the known initial trees. The
other tests run in this process (one JAX process, no launch).
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.replicas._averaging import GroupAverager, consensus_distance
from hetjax.runtime import launch_local
from tests.conftest import require_devices
from tests.workers.replicas_averaging import OPS, WORKERS, flat, group_of, initial

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 120
BF16_RTOL = 2.0**-7  # one bfloat16 rounding per op, compounded over the chain


def _expected() -> list[list[dict[str, np.ndarray]]]:
  """``[state][worker] -> {path: float64 array}``: the initial trees, then after each op."""
  states = [[{k: v.astype(np.float64) for k, v in flat(initial(w), '').items()}
             for w in range(WORKERS)]]
  for op in OPS:
    state = list(states[-1])
    for group in op:
      mean = {k: np.mean([states[-1][m][k] for m in group], axis=0) for k in state[group[0]]}
      for m in group:
        state[m] = mean
    states.append(state)
  return states


@pytest.mark.multiprocess
@pytest.mark.timeout(2 * LAUNCH_TIMEOUT + 60)
@pytest.mark.parametrize('per_worker', [1, 2], ids=['1d', '2d'])
def test_group_averages_across_processes(tmp_path, per_worker):
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'replicas_averaging.py'),
             str(tmp_path)]
  result = launch_local(command, workers=WORKERS, devices_per_worker=per_worker,
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  outs = []
  for w in range(WORKERS):
    with np.load(tmp_path / f'w{w}.npz') as arrays:
      outs.append(dict(arrays))

  expected = _expected()
  for w, out in enumerate(outs):
    assert bool(out['placed']), f'worker {w}: a result lost its dtype or left the local mesh'
    assert str(out['outsider']).startswith('group members ['), out['outsider']
    assert f'do not include this process {w}' in str(out['outsider'])
    # Distinct groups of two or more so far: a repeated group and a group of one compile nothing.
    seen, counts = set(), []
    for op in OPS:
      group = group_of(w, op)
      if group is not None and len(group) > 1:
        seen.add(group)
      counts.append(len(seen))
    assert list(out['compiles']) == counts, (w, out['compiles'])

  for k, op in enumerate(OPS, start=1):
    for w in range(WORKERS):
      group = group_of(w, op)
      for key, want in expected[k][w].items():
        got = outs[w][f'{k}{key}']
        rtol = BF16_RTOL if key.endswith('half') else 1e-6
        np.testing.assert_allclose(got, want, rtol=rtol, err_msg=f'op {k} worker {w} {key}')
        if group is None or len(group) == 1:  # skipped or alone: bit for bit unchanged
          np.testing.assert_array_equal(got, outs[w][f'{k - 1}{key}'])
        else:  # every member of a group ends with the same bits
          np.testing.assert_array_equal(got, outs[group[0]][f'{k}{key}'])
  # The ops really averaged: after 'everyone', the four replicas agree.
  final = [{k: v for k, v in out.items() if k.startswith('2/')} for out in outs]
  assert consensus_distance(final) == 0.0
  assert consensus_distance([{k: v for k, v in out.items() if k.startswith('0/')}
                             for out in outs]) > 1.0


# -- in this process ------------------------------------------------------------------------------


def _tree(device):
  return jax.device_put({'w': jnp.ones((2, 3)), 'b': jnp.zeros((4,), jnp.bfloat16)}, device)


def test_group_of_one_returns_the_tree_without_compiling():
  device = require_devices(1)[0]
  tree = _tree(device)
  averager = GroupAverager([device], jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype), tree))
  assert averager.average(tree, [0]) is tree
  assert averager.compiles == 0


@pytest.mark.parametrize('members, message', [
    ([0, 0], 'group members [0, 0] must be distinct process indices in increasing order'),
    ([], 'group members [] must be distinct process indices in increasing order'),
    ([1], 'group members [1] must be process indices in 0..0'),
    ([-1, 0], 'group members [-1, 0] must be process indices in 0..0'),
])
def test_bad_members(members, message):
  device = require_devices(1)[0]
  tree = _tree(device)
  with pytest.raises(ConfigError) as error:
    GroupAverager([device], tree).average(tree, members)
  assert str(error.value) == message


def test_unsorted_members():
  device = require_devices(1)[0]
  with pytest.raises(ConfigError, match=r'^group members \[1, 0\] must be distinct .* '
                                        'increasing order$'):
    GroupAverager([device], _tree(device)).check_members((1, 0))


def test_tree_must_match_template():
  device = require_devices(1)[0]
  averager = GroupAverager([device], _tree(device))
  with pytest.raises(ConfigError, match=r"^leaf \['w'\] is float32\[3, 2\] but the template has "
                                        r'float32\[2, 3\]$'):
    averager.average({'w': jnp.ones((3, 2)), 'b': jnp.zeros((4,), jnp.bfloat16)}, [0])
  with pytest.raises(ConfigError, match=r'^tree structure .* does not match the template'):
    averager.average({'w': jnp.ones((2, 3))}, [0])


@pytest.mark.parametrize('dtype', [np.int32, np.float64, np.bool_])
def test_refuses_leaves_that_cannot_be_averaged(dtype):
  device = require_devices(1)[0]
  template = {'ok': jax.ShapeDtypeStruct((2,), jnp.float32), 'bad': np.zeros((3,), dtype)}
  with pytest.raises(ConfigError) as error:
    GroupAverager([device], template)
  assert str(error.value) == (f"cannot average leaf ['bad'] of dtype {np.dtype(dtype)}: only "
                              'floating leaves of at most 32 bits (float32, bfloat16, float16) '
                              'are averaged, in float32')


def test_local_devices_must_be_distinct_and_present():
  devices = require_devices(2)
  template = {'w': jax.ShapeDtypeStruct((2,), jnp.float32)}
  for bad in ([], [devices[0], devices[0]]):
    with pytest.raises(ConfigError, match=r'^local devices .* must be distinct devices of this '
                                          r'process 0 \(its devices: \[0, 1'):
      GroupAverager(bad, template)
  assert GroupAverager(devices, template).local_mesh.devices.tolist() == devices


def test_consensus_distance():
  rng = np.random.default_rng(0)
  trees = [{'a': rng.normal(size=(3, 2)), 'b': {'c': rng.normal(size=4), 'd': rng.normal()}}
           for _ in range(5)]
  vectors = np.stack([np.concatenate([t['a'].ravel(), t['b']['c'], [t['b']['d']]])
                      for t in trees])
  mean = vectors.mean(axis=0)
  want = np.mean([np.sqrt(np.sum((v - mean) ** 2)) for v in vectors])
  assert consensus_distance(trees) == pytest.approx(want, rel=1e-12)
  assert consensus_distance([trees[0]] * 3) == 0.0
  assert consensus_distance([trees[0]]) == 0.0
  # Two replicas 2 apart in each of two coordinates: each is √2 from the mean.
  assert consensus_distance([{'w': np.zeros(2, np.float32)}, {'w': np.full(2, 2.0)}]) == (
      pytest.approx(np.sqrt(2.0)))
  # jax arrays (e.g. `jax.device_get` of averaged trees) work too.
  assert consensus_distance([{'w': jnp.ones(3)}, {'w': jnp.zeros(3)}]) == pytest.approx(
      np.sqrt(3 * 0.25))


def test_consensus_distance_errors():
  with pytest.raises(ConfigError, match=r'^consensus distance needs at least one replica$'):
    consensus_distance([])
  with pytest.raises(ConfigError, match=r'^replica 1 has tree structure .* replica 0 has'):
    consensus_distance([{'a': np.zeros(2)}, {'b': np.zeros(2)}])
  with pytest.raises(ConfigError, match=r'^replicas have different parameter counts: \[2, 3\]$'):
    consensus_distance([{'a': np.zeros(2)}, {'a': np.zeros(3)}])
