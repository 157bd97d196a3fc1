"""MetricsLogger's progress lines: the steady throughput of summary.json, and the time left.

Steps are made up (no device work) and timed by a fake clock: step 1 compiles for 10 s, every
other step takes 1 s (2 s when a compile holds it up), global batch 100.
"""

import io
import json

import numpy as np
import pytest

from hetjax.core import StepStats, WorkerTiming
from hetjax.report import summary_fields
from hetjax.train import MetricsLogger, StepInfo
from hetjax.train._metrics import format_duration, held_up_by_compile

BATCH = 100


def _stats(step, compile_s=0.0, sampled=(True, True), per_worker=True):
  local = WorkerTiming(step=step, worker=0, share=50, slowdown=1.0, data_s=0.0, compute_s=0.5,
                       dilation_s=0.0, collective_s=0.1, step_s=1.0) if per_worker else None
  return StepStats(step - 1, (50, 50), (0.5, 0.5), compile_s=compile_s, sampled=sampled,
                   loss=np.float32(1.0 / step), local=local)


def _run(clock, logger, seconds, stats):
  hook = logger.hook()
  for step, (s, st) in enumerate(zip(seconds, stats, strict=True), start=1):
    clock.now += s
    hook.fn(StepInfo(step, None, st, time=clock.now))
  logger.close()


def test_lines_show_the_steady_rate_without_the_compile_and_the_time_left(clock, tmp_path):
  out = io.StringIO()
  logger = MetricsLogger(tmp_path / 'm.jsonl', BATCH, total_steps=10, every=5, stream=out)
  _run(clock, logger, [10.0] + [1.0] * 9, [_stats(s) for s in range(1, 11)])
  # Steps 2-5: 400 rows in 4 s; all steps in: 500 rows in 14 s (35.7/s). 5 steps left: 5 s.
  assert out.getvalue().splitlines() == [
      'step  5/10 | loss 0.2000 |        100 samples/s |    14.0 s | eta 5.0s',
      'step 10/10 | loss 0.1000 |        100 samples/s |    19.0 s | eta 0.0s']
  rows = [json.loads(line) for line in (tmp_path / 'm.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows] == list(range(1, 11))
  assert {r['step']: r['samples_per_s'] for r in rows if 'samples_per_s' in r} == {
      5: 100.0, 10: 100.0}
  assert rows[0]['time_s'] == 10.0  # step 1 fetched on its own: the warm-up interval
  assert logger.summary()['steady_samples_per_s'] == 100.0


def test_steps_a_compile_held_up_are_left_out(clock):
  out = io.StringIO()
  logger = MetricsLogger(None, BATCH, total_steps=8, every=4, stream=out)
  # Step 3 waited 3 s for a compile; step 6 ran beside one on another worker (not sampled).
  stats = [_stats(s, compile_s=3.0 if s == 3 else 0.0,
                  sampled=(True, False) if s == 6 else (True, True)) for s in range(1, 9)]
  _run(clock, logger, [10.0, 1.0, 4.0, 1.0, 1.0, 5.0, 1.0, 1.0], stats)
  lines = out.getvalue().splitlines()
  # Steady: steps 2, 4, 5, 7, 8, 1 s each (all in from step 2: 700 rows in 14 s, 50/s).
  assert [line.split(' | ')[2].strip() for line in lines] == ['100 samples/s'] * 2
  assert lines[0].endswith('eta 4.0s') and lines[-1].endswith('eta 0.0s')
  steady = logger.steady()  # grouped by fetch: 1 | 2-4 | 5-8
  assert steady.warmup == (1,) and steady.steps == (4, 8) and steady.compiling == (3, 6)


def test_before_a_steady_interval_the_rate_and_the_time_left_are_unknown(clock):
  out = io.StringIO()
  logger = MetricsLogger(None, BATCH, total_steps=3, every=1, stream=out)
  _run(clock, logger, [10.0, 2.0, 1.0], [_stats(1), _stats(2, compile_s=1.0), _stats(3)])
  assert out.getvalue().splitlines() == [
      'step 1/3 | loss 1.0000 |        n/a samples/s |    10.0 s | eta n/a',
      'step 2/3 | loss 0.5000 |        n/a samples/s |    12.0 s | eta n/a',
      'step 3/3 | loss 0.3333 |        100 samples/s |    13.0 s | eta 0.0s']
  assert MetricsLogger(None, BATCH, 3, stream=io.StringIO()).summary()[
      'steady_samples_per_s'] is None


def test_only_per_worker_steps_read_sampled_as_a_compile():
  assert held_up_by_compile(_stats(2, sampled=(True, False)))
  assert held_up_by_compile(_stats(2, compile_s=0.5, per_worker=False))
  # SPMD, pipeline and SchMP steps are never speed samples: that says nothing about compiles.
  assert not held_up_by_compile(_stats(2, sampled=(False,), per_worker=False))
  assert not held_up_by_compile(None)


def test_the_logger_and_the_report_give_one_figure(clock, tmp_path):
  """One definition: the logger's steps are the telemetry's (steps that sync, as per-worker
  ones do, have their own times), and its steady figure is the report's (and summary.json's)
  to the digit."""
  seconds = [10.0, 1.0, 1.0, 4.5, 1.0, 1.0, 1.0, 0.5]
  sampled = {4: (True, False)}  # step 4: worker 1 ran a new size beside its compile
  logger = MetricsLogger(None, BATCH, total_steps=8, every=3, stream=io.StringIO())
  _run(clock, logger, seconds, [_stats(s, sampled=sampled.get(s, (True, True)))
                                for s in range(1, 9)])
  rows = [{'step': s, 'worker': w, 'share': 50, 'slowdown': 1.0, 'data_s': 0.0,
           'compute_s': 0.5, 'dilation_s': 0.0, 'comm_s': 0.1, 'wait_s': 0.0, 'step_s': t,
           'compile_s': 0.0, 'sampled': sampled.get(s, (True, True))[w]}
          for s, t in enumerate(seconds, start=1) for w in range(2)]
  (tmp_path / 'telemetry.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  fields = summary_fields(tmp_path)  # steps 2-3 and 5-8: 600 rows in 5.5 s
  assert logger.summary()['steady_samples_per_s'] == fields['steady_samples_per_s'] == 109.1
  assert fields['steady_steps'] == ('steps 2-8, 6 counted: 1 warm-up step and 1 compiling '
                                    'step (4) excluded')


@pytest.mark.parametrize('seconds, text', [(0.04, '0.0s'), (9.9, '9.9s'), (9.96, '10s'),
                                           (42, '42s'), (72.4, '1m12s'), (3599, '59m59s'),
                                           (7380, '2h03m')])
def test_format_duration(seconds, text):
  assert format_duration(seconds) == text
