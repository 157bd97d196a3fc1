"""Workers of different device counts (2, 1 and 1) train the same SGD as one device.

The launched cases (`tests/workers/train_unequal.py`, one launch for the library cases and one
of ``experiments/train.py``, always with a timeout) run uniform shares, which are equal per
device, and LB-BSP on hosts of known speed; the in-process cases check the pieces: every
worker's mesh shape, the one-line error for a layout that splits parameters inside a worker,
and a host of k devices running k times as fast per row.
"""

from __future__ import annotations

import io
import json
import pathlib
import sys

import jax
import numpy as np
import pytest

from hetjax import ConfigError, bench, models
from hetjax.emulation import KnownSpeedHost, StaticTrace
from hetjax.planner import ClusterSpec
from hetjax.runtime import launch_local
from hetjax.sharding import make_mesh
from hetjax.train import Strategy
from hetjax.train._worker_mesh import local_shapes, replicated_layout
from tests.conftest import require_devices
from tests.test_workers import _reference
from tests.workers.common import LBBSP_STEPS, MODELS, OPTIMIZER, STEPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 180
DEVICES = (2, 1, 1)
BATCH = MODELS['mlp'][1]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Every worker's record of one launch (see `tests/workers/train_unequal.py`)."""
  out = tmp_path_factory.mktemp('unequal')
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'train_unequal.py'), str(out)]
  result = launch_local(command, workers=len(DEVICES), devices_per_worker=DEVICES,
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  return [json.loads((out / f'w{w}.json').read_text()) for w in range(len(DEVICES))]


@pytest.fixture(scope='module')
def reference():
  return _reference('mlp')


@pytest.fixture(scope='module')
def lbbsp_reference():
  return _reference('mlp', LBBSP_STEPS)


def _assert_same_sgd(run, reference):
  ref_losses, ref_params = reference
  np.testing.assert_allclose(run['losses'], ref_losses, rtol=1e-5)
  for got, want in zip(run['params'], jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-6)
  assert run['same_on_devices']  # a 2-device worker holds one copy twice


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_every_worker_sees_every_workers_devices_and_degree(runs):
  for run in runs:
    assert run['counts'] == [2, 1, 1] and run['degrees'] == [2, 1, 1]
    assert run['share_degree'] == 2  # the least common multiple: what a bucket is made of


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_uniform_shares_are_equal_per_device_and_train_like_one_device(runs, reference):
  for run in runs:
    assert run['uniform']['shares'] == [[32, 16, 16]] * STEPS
    _assert_same_sgd(run['uniform'], reference)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_lbbsp_moves_rows_off_the_slow_host_and_trains_like_one_device(runs, lbbsp_reference):
  for run in runs:
    shares = run['lbbsp']['shares']
    assert shares == runs[0]['lbbsp']['shares']  # one decision, taken on every worker
    assert shares[0] == [32, 16, 16]  # its first decision: equal rows per device
    assert all(sum(s) == BATCH and all(x % 4 == 0 for x in s) for s in shares)
    assert shares[-1][2] < 16  # the 3x slow host gave rows away
    _assert_same_sgd(run['lbbsp'], lbbsp_reference)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_a_layout_splitting_parameters_is_refused_in_one_line_on_every_worker(runs):
  errors = {run['fsdp_error'] for run in runs}
  assert len(errors) == 1
  error = errors.pop()
  assert error.startswith('workers of different device counts (2, 1, 1) need every parameter '
                          "replicated inside a worker, but strategy fsdp on worker 0's 2x1 mesh "
                          'splits ') and error.endswith('use strategy data_parallel')
  assert '\n' not in error


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_train_py_runs_lbbsp_on_workers_of_2_1_and_1_devices(tmp_path):
  steps = LBBSP_STEPS
  command = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp',
             '--strategy=data_parallel', '--mesh=2x1', '--policy=lbbsp', f'--steps={steps}',
             f'--workdir={tmp_path}', '--bucket=4', '--set', 'global_batch=64', '--set',
             'host_row_s=2e-3', '--set', 'log_every=3', '--nocompilation_cache']
  result = launch_local(command, workers=3, devices_per_worker=DEVICES, slowdown='static:1,1,3',
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['final_step'] == steps and summary['checkpoint_steps'] == [steps]
  assert summary['first_shares'] == [32, 16, 16]  # per worker, equal rows per device
  assert len(summary['last_shares']) == 3 and summary['last_shares'][2] < 16
  cluster = json.loads((tmp_path / 'cluster.json').read_text())['workers']
  assert [len(w['devices']) for w in cluster] == list(DEVICES)
  # What the run wrote is what the planner reads: one cluster description.
  assert ClusterSpec.load(tmp_path / 'cluster.json').counts == tuple(DEVICES)
  # Tokens need one program shape on every worker: a one-line refusal, exit 2.
  out = io.StringIO()
  tokens = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp',
            '--strategy=data_parallel', '--mesh=2x1', '--mode=tokens', '--steps=1',
            f'--workdir={tmp_path / "tokens"}', '--set', 'global_batch=64']
  result = launch_local(tokens, workers=3, devices_per_worker=DEVICES, timeout=LAUNCH_TIMEOUT,
                        init_timeout=60, stdout=out)
  assert result.returncode == 2, (result, out.getvalue())
  assert 'mode tokens needs workers of equal device counts' in out.getvalue()


