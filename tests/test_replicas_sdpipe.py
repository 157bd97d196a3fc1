"""Pipeline replicas on real workers under the group scheduler (`ReplicaDriver`, `SyncService`).

Each case runs on the fewest local workers of 2 devices that show its behaviour
(`tests/workers/replicas_sdpipe.py`), always with a timeout: each worker is one replica, a
2-stage MLP pipeline, and worker 0 also runs the scheduler in a thread over the coordination
service. Every worker launch costs seconds of start-up and compiles on a 2-core machine, so the
cases of one worker count share one launch (a module fixture): its workers run the cases' runs
one after the other, each from the same initial parameters with its own scheduler.

- All-reduce with SGD is exact (2 workers): averaging the replicas' parameters after each step
  is one SGD step on the mean gradient of the replicas' batches, so the replicas must equal the
  plain model trained on the concatenated batches (tolerances of
  tests/test_pipeline_multiprocess.py); likewise the overlapped all-reduce, one step late.
- SDPipe with a persistent straggler (3 workers): every member of a group got the same group,
  the two fast replicas group without the straggler, and the straggler is not left alone.
- A replica that goes silent is dropped after the time-out (reported and logged) and the others
  finish without it (3 workers: one drops, two go on grouping).
"""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

from hetjax import models
from hetjax.runtime import launch_local
from tests.conftest import require_devices
from tests.workers.replicas_sdpipe import BATCH, LR, MODEL, TIMEOUT_S

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 120

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(LAUNCH_TIMEOUT + 60)]


def _launch(tmp_path, workers: int, *runs: str) -> list[list[dict]]:
  """One launch of ``workers`` replicas running ``runs`` in turn (``POLICY,STEPS,STRAGGLER[,
  SILENT,SILENT_S]``); per run, every worker's outputs. The workers' output is in log.txt."""
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'replicas_sdpipe.py'),
             str(tmp_path), *runs]
  with open(tmp_path / 'log.txt', 'w') as log:
    result = launch_local(command, workers=workers, devices_per_worker=2,
                          timeout=LAUNCH_TIMEOUT, init_timeout=60, stdout=log)
  assert result.returncode == 0, (result, (tmp_path / 'log.txt').read_text()[-3000:])
  outs = []
  for i in range(len(runs)):
    outs.append([])
    for w in range(workers):
      with np.load(tmp_path / str(i) / f'w{w}.npz') as arrays:
        outs[i].append(dict(arrays))
  return outs


@pytest.fixture(scope='module')
def two_workers(tmp_path_factory):
  """2 replicas: all-reduce for 2 steps (the second starts from the first one's average), then
  the overlapped all-reduce for 3 (step 2 is neither the first nor the last)."""
  return _launch(tmp_path_factory.mktemp('two'), 2, 'all-reduce,2,none',
                 'all-reduce+overlap,3,none')


@pytest.fixture(scope='module')
def three_workers(tmp_path_factory):
  """3 replicas: SDPipe for 9 steps with worker 2 a persistent 4x straggler; then all-reduce
  for 4 steps with worker 2 silent after its step 2 (two steps with it, two without). Their
  outputs, and the launch log (the workers' lines, prefixed [wN])."""
  tmp = tmp_path_factory.mktemp('three')
  outs = _launch(tmp, 3, 'sdpipe,9,persistent:2:4', f'all-reduce,4,none,2,{3 * TIMEOUT_S}')
  return outs, (tmp / 'log.txt').read_text()


def _params(out: dict, prefix: str) -> dict[str, np.ndarray]:
  return {k.removeprefix(prefix + '/'): v for k, v in out.items() if k.startswith(prefix + '/')}


def _groups(outs: list[dict]) -> dict[int, set]:
  """seq -> the distinct member tuples its members recorded (one each when consistent)."""
  seen: dict[int, set] = {}
  for w, out in enumerate(outs):
    for step in out['steps']:
      members = tuple(int(m) for m in out[f'members/{step}'])
      assert w in members
      seen.setdefault(int(out[f'seq/{step}']), set()).add(members)
  return seen


def _plain():
  """``(task, initial params, jitted value_and_grad of the mean loss)`` of the plain model."""
  task = models.make_task('mlp', **MODEL)
  with jax.default_device(require_devices(1)[0]), nnx.use_eager_sharding(False):
    graphdef, state = nnx.split(nnx.jit(lambda: task.make_model(nnx.Rngs(0)))())

  def mean_loss(p, batch):
    return jnp.mean(task.loss(nnx.merge(graphdef, p), batch))

  return task, nnx.to_pure_dict(state), jax.jit(jax.value_and_grad(mean_loss))


def _flat(tree) -> dict[str, np.ndarray]:
  return {'/'.join(map(str, k)): np.asarray(v)
          for k, v in traverse_util.flatten_dict(tree).items()}


