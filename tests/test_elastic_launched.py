"""Elastic runs of real JAX jobs under the launcher: a hung worker named by the stall watchdog,
and train.py restarted after a kill, then left with one worker, ending where one process does.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from experiments import _faults
from hetjax import runtime

ROOT = pathlib.Path(__file__).resolve().parents[1]
# With the training options of a language model (issue 26): gradient accumulation, a warm-up
# and cosine decay, clipping, and the mlp's held-out evaluation (accuracy) every 8 steps.
TRAIN = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp', '--mesh=1x1',
         '--steps=24', '--set', 'checkpoint_every=4', '--set', 'checkpoint_async=False',
         '--set', 'log_every=1', '--set', 'optimizer=momentum', '--set', 'learning_rate=0.05',
         '--set', 'optimizer.accumulate=2', '--set', 'optimizer.schedule=cosine', '--set',
         'optimizer.warmup=4', '--set', 'optimizer.clip_norm=1.0', '--set', 'eval.every=8']


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_hung_worker_is_named_by_the_watchdog_not_its_peers():
  result = runtime.launch_local([sys.executable, str(ROOT / 'tests' / 'workers' /
                                                     'stuck_worker.py')],
                                3, stdout=io.StringIO(), timeout=90,
                                env={**os.environ, 'HETJAX_STALL_TIMEOUT': '2'})
  assert result.returncode == 3 and result.failed_worker == 1, result
  assert result.cause.startswith('worker 1 made no progress for ')
  assert 'after step 4, while others finished step' in result.cause


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_train_restarts_after_a_kill_then_finishes_on_the_survivor(tmp_path):
  """2 workers; worker 1 is SIGKILLed at step 10, then again as soon as the restarted job has
  it: it is left out and the run ends on worker 0 alone, with every step logged once and the
  parameters of one process training the same global batch."""
  reference = tmp_path / 'one'
  subprocess.run([*TRAIN, f'--workdir={reference}'], cwd=ROOT, check=True, timeout=120,
                 capture_output=True, env={**os.environ, 'JAX_NUM_CPU_DEVICES': '1'})
  workdir = tmp_path / 'elastic'
  watch, results, said = _faults.RunWatch(workdir), [], []

  def inject():
    watch.wait(lambda: watch.last_step() >= 10, 120, 'step 10')
    _faults.signal_worker(os.getpid(), 1, signal.SIGKILL)
    watch.wait(lambda: len(results) == 1, 60, 'the restart')
    _faults.signal_worker(os.getpid(), 1, signal.SIGKILL)

  thread = threading.Thread(target=inject, daemon=True)
  thread.start()
  result = runtime.launch_elastic([*TRAIN, f'--workdir={workdir}'], 2, max_restarts=2,
                                  min_workers=1, timeout=240, stdout=io.StringIO(),
                                  log=said.append, on_result=lambda _, r: results.append(r))
  thread.join(timeout=5)
  assert result.returncode == 0, (result, said)
  assert [r.failed_worker for r in results[:2]] == [1, 1]
  assert said[-1] == 'launch: restart 2 of 2 on workers 0'
  assert _faults.orphans(os.getpid()) == 0
  assert watch.steps() == list(range(1, 25))  # no step missing or twice
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['restarts'] == 2 and all(0 <= n <= 4 for n in summary['steps_lost']), (
      summary['steps_lost'], summary['restart_causes'])
  assert summary['restart_causes'][-1] == 'worker 1 was killed by SIGKILL'
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in records if 'eval_accuracy' in r] == [8, 16, 24]
  assert 0 <= summary['eval_accuracy'] <= 1
  got = _faults.final_state(workdir / 'checkpoints', 24)['params']
  want = _faults.final_state(reference / 'checkpoints', 24)['params']
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    # the strategies' tolerance (and optimizer: Adam turns summation order into O(lr), see
    # BUILD_NOTES "Tolerance policy")
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
