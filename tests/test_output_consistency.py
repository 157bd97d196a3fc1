"""What a run prints agrees with itself (issue 44, item 5): one samples/s in the progress lines,
summary.json and the report; goodput's notices and its resume and restart time only where they
happened; a policy's name explained where people read it.

Progress lines are driven with a fake clock as in test_metrics.py, the telemetry written as the
runner's gatherer does (a step's rows after the logger's hook); global batch 100.
"""

import io
import json
import random

import numpy as np
import pytest

from hetjax import balance, core, report, run
from hetjax.core import StepStats, WorkerTiming
from hetjax.emulation import StaticTrace
from hetjax.report import LiveThroughput, _goodput, summary_fields, telemetry_throughput
from hetjax.train import MetricsLogger, StepInfo
from tests.conftest import require_devices

BATCH = 100




def _telemetry_row(step, worker, step_s, compile_s=0.0, sampled=True, share=50):
  return {'step': step, 'worker': worker, 'share': share, 'slowdown': 1.0, 'data_s': 0.0,
          'compute_s': 0.5, 'dilation_s': 0.0, 'comm_s': 0.1, 'wait_s': 0.0, 'step_s': step_s,
          'compile_s': compile_s, 'sampled': sampled}


def _stats(step, compile_s=0.0):
  local = WorkerTiming(step=step, worker=0, share=50, slowdown=1.0, data_s=0.0, compute_s=0.5,
                       dilation_s=0.0, collective_s=0.1, step_s=1.0)
  return StepStats(step - 1, (50, 50), (0.5, 0.5), compile_s=compile_s, sampled=(True, True),
                   loss=np.float32(1.0 / step), local=local)


def test_progress_lines_and_the_summary_give_one_samples_per_s(clock, tmp_path):
  """The issue's case: progress lines at 8,681 samples/s, summary.json at 12,025. Here the
  workers' steps take 1 s (0.5 s from step 9, rebalanced) and the chief's clock sees 0.5 s
  more: every line, summary.json and the report count the workers' time, the time left goes
  at the clock's pace, and the last line (printed by close, after the telemetry's writer
  closed, as the runner does) is summary.json's figure."""
  telemetry = tmp_path / 'telemetry.jsonl'
  out = io.StringIO()
  logger = MetricsLogger(tmp_path / 'metrics.jsonl', BATCH, total_steps=12, every=4, stream=out,
                         telemetry=telemetry)
  hook = logger.hook()
  for step in range(1, 13):
    held_up = 2.0 if step in (1, 6) else 0.0  # step 1 compiles, step 6 waits for a compile
    step_s = (1.0 if step <= 8 else 0.5) + held_up
    clock.now += step_s + 0.5
    hook.fn(StepInfo(step, None, _stats(step, compile_s=held_up), time=clock.now))
    # The gatherer writes a step's rows after the logger's hook, as in the runner.
    with telemetry.open('a') as f:
      f.writelines(json.dumps(_telemetry_row(step, w, step_s, compile_s=held_up)) + '\n'
                   for w in (0, 1))
  logger.close()
  lines = out.getvalue().splitlines()
  # Steps 2-3, then 2-5 and 7 at 1 s: 100/s; at the end 2-5, 7-8 (6 s) and 9-12 (2 s): 125/s.
  assert [line.split(' | ')[2].strip() for line in lines] == [
      '100 samples/s', '100 samples/s', '125 samples/s']
  assert lines[0].endswith('eta 12s')  # 8 steps of 100 rows left at the clock's 66.7/s
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert {r['step']: r['samples_per_s'] for r in rows if 'samples_per_s' in r} == {
      4: 100.0, 8: 100.0, 12: 125.0}
  fields = summary_fields(tmp_path)  # what the runner merges into summary.json
  assert logger.summary()['steady_samples_per_s'] == fields['steady_samples_per_s'] == 125.0
  assert fields['steady_steps'] == ('steps 2-12, 10 counted: 1 warm-up step and 1 compiling '
                                    'step (6) excluded')
  assert logger.steady().samples_per_s < 100  # the clock's figure, which no line shows


