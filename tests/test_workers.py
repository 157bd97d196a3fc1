"""Multi-worker data parallelism reproduces the single-process run, for any shares.

Each case launches real local worker processes (gloo collectives over loopback) through
`hetjax.runtime.launch_local`, always with a timeout.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from hetjax import models
from hetjax import report as report_lib
from hetjax.runtime import launch_local
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Trainer, training_steps
from tests.conftest import require_devices
from tests.workers.common import MODELS, OPTIMIZER, STEPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 180


def _reference(name, steps=STEPS):
  kwargs, batch = MODELS[name]
  mesh = make_mesh((1, 1), devices=require_devices(1))
  trainer = Trainer(models.make_task(name, **kwargs), OPTIMIZER, batch, mesh,
                    Strategy.DATA_PARALLEL.rules())
  infos = list(training_steps(trainer, trainer.init_state(), steps))
  return [float(i.metrics['loss']) for i in infos], jax.device_get(infos[-1].state.params)


def _launch(tmp_path, name, workers, local_shape, schedule, strategy, bucket=None,
            accumulate=1):
  out = tmp_path / 'out.json'
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'train_shares.py'), str(out), name,
             'x'.join(map(str, local_shape)), json.dumps(schedule), strategy, str(bucket or 0),
             str(accumulate)]
  devices = local_shape[0] * local_shape[1]
  result = launch_local(command, workers=workers, devices_per_worker=devices,
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  return json.loads(out.read_text())


def _random_schedule(workers, batch, seed, bucket=4):
  """LB-BSP-like shares: random weights, bucketed, every worker at least one bucket."""
  from hetjax.core import ShareRules

  rng = np.random.default_rng(seed)
  rules = ShareRules(batch, workers, bucket)
  return [list(rules.from_weights(rng.uniform(0.1, 1.0, workers))) for _ in range(STEPS)]


CASES = [  # model, workers, local mesh, shares per step (cycled), strategy inside a worker, bucket,
  # gradient accumulation
    # Uniform (BSP), uneven, empty and whole-batch shares; two devices per worker.
    ('mlp', 4, (2, 1), [[16, 16, 16, 16], [2, 40, 0, 22], [64, 0, 0, 0], [10, 10, 30, 14]],
     'data_parallel', None, 1),
    # Tensor parallel inside each worker: split gradients take the unfused all-reduce path.
    ('wide_deep', 2, (1, 2), [[40, 24], [0, 64]], 'hybrid', None, 1),
    # Gradient accumulation with unequal shares: micro-batches of at most 11 rows, so the
    # workers run 4 and 3 of them, then 1 and 6 (padded rows weigh nothing).
    ('mlp', 2, (1, 1), [[40, 24], [8, 56]], 'data_parallel', None, 3),
    # Random bucketed share sequences, as a balancing policy would produce them, with piece
    # programs standing in for sizes still compiling in the background (2 workers: 4 were
    # covered by the first case, and each worker compiles its own sizes).
    ('mlp', 2, (1, 1), _random_schedule(2, 64, seed=8), 'data_parallel', 4, 1),
]


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
@pytest.mark.parametrize('name, workers, local_shape, schedule, strategy, bucket, accumulate',
                         CASES, ids=[f'{c[0]}-{c[1]}w-{c[2][0]}x{c[2][1]}-{c[4]}'
                                     + (f'-accumulate{c[6]}' if c[6] > 1 else '') for c in CASES])
def test_workers_match_single_process(tmp_path, name, workers, local_shape, schedule, strategy,
                                      bucket, accumulate):
  ref_losses, ref_params = _reference(name)
  got = _launch(tmp_path, name, workers, local_shape, schedule, strategy, bucket, accumulate)
  np.testing.assert_allclose(got['losses'], ref_losses, rtol=1e-5)
  for got_leaf, ref_leaf in zip(got['params'], jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(np.asarray(got_leaf), ref_leaf, rtol=1e-4, atol=1e-6)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize('worker, message', [
    (0, 'worker(s) 1 of 2 did not start within 5 s'),
    (1, 'worker 0 (the coordinator at 127.0.0.1:'),
])
def test_a_worker_that_never_starts_is_named_not_waited_for(tmp_path, worker, message):
  # One worker of a two-worker job starts; its peer never does.
  env = dict(os.environ, HETJAX_COORDINATOR=f'127.0.0.1:{_free_port()}', HETJAX_NUM_WORKERS='2',
             HETJAX_WORKER_ID=str(worker), HETJAX_INIT_TIMEOUT='5', JAX_NUM_CPU_DEVICES='1')
  start = time.monotonic()
  result = subprocess.run(
      [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp', '--mesh=1x1',
       f'--workdir={tmp_path}'], env=env, capture_output=True, text=True, timeout=50)
  assert result.returncode == 2, result.stderr[-2000:]
  lines = result.stderr.strip().splitlines()
  assert lines == [f'train.py: error: {message}'] or (
      len(lines) == 1 and lines[0].startswith(f'train.py: error: {message}')), lines
  assert time.monotonic() - start < 30


def _free_port():
  from hetjax.bench import find_free_ports
  return find_free_ports(1)[0]


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_dead_worker_ends_the_job_in_seconds(tmp_path):
  # Worker 1 dies (SIGKILL) in the middle of training; the others must not hang on it.
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'die_midway.py')]
  start = time.monotonic()
  result = launch_local(command, workers=3, timeout=80, init_timeout=30)
  elapsed = time.monotonic() - start
  assert result.failed_worker == 1 and 'SIGKILL' in result.cause, result
  assert result.returncode == 128 + 9
  assert elapsed < 60, elapsed


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_train_under_the_launcher_writes_telemetry_cluster_and_report(tmp_path):
  steps = 6
  command = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp', '--mesh=2x1',
             f'--steps={steps}', f'--workdir={tmp_path}', '--set', 'log_every=3',
             '--set', 'host_row_s=1e-3']
  result = launch_local(command, workers=2, devices_per_worker=2, slowdown='static:1,2',
                        timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  rows = [json.loads(line) for line in (tmp_path / 'telemetry.jsonl').read_text().splitlines()]
  assert [(r['step'], r['worker']) for r in rows] == [(s, w) for s in range(1, 7) for w in (0, 1)]
  late = [r for r in rows if r['step'] > 1]
  assert all(r['slowdown'] == (2.0 if r['worker'] == 1 else 1.0) for r in rows)
  # Hosts of known speed: 128 rows each at 1 ms per row take 128 ms on worker 0's host and 256 ms
  # on worker 1's (2x slow), whatever the compute took, unless it overran the target. The targets
  # sit well above the mlp's real compute (~30 ms for 128 rows, several times that when the suite
  # loads both cores), so the fast worker's wait at the barrier shows through the noise.
  for r in late:
    if r['overrun_s'] == 0:
      target = 128 * 1e-3 * (2.0 if r['worker'] == 1 else 1.0)
      assert r['compute_s'] + r['dilation_s'] == pytest.approx(target, rel=0.25), r
  assert sum(r['wait_s'] for r in late if r['worker'] == 0) > sum(
      r['wait_s'] for r in late if r['worker'] == 1)
  cluster = json.loads((tmp_path / 'cluster.json').read_text())['workers']
  assert [w['worker'] for w in cluster] == [0, 1] and all(len(w['devices']) == 2 for w in cluster)
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['final_step'] == steps
  # The throughput summary.json records is the one the report prints (steady steps only).
  steady = report_lib.telemetry_throughput(report_lib.load_telemetry(tmp_path))
  assert summary['steady_samples_per_s'] == pytest.approx(steady.samples_per_s, abs=0.05)
  assert summary['steady_samples_per_s'] > 0 and 1 not in steady.steps
  report = subprocess.run([sys.executable, '-m', 'hetjax.report', str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert report.returncode == 0, report.stderr
  assert (tmp_path / 'timeline.png').stat().st_size > 1000


@pytest.mark.multiprocess
@pytest.mark.timeout(3 * LAUNCH_TIMEOUT + 60)
def test_lbbsp_moves_work_off_the_straggler_trains_the_same_sgd_and_resumes_its_shares(tmp_path):
  """An LB-BSP run on a 4x straggler, killed after step 7 and resumed: it moves work off the
  straggler, continues with the shares it had learned (a fresh policy would start from
  uniform), and trains the same SGD as one process on the whole batch. (Its first move waits
  for three clean steps that measure the step-time noise and a second decision that confirms
  it: the first program's compile makes a change costly.)"""
  steps = 10
  flags = ['--config=mlp', '--mesh=1x1', f'--steps={steps}', '--set', 'global_batch=128',
           '--set', 'log_every=7', '--set', 'checkpoint_every=7', '--set', 'optimizer=sgd',
           '--nocompilation_cache']

  def run(run_dir, until, *extra):
    command = [sys.executable, str(ROOT / 'experiments' / 'train.py'), *flags,
               f'--steps={until}', f'--workdir={run_dir}', '--policy=lbbsp', '--bucket=16',
               '--set', 'host_row_s=5e-4', *extra]
    result = launch_local(command, workers=2, slowdown='static:1,4', timeout=LAUNCH_TIMEOUT,
                          init_timeout=60)
    assert result.returncode == 0, result
    return json.loads((run_dir / 'summary.json').read_text())

  one = subprocess.run([sys.executable, str(ROOT / 'experiments' / 'train.py'), *flags,
                        f'--workdir={tmp_path / "one"}'], cwd=ROOT, capture_output=True,
                       text=True, timeout=LAUNCH_TIMEOUT)
  assert one.returncode == 0, one.stderr[-2000:]

  part = tmp_path / 'lbbsp'
  first = run(part, 7)
  assert first['first_shares'] == [64, 64] and first['last_shares'][1] < 64  # gave work away
  second = run(part, steps, '--resume')
  assert second['first_shares'] == first['last_shares'], (first, second)
  rows = [json.loads(line) for line in (part / 'telemetry.jsonl').read_text().splitlines()]
  shares = [[r['share'] for r in rows if r['step'] == s] for s in range(1, steps + 1)]
  assert shares[0] == [64, 64] and shares[-1][1] < 64
  assert all(sum(s) == 128 and s[0] % 16 == 0 for s in shares)
  np.testing.assert_allclose(_metric_losses(part), _metric_losses(tmp_path / 'one'), rtol=1e-5)


def _metric_losses(run_dir):
  return [json.loads(line)['loss'] for line in (run_dir / 'metrics.jsonl').read_text().splitlines()]