def test_worker_meshes_keep_the_model_size_and_put_the_rest_on_data():
  assert local_shapes(None, (2, 1, 1)) == ((2, 1), (1, 1), (1, 1))
  assert local_shapes((2, 1), (2, 1, 1)) == ((2, 1), (1, 1), (1, 1))
  assert local_shapes((2, 2), (4, 2)) == ((2, 2), (1, 2))
  assert local_shapes((4, 2), (8, 8)) == ((4, 2), (4, 2))  # equal workers: the shape as given
  with pytest.raises(ConfigError, match=r'^mesh 1x2: worker 1 has 1 device\(s\), not a multiple '
                                        r'of the model size 2 \(workers of different'):
    local_shapes((1, 2), (2, 1, 1))


@pytest.mark.parametrize('strategy, shapes, split', [
    (Strategy.FSDP, [(2, 1), (1, 1), (1, 1)], "worker 0's 2x1 mesh splits 'down/bias' over data"),
    (Strategy.HYBRID, [(1, 1), (1, 2)], "worker 1's 1x2 mesh splits 'down/kernel' over model"),
    (Strategy.DATA_PARALLEL, [(2, 1), (1, 1), (1, 1)], None),
    (Strategy.HYBRID, [(2, 1), (1, 1), (1, 1)], None),  # model size 1: nothing split
    (Strategy.FSDP, [(1, 1), (1, 1)], None),  # one device each
])
def test_unequal_workers_need_parameters_replicated_inside_each(strategy, shapes, split):
  task = models.make_task('mlp', **MODELS['mlp'][0])
  flat = make_mesh((len(shapes),), ('devices',), devices=require_devices(len(shapes)))
  args = (task, OPTIMIZER, flat, strategy.rules(), shapes, f'strategy {strategy.value}')
  if split is None:
    layout = replicated_layout(*args)
    assert all(all(e is None for e in s.spec) for s in jax.tree.leaves(layout.shardings))
    return
  with pytest.raises(ConfigError, match=f"strategy {strategy.value} on {split}: use strategy "
                                        'data_parallel$'):
    replicated_layout(*args)


def test_a_host_of_k_devices_is_k_times_as_fast_per_row():
  trace = StaticTrace((1.0, 1.0, 3.0))
  one, two = (KnownSpeedHost(trace, w, row_s=1e-3, fixed_s=2e-3, speed=s) for w, s in
              ((1, 1), (0, 2)))
  assert two.target_s(0, 32) == one.target_s(0, 16) == 2e-3 + 16e-3  # fixed_s is per step
  slow = KnownSpeedHost(trace, 2, row_s=1e-3, speed=1)
  assert slow.target_s(0, 16) == pytest.approx(3 * 16e-3)
  for bad in (0, -1, float('inf'), True):
    with pytest.raises(ConfigError, match='speed must be a finite number > 0'):
      KnownSpeedHost(trace, 0, row_s=1e-3, speed=bad)


def test_default_bucket_of_unequal_workers_is_a_sixteenth_of_the_smallest_share():
  assert bench.default_bucket(256, 3, 2, devices=(2, 1, 1)) == 4  # shares 128, 64, 64
  assert bench.default_bucket(64, 3, 2, devices=(2, 1, 1)) == 2  # at least the degree
  assert bench.default_bucket(256, 2, 4, devices=(4, 4)) == 8  # equal: X / (16 n)