def test_the_live_figure_is_the_reports_to_the_digit_read_in_any_pieces(tmp_path):
  """A telemetry file written a piece at a time, cut mid-line and mid-step: after every read,
  `LiveThroughput` gives `telemetry_throughput` of the complete steps written so far."""
  rng = random.Random(0)
  path = tmp_path / 'telemetry.jsonl'
  rows = [_telemetry_row(step, w, rng.uniform(0.5, 2.0),
                         compile_s=1.0 if rng.random() < 0.1 else 0.0,
                         sampled=rng.random() > 0.1, share=rng.randrange(10, 90))
          for step in range(1, 41) for w in range(3)]
  text = ''.join(json.dumps(r) + '\n' for r in rows)
  live = LiveThroughput(path)
  assert live.read().samples_per_s is None  # no file yet
  cuts = [*sorted(rng.sample(range(1, len(text)), 25)), len(text)]
  written = 0
  for cut in cuts:
    with path.open('a') as f:
      f.write(text[written:cut])
    written = cut
    got = live.read()
    done = text[:cut].count('\n') // 3  # steps whose three rows are all written
    whole = tmp_path / f'upto{cut}'
    whole.mkdir()
    (whole / 'telemetry.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows[:3 * done]))
    if done >= 2:
      assert got == telemetry_throughput(report.load_telemetry(whole))
  assert live.read() == telemetry_throughput(report.load_telemetry(tmp_path))


def test_a_rewritten_telemetry_file_is_read_from_its_start(tmp_path):
  path = tmp_path / 'telemetry.jsonl'
  rows = [_telemetry_row(s, w, 1.0) for s in range(1, 6) for w in (0, 1)]
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  live = LiveThroughput(path)
  assert live.read().steps == (2, 3, 4, 5)
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows[:6]))  # trimmed after step 3
  assert live.read().steps == (2, 3)


# Goodput: the launches of a made-up run (Unix seconds). Launch 1's logger starts at 1000
# (the job at 998); its steps end at 1010 (compiles), 1011, 1012. Launch 2 starts at 1100.
def _metrics_rows(second=None):
  first = [{'step': 1, 'time_s': 10.0, 'start_unix_s': 1000.0, 'launch': 'start',
            'launched_unix_s': 998.0, 'hooks_s': {'checkpoint': 0.5}},
           {'step': 2, 'time_s': 11.0}, {'step': 3, 'time_s': 12.0}]
  later = [] if second is None else [{'step': 3, 'time_s': 5.0, 'start_unix_s': 1100.0,
                                      **second}, {'step': 4, 'time_s': 6.0}]
  return [r | {'loss': 1.0, 'returned_s': r['time_s']} for r in first + later]


