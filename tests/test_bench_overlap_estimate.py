"""experiments/_overlap_estimate.py, what bench_overlap_estimate.py prints: the one-device
recurrence of the all-reduce scheduler's estimate, on a few steps."""

import numpy as np
import optax
import pytest

from experiments import _overlap_estimate as bench
from hetjax.core import Work
from hetjax.train import OverlapTrainer


@pytest.fixture(scope='module')
def setup():
  return bench._setup()


def test_the_scheduler_and_the_synchronous_step_share_their_first_step_only(setup):
  # Step 1's gradient is at w₀ for both (no estimate yet); step 2's is at w̃₁ for the scheduler.
  sync = bench.curve(setup, 0.3, None, 2, seed=0)
  own = bench.curve(setup, 0.3, 1.0, 2, seed=0)
  half = bench.curve(setup, 0.3, 0.5, 2, seed=0)
  assert sync[0] == own[0] == half[0]
  assert len({sync[1], own[1], half[1]}) == 3


def test_rows_and_table(setup, monkeypatch):
  monkeypatch.setattr(bench, '_setup', lambda: setup)
  out = bench.rows(2, (0.3,), 3, (2,))
  assert [(r['lr'], r['estimate'], r['scale'], r['step']) for r in out] == [
      (0.3, 'own', s, 2) for s in bench.SCALES] + [(0.3, 'int8', 1.0, 2), (0.3, 'floor', 0.0, 2)]
  assert all(np.isfinite(r['loss_vs_sync']) and r['stderr'] >= 0 for r in out)
  lines = bench.table(out).splitlines()
  assert lines[0].split()[:3] == ['lr', 'estimate', 'alpha'] and len(lines) == 3 + len(bench.SCALES)


def test_the_int8_estimate_is_the_exact_one_up_to_rounding(setup):
  # w̃ from every worker's 8-bit gradient: nearly the synchronous trajectory, where each
  # worker's own gradient is not.
  sync = bench.curve(setup, 0.3, None, 6, seed=0)
  int8 = bench.curve(setup, 0.3, 1.0, 6, seed=0, estimate='int8')
  own = bench.curve(setup, 0.3, 1.0, 6, seed=0)
  assert np.max(np.abs(int8 / sync - 1)) < 0.1 * np.max(np.abs(own / sync - 1))


def test_the_recurrence_is_the_scheduler_s_own(setup, monkeypatch):
  # One worker with α = 0.5 (with α = 1 one worker's overlap is the synchronous step): the
  # bench's recurrence against `OverlapTrainer` itself, in process, after a flush.
  monkeypatch.setattr(bench, 'WORKERS', 1)
  task, _, full, _ = setup
  steps, lr = 3, 0.3
  want = bench.curve(setup, lr, 0.5, steps, seed=0)
  program = OverlapTrainer(task, optax.sgd(lr), bench.BATCH, estimate_scale=0.5)
  state = program.init_state()
  for step in range(steps):
    state, _ = program.step(state, Work(step, program.global_batch_at(step)), (bench.BATCH,))
  params = program.local_view(program.flush(state).train.params)
  program.close()
  np.testing.assert_allclose(float(full(params)), want[-1], rtol=1e-5)
