"""PipelineTrainer across processes: stages on 2 or 4 local workers give the unpipelined gradients.

Each case launches real worker processes (`tests/workers/pipeline_stages.py`) through
`hetjax.runtime.launch_local`, always with a timeout; every worker writes its own stages'
gradients (and the loss, on the last stage's worker) to ``tmp_path``. The reference is
`jax.value_and_grad` of the plain model's mean loss over the global batch on one device, with
the tolerances of tests/test_pipeline_executor.py.
"""

from __future__ import annotations

import functools
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx, traverse_util

from hetjax import models
from hetjax.runtime import launch_local
from tests.conftest import require_devices
from tests.workers.pipeline_stages import BATCH, LR, SCHEDULES, SMALL

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 120
# Each launch costs ~20 s of start-up and compiles on 2 cores, so two cases cover it all.
CASES = [  # workers, devices per worker, stages, micro-batches, SGD steps
    # Two stages per process, each on two devices (data-parallel inside): in-process and
    # cross-process transfers, more micro-batches than a process has stages, two SGD steps.
    (2, 4, 4, 4, 2),
    # Four processes, one stage each: every transfer has two bystanders; two SGD steps.
    (4, 1, 4, 4, 2),
]


@pytest.fixture(scope='module')
def reference():
  return _reference()


@functools.cache  # once per test process, even if pytest-xdist tears the module fixture down
def _reference():
  """``(params, losses, grads of step 0, params after two SGD steps)`` of the plain model."""
  task = models.make_task('transformer', **SMALL)
  with jax.default_device(require_devices(1)[0]), nnx.use_eager_sharding(False):
    graphdef, state = nnx.split(nnx.jit(lambda: task.make_model(nnx.Rngs(0)))())
  params = nnx.to_pure_dict(state)

  def mean_loss(p, batch):
    return jnp.mean(task.loss(nnx.merge(graphdef, p), batch))

  value_and_grad = jax.jit(jax.value_and_grad(mean_loss))
  sgd = optax.sgd(LR)
  update = jax.jit(lambda p, g: optax.apply_updates(p, sgd.update(g, sgd.init(p), p)[0]))
  losses, step_grads, plain = [], [], params
  for step in range(2):
    loss, grads = value_and_grad(plain, task.data.global_batch(0, step, BATCH))
    losses.append(float(loss))
    step_grads.append(grads)
    plain = update(plain, grads)
  return _flat(params), losses, _flat(step_grads[0]), _flat(plain)


def _flat(tree) -> dict[str, np.ndarray]:
  return {'/'.join(map(str, k)): np.asarray(v)
          for k, v in traverse_util.flatten_dict(tree).items()}


def _read(tmp_path, workers: int) -> list[dict[str, np.ndarray]]:
  outs = []
  for w in range(workers):
    with np.load(tmp_path / f'w{w}.npz') as arrays:
      outs.append(dict(arrays))
  return outs


def _gather(outs, prefix: str) -> dict[str, np.ndarray]:
  """Every worker's ``prefix/<path>`` arrays by path; each path from exactly one worker."""
  got: dict[str, np.ndarray] = {}
  for out in outs:
    for key, value in out.items():
      if key.startswith(prefix + '/'):
        path = key.removeprefix(prefix + '/')
        assert path not in got, f'{path} written by two workers'
        got[path] = value
  return got


def _max_diff(got: dict, expected: dict) -> float:
  assert got.keys() == expected.keys()
  for path in expected:
    np.testing.assert_allclose(got[path], expected[path], rtol=1e-5, atol=1e-6, err_msg=path)
  return max(float(np.max(np.abs(got[p] - expected[p]))) for p in expected)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
@pytest.mark.parametrize('workers, per_worker, stages, micro, sgd_steps', CASES,
                         ids=[f'{c[0]}w-{c[1]}d-{c[2]}s-{c[3]}m' for c in CASES])
def test_stages_across_processes_equal_unpipelined(tmp_path, reference, workers, per_worker,
                                                   stages, micro, sgd_steps):
  init, ref_losses, ref_grads, ref_after = reference
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'pipeline_stages.py'),
             str(tmp_path), str(stages), str(micro), str(sgd_steps)]
  result = launch_local(command, workers=workers, devices_per_worker=per_worker,
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  outs = _read(tmp_path, workers)

  # Stages sit on their devices' processes; only the last stage's process reports the loss.
  owner = [s * workers // stages for s in range(stages)]
  for w, out in enumerate(outs):
    assert list(out['stages']) == [s for s in range(stages) if owner[s] == w]
    assert str(out['straddle']) == ("stage 0 would span processes "
                                    f"{list(range(workers))}; a stage's devices must belong to "
                                    'one process')
    assert any(k.startswith('loss/') for k in out) == (w == owner[-1])
  assert _max_diff(_gather(outs, 'init'), init) == 0.0  # each process initialised its own stages

  diffs = []
  for name in SCHEDULES:
    np.testing.assert_allclose(float(outs[owner[-1]][f'loss/{name}']), ref_losses[0], rtol=1e-6)
    diffs.append(_max_diff(_gather(outs, f'grads/{name}'), ref_grads))
  print(f'{workers} workers, {stages} stages, {micro} micro-batches: max |grad diff| '
        f'{max(diffs):.2e}')
  if sgd_steps:
    assert sgd_steps == len(ref_losses), 'the reference takes two steps'
    got = [float(outs[owner[-1]][f'sgd_loss/{step}']) for step in range(sgd_steps)]
    np.testing.assert_allclose(got, ref_losses[:sgd_steps], rtol=1e-6)
    print(f'  after {sgd_steps} SGD steps: max |param diff| '
          f'{_max_diff(_gather(outs, "params"), ref_after):.2e}')