def _write(run_dir, rows, restarts=(), wall_s=7.0):
  run_dir.mkdir(parents=True, exist_ok=True)
  (run_dir / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  (run_dir / 'run.json').write_text(json.dumps({'started_unix_s': 998.0}))
  (run_dir / 'summary.json').write_text(json.dumps({'wall_s': wall_s}))
  if restarts:
    (run_dir / 'restarts.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in restarts))
  return run_dir


def test_a_run_of_one_launch_has_no_restore_notice_and_no_resume_or_restart(tmp_path):
  g = report.goodput(_write(tmp_path, _metrics_rows(), wall_s=13.0))
  assert list(g['badput_s']) == ['startup', 'compile', 'checkpoint', 'barrier_wait', 'other']
  assert g['unrecorded'] == [] and (g['resumes'], g['restarts']) == (0, 0)
  assert 'not split out' not in report.format_goodput(g)
  assert 'restart' not in report.format_goodput(g) and 'resume' not in report.format_goodput(g)


def test_a_plain_resume_is_resume_time_not_restart_time(tmp_path):
  """The issue's case: after a plain --resume, badput_s had 'restart': 3.5 while restarts=0.
  Launch 2 was started by hand at 1097 (the run stood still from 1012 until then: no one's
  time), its logger at 1100: 3 s of resume, and no restart."""
  g = report.goodput(_write(tmp_path, _metrics_rows({'launch': 'resume',
                                                     'launched_unix_s': 1097.0})))
  assert g['badput_s']['resume'] == 3.0 and 'restart' not in g['badput_s']
  assert (g['launches'], g['resumes'], g['restarts']) == (2, 1, 0)
  assert g['wall_s'] == 2.0 + 12.0 + 3.0 + 6.0 + 1.0  # startup, launches, resume, close
  assert g['wall_s'] == pytest.approx(g['productive_s'] + sum(g['badput_s'].values()))
  assert g['unrecorded'] == [_goodput.RESTORE_IN_STARTUP]  # it did restore a checkpoint
  assert '| resume 3.0 s |' in report.format_goodput(g)


def test_a_restart_by_the_launcher_is_restart_time(tmp_path):
  """The launcher restarted the job: from launch 1's last kept step (1012) to launch 2's
  logger (1100), the lost steps and the relaunch, is restart; no resume."""
  rows = _metrics_rows({'launch': 'restart', 'launched_unix_s': 1097.0})
  g = report.goodput(_write(tmp_path, rows, restarts=[{'restart': 1, 'resumed_from': 2,
                                                       'steps_lost': 1}]))
  assert g['badput_s']['restart'] == 88.0 and 'resume' not in g['badput_s']
  assert (g['resumes'], g['restarts']) == (0, 1)


def test_a_restart_before_the_first_checkpoint_is_restart_time_too(tmp_path):
  """The launcher restarted a job that failed before its first checkpoint: the failed
  launch's steps were dropped, and the job's time from its start (998) until the restarted
  launch began (999.5) is restart; from there to its logger (1000), start-up."""
  rows = _metrics_rows()
  rows[0] |= {'launch': 'restart', 'launched_unix_s': 999.5}
  g = report.goodput(_write(tmp_path, rows, restarts=[{'restart': 1, 'resumed_from': 0,
                                                       'steps_lost': 0}], wall_s=13.0))
  assert (g['badput_s']['startup'], g['badput_s']['restart']) == (0.5, 1.5)
  assert 'resume' not in g['badput_s'] and g['unrecorded'] == []


def test_older_rows_tell_a_resume_from_a_restart_by_restarts_jsonl(tmp_path):
  """Rows written before ``launch``: a restart where restarts.jsonl has rows, else a resume,
  whose start is not known: the whole gap is resume, and the report says so."""
  g = report.goodput(_write(tmp_path / 'resumed', _metrics_rows({})))
  assert g['badput_s']['resume'] == 88.0 and 'restart' not in g['badput_s']
  assert g['unrecorded'] == [_goodput.RESTORE_IN_STARTUP, _goodput.NO_RESUME_CLOCK]
  g = report.goodput(_write(tmp_path / 'restarted', _metrics_rows({}),
                            restarts=[{'restart': 1, 'steps_lost': 1}]))
  assert g['badput_s']['restart'] == 88.0 and 'resume' not in g['badput_s']
  assert g['unrecorded'] == [_goodput.RESTORE_IN_STARTUP]


def test_the_logger_writes_how_its_launch_began_on_its_first_line(clock, tmp_path):
  logger = MetricsLogger(tmp_path / 'm.jsonl', BATCH, total_steps=2, every=1,
                         stream=io.StringIO(), launch=report.Launch.RESUME,
                         launched_unix_s=1234.5)
  hook = logger.hook()
  for step in (1, 2):
    clock.now += 1.0
    hook.fn(StepInfo(step, None, _stats(step), time=clock.now))
  logger.close()
  rows = [json.loads(line) for line in (tmp_path / 'm.jsonl').read_text().splitlines()]
  assert (rows[0]['launch'], rows[0]['launched_unix_s']) == ('resume', 1234.5)
  assert 'launch' not in rows[1] and 'launched_unix_s' not in rows[1]


def test_a_run_prints_one_samples_per_s_names_its_policy_and_resumes_as_resume(tmp_path,
                                                                               capsys):
  """The runner end to end, in mode shares (one worker here: telemetry, a share policy): the
  start-up names what lbbsp-ewma is, the last progress line's samples/s is summary.json's, and
  a plain ``resume=True`` (``--resume``) is resume time, not restart time."""
  require_devices(8)
  config = run.override(run.load_config('mlp'), [
      'model_args.hidden=16', 'model_args.width=8', 'global_batch=16', 'log_every=2',
      'checkpoint_every=2', 'mode=shares', 'policy=lbbsp', 'mesh=8x1', 'logging.mfu=False',
      'logging.tensorboard=False', 'eval.enabled=False'])
  first = run.train(run.override(config, ['steps=4']), tmp_path)
  out = capsys.readouterr().out.splitlines()
  assert ("policy: lbbsp-ewma (LB-BSP: each worker's speed predicted by an exponentially "
          'weighted moving average)') in out
  last = next(line for line in out if line.startswith('step 4/4'))
  assert f'{first["steady_samples_per_s"]:,.0f} samples/s' in last
  assert 'resume' not in first['badput_s'] and 'restart' not in first['badput_s']
  assert report.goodput(tmp_path)['unrecorded'] == []
  second = run.train(run.override(config, ['steps=6']), tmp_path, resume=True)
  assert second['badput_s']['resume'] > 0 and 'restart' not in second['badput_s']
  assert second['restarts'] == 0
  rows = map(json.loads, (tmp_path / 'metrics.jsonl').read_text().splitlines())
  launches = [row for row in rows if 'start_unix_s' in row]
  assert [r['launch'] for r in launches] == ['start', 'resume']


@pytest.mark.parametrize('name', [n.value for n in balance.PolicyName])
def test_every_policy_name_is_explained(name):
  rules = core.ShareRules(global_batch=256, workers=2, bucket=8)
  policy = balance.make_policy(name, rules, StaticTrace((1, 3)))
  described = balance.describe_policy(policy.name)
  assert described.startswith(f'{policy.name} (') and described.endswith(')')


def test_lbbsp_says_what_ewma_is():
  """The issue's case: --policy=lbbsp is reported as lbbsp-ewma, with no word on ewma."""
  rules = core.ShareRules(global_batch=256, workers=2, bucket=8)
  assert balance.make_policy('lbbsp', rules).name == 'lbbsp-ewma'
  assert balance.describe_policy('lbbsp-ewma') == (
      "lbbsp-ewma (LB-BSP: each worker's speed predicted by an exponentially weighted moving "
      'average)')
  assert balance.describe_policy('fixed').startswith('fixed (the shares balance.shares gives')
  assert balance.describe_policy('mine') == 'mine'  # a policy of your own: as it is
