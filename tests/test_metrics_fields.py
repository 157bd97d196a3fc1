"""MetricsLogger's observability fields: tokens/s and MFU beside samples/s, ``extra`` fields,
timed hooks, the compile flag and the launch's Unix start, the live line on a terminal.

Steps are made up and timed by a fake clock, as in tests/test_metrics.py: step 1 compiles for
10 s, every other step takes 1 s, global batch 100, so the steady rate is 100 samples/s
(1 step/s) exactly.
"""

import io
import json

import jax.numpy as jnp
import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import StepStats
from hetjax.train import Hook, MetricsLogger, StepInfo
from hetjax.train._loop import run_hooks
from tests.conftest import MetricsClock

BATCH = 100
UNIX_START = MetricsClock.UNIX_START


def _run(clock, logger, steps, hooks=(), compile_at=()):
  """Steps 1..``steps``: 10 s for the first, 1 s (3 s if in ``compile_at``) for the others."""
  hooks = [logger.hook(), *hooks]
  for step in range(1, steps + 1):
    clock.now += 10.0 if step == 1 else 3.0 if step in compile_at else 1.0
    stats = StepStats(step - 1, (BATCH,), (1.0,), compile_s=2.0 if step in compile_at else 0.0,
                      loss=np.float32(1.0 / step))
    run_hooks(hooks, StepInfo(step, None, stats, time=clock.now), steps)
  logger.close()


def _rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_tokens_per_s_and_mfu_beside_samples_per_s(clock, tmp_path):
  # 1 step/s of 2 GFLOP on 10 GFLOP/s of devices: MFU 0.2; 100 examples of 50 tokens a second.
  logger = MetricsLogger(tmp_path / 'm.jsonl', BATCH, total_steps=10, every=5,
                         stream=io.StringIO(), tokens_per_example=50, flops_per_step=2e9,
                         peak_flops=1e10)
  _run(clock, logger, 10)
  shown = {r['step']: r for r in _rows(tmp_path / 'm.jsonl') if 'samples_per_s' in r}
  assert {s: (r['samples_per_s'], r['tokens_per_s'], r['mfu']) for s, r in shown.items()} == {
      5: (100.0, 5000.0, 0.2), 10: (100.0, 5000.0, 0.2)}
  summary = logger.summary()
  assert (summary['steady_samples_per_s'], summary['steady_tokens_per_s'],
          summary['steady_mfu']) == (100.0, 5000.0, 0.2)


def test_without_them_the_records_and_summary_keep_their_fields(clock, tmp_path):
  logger = MetricsLogger(tmp_path / 'm.jsonl', BATCH, total_steps=4, every=2,
                         stream=io.StringIO())
  _run(clock, logger, 4)
  rows = _rows(tmp_path / 'm.jsonl')
  assert rows[0] == {'step': 1, 'loss': 1.0, 'time_s': 10.0, 'returned_s': 10.0,
                     'start_unix_s': UNIX_START}  # the launch's start on the first row only
  assert rows[1] == {'step': 2, 'loss': 0.5, 'time_s': 11.0, 'returned_s': 11.0,
                     'samples_per_s': 100.0}
  assert set(logger.summary()) == {'final_step', 'final_loss', 'wall_s', 'steady_samples_per_s'}


def test_extra_fields_are_fetched_with_the_loss(clock, tmp_path):
  def extra(info):
    out = {'lr': jnp.float32(0.5) * info.step, 'phase': 'warm' if info.step < 2 else 'main'}
    if info.step == 3:
      out |= {'eval_loss': jnp.float32(0.75), 'diverged': False, 'grad_norm': jnp.nan}
    return out

  logger = MetricsLogger(tmp_path / 'm.jsonl', BATCH, total_steps=3, every=3,
                         stream=io.StringIO(), extra=extra)
  _run(clock, logger, 3)
  rows = _rows(tmp_path / 'm.jsonl')
  assert [(r['lr'], r['phase']) for r in rows] == [(0.5, 'warm'), (1.0, 'main'), (1.5, 'main')]
  assert {k: rows[2][k] for k in ('eval_loss', 'diverged', 'grad_norm')} == {
      'eval_loss': 0.75, 'diverged': False, 'grad_norm': None}  # NaN: null, strict JSON


def test_timed_hooks_and_compiles_are_marked_in_their_steps(clock, tmp_path):
  """A save after step 2 takes 0.5 s: step 3's interval holds it. The save after the last
  step (4) is in no step's interval: only in the summary's total."""
  def save(info):
    clock.now += 0.5

  checkpoint = Hook(save, every=2)
  logger = MetricsLogger(tmp_path / 'm.jsonl', BATCH, total_steps=4, every=1,
                         stream=io.StringIO())
  _run(clock, logger, 4, hooks=[logger.timed(checkpoint, 'checkpoint')], compile_at=(2,))
  rows = _rows(tmp_path / 'm.jsonl')
  assert [r.get('hooks_s') for r in rows] == [None, None, {'checkpoint': 0.5}, None]
  assert [r.get('held_up_by_compile', False) for r in rows] == [False, True, False, False]
  assert rows[2]['time_s'] - rows[1]['time_s'] == 1.5  # the save is inside step 3's time
  assert logger.summary()['hooks_s'] == {'checkpoint': 1.0}


def test_a_terminal_gets_one_live_line(clock):
  out = io.StringIO()
  logger = MetricsLogger(None, BATCH, total_steps=10, every=5, stream=out, live=True)
  _run(clock, logger, 10)
  text = out.getvalue()
  assert 'step 10/10' in text and 'loss 0.1000' in text and 'eta 0.0s' in text
  assert '\x1b[' in text  # drawn in place with terminal control codes
  assert 'step  5/10 | loss' not in text  # no plain progress lines
  plain = io.StringIO()  # not a TTY: today's plain lines
  _run(clock, MetricsLogger(None, BATCH, total_steps=2, every=1, stream=plain), 2)
  assert plain.getvalue().splitlines()[-1].startswith('step 2/2 | loss 0.5000 |')


@pytest.mark.parametrize('field, value', [('tokens_per_example', -1), ('flops_per_step', np.inf),
                                          ('peak_flops', -2e9)])
def test_bad_rates_are_one_config_error(field, value):
  with pytest.raises(ConfigError, match=rf'^MetricsLogger: {field} must be a finite number >= 0'):
    MetricsLogger(None, BATCH, 10, stream=io.StringIO(), **{field: value})


def test_extra_may_not_return_what_the_logger_writes(clock):
  logger = MetricsLogger(None, BATCH, 3, stream=io.StringIO(), extra=lambda info: {'mfu': 0.5})
  with pytest.raises(ConfigError, match=r"^MetricsLogger: extra returned 'mfu', which the logger "
                     'writes itself'):
    _run(clock, logger, 1)
