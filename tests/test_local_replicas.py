"""Local SGD (DiLoCo) over mode pipeline's replicas: ``local.inner_steps`` with
``pipeline.sync=periodic-average`` (`hetjax.replicas.ReplicaDriver`'s ``outer``).

One launch of 2 replicas (each 2 devices) runs the runs (`tests/workers/local_replicas.py`, with
a timeout):

- Outer SGD at rate 1 is periodic averaging: the same losses and parameters as
  ``pipeline.sync=periodic-average`` (everyone every 10 steps) under local SGD of 10 steps a
  round.
- The Nesterov outer step: its state is in each replica's checkpoint at a round's end, and a run
  stopped there and resumed ends where a run in one go ends.
- What does not go with it is refused in one line naming the fields, before anything is built.
"""

import json
import pathlib
import re
import sys

import numpy as np
import pytest

from hetjax import ConfigError, run, runtime
from hetjax.replicas import ReplicaCheckpointer, SyncPolicy
from hetjax.run import _modes
from hetjax.runtime import launch_local

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The worker's run directories (`tests/workers/local_replicas.py`)."""
  out = tmp_path_factory.mktemp('local-replicas')
  with open(out / 'log.txt', 'w') as log:
    result = launch_local([sys.executable, str(ROOT / 'tests' / 'workers' / 'local_replicas.py'),
                           str(out)], workers=2, devices_per_worker=2, timeout=LAUNCH_TIMEOUT,
                          init_timeout=60, stdout=log)
  assert result.returncode == 0, (result, (out / 'log.txt').read_text()[-3000:])
  return out


def _losses(workdir: pathlib.Path) -> list[float]:
  """Worker 0's loss of each step, from metrics.jsonl."""
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [r['loss'] for r in rows if 'loss' in r]


def _saved(workdir: pathlib.Path, worker: int, step: int) -> tuple[list[np.ndarray], dict]:
  """Replica ``worker``'s checkpoint ``step``: its arrays in tree order, and its record."""
  directory = workdir / 'checkpoints' / f'replica-{worker}'
  with np.load(directory / str(step) / 'state' / 'arrays.npz') as arrays:
    leaves = [arrays[k] for k in sorted(arrays.files, key=lambda k: int(k.rpartition('_')[2]))]
  return leaves, ReplicaCheckpointer(directory).read_meta(step)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_outer_sgd_at_one_is_periodic_averaging(runs):
  assert SyncPolicy('periodic-average', 2).engine().every == 10  # the run 'average' syncs on
  want, got = _losses(runs / 'average'), _losses(runs / 'sgd1')
  assert len(want) == len(got) == 20
  # θ_start − (θ_start − θ̄) is θ̄ but where the subtraction rounds: at most an ulp of a
  # parameter (|θ| < 1: 6e-8) at steps 10 and 20, which 10 Adam steps between them carry on,
  # not grow by orders of magnitude: within 1e-7 + 1e-6 |θ|.
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for worker in (0, 1):
    (a, _), (b, meta) = _saved(runs / 'average', worker, 20), _saved(runs / 'sgd1', worker, 20)
    assert not any(path.startswith('outer/') for path in meta['checksums'])  # SGD has no state
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
      np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-7)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_nesterov_rounds_checkpoint_their_outer_state_and_resume_exactly(runs):
  whole, resumed = _losses(runs / 'whole'), _losses(runs / 'resumed')
  assert len(whole) == len(resumed) == 8
  assert resumed[-1] == whole[-1]
  summary = json.loads((runs / 'resumed' / 'summary.json').read_text())
  assert summary['final_step'] == 8 and summary['checkpoint_steps'] == [4, 8]
  for worker in (0, 1):
    half, meta = _saved(runs / 'half', worker, 4)
    momentum = [p for p in meta['checksums'] if p.startswith('outer/')]
    assert momentum and all('/trace/' in p for p in momentum), momentum  # per stage, Nesterov's
    assert np.abs(half[-1]).max() > 0  # the last leaf: stage 1's momentum, after one round
    a, _ = _saved(runs / 'whole', worker, 8)
    b, _ = _saved(runs / 'resumed', worker, 8)
    for x, y in zip(a, b, strict=True):
      np.testing.assert_array_equal(y, x)
  # The replicas agree after an outer step, its momentum included.
  np.testing.assert_array_equal(_saved(runs / 'whole', 0, 8)[0][-1],
                                _saved(runs / 'whole', 1, 8)[0][-1])


@pytest.mark.parametrize('sets, message', [
    (['local.inner_steps=4'],
     "local.inner_steps (4) syncs the replicas on pipeline.sync=periodic-average (everyone every "
     "4 steps, an outer step from the mean), not pipeline.sync 'sdpipe'"),
    (['local.inner_steps=4', 'pipeline.sync=random-pairs'], "not pipeline.sync 'random-pairs'"),
    (['local.inner_steps=4', 'pipeline.sync=periodic-average', 'pipeline.sync_overlap=true'],
     'local.inner_steps and pipeline.sync_overlap do not go together'),
    (['local.inner_steps=4', 'pipeline.sync=periodic-average', 'local.cutoff=2'],
     'local.cutoff (2.0) cuts a worker'),
    (['local.inner_steps=4', 'pipeline.sync=periodic-average', 'local.exchange=int8'],
     "local.exchange 'int8' packs mode shares' outer exchange"),
    (['local.inner_steps=3', 'pipeline.sync=periodic-average', 'checkpoint.every=6'],
     'optimizer.steps (8) and checkpoint.every (6) must be multiples of local.inner_steps (3)'),
])
def test_what_does_not_go_with_local_replicas_is_refused_in_one_line(sets, message):
  config = run.override(run.load_config('mlp'), ['mode=pipeline', 'optimizer.steps=8', *sets])
  with pytest.raises(ConfigError, match=re.escape(message)) as err:
    _modes.build(config, runtime.WorkerContext(0, 2, None), None)
  assert '\n' not in str(err.value)


def test_local_replicas_need_several_workers():
  config = run.override(run.load_config('mlp'), ['mode=pipeline', 'local.inner_steps=4',
                                                 'pipeline.sync=periodic-average'])
  with pytest.raises(ConfigError, match=re.escape('mode pipeline takes no local.inner_steps, '
                                                  'pipeline.sync on one worker')):
    _modes.build(config, runtime.WorkerContext(0, 1, None), None)
