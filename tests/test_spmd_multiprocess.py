"""One jitted step over the devices of several launched workers trains like one device.

`Trainer` on `make_mesh` over every worker's devices (the way MaxText runs multi-host jobs):
FSDP, whose parameters are split across processes, and a hybrid data x model mesh whose
'model' axis spans two processes. Losses over 5 steps, read on every worker, and the final
parameters must agree with the same Trainer on one device to float32 reduction-order noise
(the tolerances of tests/test_strategies.py); the state saved by `Checkpointer` restores onto
the same global layout with the same values. Each case launches real local workers (gloo
collectives over loopback) through `hetjax.runtime.launch_local`, always with a timeout.
"""

import json
import pathlib
import sys

import jax
import numpy as np
import pytest

from hetjax import ConfigError, models
from hetjax.runtime import launch_local
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Trainer, training_steps
from tests.conftest import require_devices
from tests.workers.common import MODELS, OPTIMIZER, STEPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 180


def _reference():
  kwargs, batch = MODELS['mlp']
  mesh = make_mesh((1, 1), devices=require_devices(1))
  trainer = Trainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch, mesh,
                    Strategy.DATA_PARALLEL.rules())
  infos = list(training_steps(trainer, trainer.init_state(), STEPS))
  return [float(i.stats.loss) for i in infos], jax.device_get(infos[-1].state.params)


CASES = [  # strategy, workers, devices a worker, mesh, the process of every mesh device
    # 'data' spans the processes, 'model' stays inside one; parameters split over both.
    ('fsdp', 2, 4, '4x2', [[0, 0], [0, 0], [1, 1], [1, 1]]),
    # 'model' spans two processes: each batch row is held by two workers, each weight by two.
    ('hybrid', 4, 2, '2x4', [[0, 0, 1, 1], [2, 2, 3, 3]]),
]


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
@pytest.mark.parametrize('strategy, workers, devices, mesh, processes', CASES,
                         ids=[f'{c[0]}-{c[1]}w-{c[3]}' for c in CASES])
def test_global_mesh_over_workers_matches_one_device(tmp_path, strategy, workers, devices, mesh,
                                                     processes):
  ref_losses, ref_params = _reference()
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'train_spmd.py'), str(tmp_path),
             strategy, mesh]
  result = launch_local(command, workers=workers, devices_per_worker=devices,
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  got = [json.loads((tmp_path / f'worker{w}.json').read_text()) for w in range(workers)]
  for worker in got:
    assert worker['mesh_processes'] == processes
    assert worker['losses'] == got[0]['losses']  # a replicated scalar, read on every worker
    np.testing.assert_allclose(worker['losses'], ref_losses, rtol=1e-5, atol=0)
    for got_leaf, ref_leaf in zip(worker['params'], jax.tree.leaves(ref_params), strict=True):
      np.testing.assert_allclose(np.asarray(got_leaf), ref_leaf, rtol=1e-4, atol=1e-6)
    # Each weight matrix lives on half the job's processes' devices, not on every one.
    assert sum(share == 0.5 for share in worker['held']) >= 3, worker['held']
    assert set(worker['held']) <= {0.5, 1.0}, worker['held']
    assert worker['restored_step'] == STEPS
    assert worker['restored_equal'] and worker['restored_shardings']


class _Device:
  """Stands for a CPU device of a worker: what `make_mesh` reads before building a mesh."""

  platform = 'cpu'

  def __init__(self, process_index):
    self.process_index = process_index


def test_a_global_mesh_of_the_wrong_size_says_how_to_launch():
  devices = [_Device(p) for p in (0, 0, 1, 1)]
  with pytest.raises(ConfigError, match=r'^mesh 4x2 needs 8 devices but 4 cpu device\(s\) are '
                     r'available \(over 2 workers: python -m hetjax.launch --workers 2 '
                     r'--devices-per-worker 4\)$'):
    make_mesh((4, 2), devices=devices)
  with pytest.raises(ConfigError, match=r'over 2 workers, 3 does not divide among them\)$'):
    make_mesh((3, 1), devices=devices)