def test_all_reduce_replicas_equal_sgd_on_the_union_of_their_batches(two_workers):
  workers, steps = 2, 2  # the second step starts from the first one's average
  outs = two_workers[0]
  task, params, value_and_grad = _plain()
  losses = np.zeros((workers, steps))
  for t in range(steps):  # replica r's step t trains on stream position t × workers + r
    grads = []
    for r in range(workers):
      loss, g = value_and_grad(params, task.data.global_batch(0, t * workers + r, BATCH))
      losses[r, t] = float(loss)
      grads.append(g)
    mean = jax.tree.map(lambda *gs: sum(gs) / workers, *grads)
    params = jax.tree.map(lambda p, g: p - LR * g, params, mean)
  expected = _flat(params)

  for w, out in enumerate(outs):
    np.testing.assert_allclose(out['losses'], losses[w], rtol=1e-5, err_msg=f'replica {w}')
    got = _params(out, 'params')
    assert got.keys() == expected.keys()
    for path in expected:
      np.testing.assert_allclose(got[path], expected[path], rtol=1e-5, atol=1e-6,
                                 err_msg=f'replica {w} {path}')
    assert all(tuple(out[f'members/{s}']) == tuple(range(workers)) for s in out['steps'])
  report = json.loads(str(outs[0]['report']))
  assert (report['groups'], report['global_groups'], report['mean_group']) == (steps, steps,
                                                                                 workers)
  assert report['drops'] == [] and not any(report['ignored'].values())


def test_overlapped_all_reduce_averages_one_step_late(two_workers):
  """With ``overlap``, replica i's step k starts from its own c_{k-1,i} and ends at
  c_{k,i} = mean_j c_{k-1,j} − lr · g_i(c_{k-1,i}); after the last step each takes the mean."""
  workers, steps = 2, 3  # step 2 is neither the first nor the last
  outs = two_workers[1]
  task, params, value_and_grad = _plain()
  replicas = [params] * workers
  losses = np.zeros((workers, steps))
  for t in range(steps):
    mean = jax.tree.map(lambda *ps: sum(ps) / workers, *replicas)
    moved = []
    for r in range(workers):
      loss, g = value_and_grad(replicas[r], task.data.global_batch(0, t * workers + r, BATCH))
      losses[r, t] = float(loss)
      moved.append(jax.tree.map(lambda m, g: m - LR * g, mean, g))
    replicas = moved
  expected = _flat(jax.tree.map(lambda *ps: sum(ps) / workers, *replicas))
  for w, out in enumerate(outs):
    np.testing.assert_allclose(out['losses'], losses[w], rtol=1e-5, err_msg=f'replica {w}')
    got = _params(out, 'params')
    for path in expected:
      np.testing.assert_allclose(got[path], expected[path], rtol=1e-5, atol=1e-6,
                                 err_msg=f'replica {w} {path}')
    # Step 1 applies no group yet; steps 2 and 3 apply the all-reduce of steps 1 and 2.
    assert [tuple(out[f'members/{s}']) for s in out['steps']] == [(), (0, 1), (0, 1)]
  assert len({float(out['losses'][1]) for out in outs}) == workers  # replicas differ in between


def test_sdpipe_groups_are_consistent_and_the_straggler_is_not_waited_for(three_workers):
  # Two fast replicas group without the straggler. Each fast step adds at least 2 updates to the
  # epoch, so by their 9th step it holds B = 16 (the default `GroupRules`) and the SSP rule must
  # reconnect the straggler, however the timing goes.
  workers, steps, straggler = 3, 9, 2  # the fixture's first run: sdpipe,9,persistent:2:4
  outs = three_workers[0][0]
  assert len(outs) == workers
  for w, out in enumerate(outs):
    assert list(out['steps']) == list(range(1, steps + 1))
    assert np.all(np.isfinite(out['losses']))
    init, final = _params(out, 'init'), _params(out, 'params')
    assert any(not np.array_equal(init[p], final[p]) for p in init), f'replica {w} never moved'
  groups = _groups(outs)
  assert all(len(variants) == 1 for variants in groups.values()), groups
  sizes = [len(next(iter(v))) for v in groups.values()]
  report = json.loads(str(outs[0]['report']))
  assert report['groups'] == len(groups) and report['drops'] == []
  assert report['mean_group'] == pytest.approx(np.mean(sizes))
  # The fast replicas group among themselves without the 4x straggler, and the straggler is
  # not left alone for good (the SSP rule makes groups reconnect it).
  members = [next(iter(v)) for v in groups.values()]
  assert any(straggler not in m and len(m) > 1 for m in members), groups
  assert any(straggler in m and len(m) > 1 for m in members), groups


def test_a_silent_replica_is_dropped_and_the_others_finish(three_workers):
  workers, steps, silent = 3, 4, 2  # two steps with it, two without: the fixture's second run
  runs, logged = three_workers  # the launcher relays the workers' output, prefixed [wN]
  outs = runs[1]
  assert len(outs) == workers
  report = json.loads(str(outs[0]['report']))
  assert [w for w, _ in report['drops']] == [silent]
  assert f'[w0] run: worker {silent} dropped from grouping' in logged
  assert list(outs[silent]['steps']) == [1, 2]
  for w in (0, 1):
    out = outs[w]
    assert list(out['steps']) == list(range(1, steps + 1))
    members = [tuple(int(m) for m in out[f'members/{s}']) for s in out['steps']]
    assert members[:2] == [(0, 1, 2)] * 2 and members[2:] == [(0, 1)] * (steps - 2)
  # The two that went on averaged every step: they end equal.
  for path, value in _params(outs[0], 'params').items():
    np.testing.assert_allclose(_params(outs[1], 'params')[path], value, rtol=1e-6)
