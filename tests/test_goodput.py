"""Goodput of a made-up run directory, every second accounted for; the loss plot and the
report's goodput line.

The run (times in seconds, each step fetched on its own): the job starts at Unix time 998,
its first logger at 1000;
step 1 compiles (10), steps 2 and 4 take 1, step 3 waits 2 for a compile (3), step 4's interval
holds a 0.5 checkpoint save (1.5). It fails later; the restart trimmed the steps after the
checkpoint at 4. Launch 2 starts at 1020 (4.5 after step 4 ended at 15.5): step 5 compiles (5),
steps 6-8 take 1; its summary comes 1 after step 8, of which a final save took 0.25. Two
workers: the fast one waits at the barrier half of each steady step (0.5 of 1), so the workers
waited a quarter of their time.

  productive  5 steady steps × 1 + 3 compiling steps' 1 each (what they trained)  8 × 3/4 = 6
  startup     1000 − 998                                                            2
  compile     (10 − 1) + (3 − 1) + (5 − 1)                                         15
  checkpoint  0.5 + 0.25                                                            0.75
  barrier     8 × 1/4                                                               2
  restart     1020 − (1000 + 15.5)                                                  4.5
  other       1 − 0.25                                                              0.75
  wall        2 + 15.5 + 4.5 + 8 + 1                                                31
"""

import json

import pytest

from hetjax import ConfigError, report
from hetjax.report import _goodput
from hetjax.report.__main__ import main

METRICS = [
    {'step': 1, 'time_s': 10.0, 'start_unix_s': 1000.0},
    {'step': 2, 'time_s': 11.0},
    {'step': 3, 'time_s': 14.0, 'held_up_by_compile': True},
    {'step': 4, 'time_s': 15.5, 'hooks_s': {'checkpoint': 0.5}, 'eval_loss': 0.9},
    {'step': 5, 'time_s': 5.0, 'start_unix_s': 1020.0},
    {'step': 6, 'time_s': 6.0},
    {'step': 7, 'time_s': 7.0},
    {'step': 8, 'time_s': 8.0, 'eval_loss': 0.7},
]


def _write_run(run_dir, metrics=METRICS, summary=True, telemetry=True):
  run_dir.mkdir(parents=True, exist_ok=True)
  rows = [r | {'loss': 2.0 / r['step'], 'returned_s': r['time_s']} for r in metrics]
  (run_dir / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  if summary:
    (run_dir / 'summary.json').write_text(json.dumps(
        {'final_step': 8, 'wall_s': 9.0, 'hooks_s': {'checkpoint': 0.25}}))
  if telemetry:
    lines = []
    for step in range(1, 9):
      for worker in (0, 1):
        lines.append({'step': step, 'worker': worker, 'share': 8, 'slowdown': 1.0,
                      'data_s': 0.0, 'compute_s': 0.25, 'dilation_s': 0.0, 'comm_s': 0.25,
                      'wait_s': 0.5 if worker == 0 else 0.0, 'step_s': 1.0,
                      'compile_s': 2.0 if step in (1, 3, 5) else 0.0})
    (run_dir / 'telemetry.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in lines))
  (run_dir / 'restarts.jsonl').write_text(json.dumps({'restart': 1, 'steps_lost': 2}) + '\n')
  if summary:
    (run_dir / 'run.json').write_text(json.dumps({'workers': 2, 'started_unix_s': 998.0}))
  return run_dir


def test_every_second_of_the_run_is_accounted_for(tmp_path):
  g = report.goodput(_write_run(tmp_path))
  assert g['badput_s'] == {'startup': 2.0, 'compile': 15.0, 'checkpoint': 0.75,
                           'barrier_wait': 2.0, 'restart': 4.5, 'other': 0.75}
  assert g['wall_s'] == 31.0 and g['productive_s'] == 6.0
  assert g['wall_s'] == pytest.approx(g['productive_s'] + sum(g['badput_s'].values()))
  assert g['goodput'] == round(6 / 31, 4)
  assert (g['launches'], g['steps'], g['restarts'], g['steps_lost']) == (2, 8, 1, 2)
  assert g['unrecorded'] == [_goodput.RESTORE_IN_STARTUP]


def test_what_a_run_did_not_record_is_named(tmp_path):
  """Rows from before start_unix_s and hooks_s, no summary or run.json, one worker: the
  start-up, the restart, the checkpoints and the close are not split out; the launches are told apart by time_s. Step 4's
  save is not timed, so its 1.5 s count as a steady step: the steady mean is 1.1 s."""
  old = [{k: v for k, v in r.items() if k not in ('start_unix_s', 'hooks_s')} for r in METRICS]
  g = report.goodput(_write_run(tmp_path, old, summary=False, telemetry=False))
  assert g['badput_s'] == {'startup': None, 'compile': pytest.approx(15.0 - 3 * 0.1),
                           'checkpoint': None, 'barrier_wait': 0.0, 'restart': None,
                           'other': None}
  assert g['launches'] == 2 and g['wall_s'] == 15.5 + 8.0
  assert g['productive_s'] == pytest.approx(5.5 + 3 * 1.1)
  assert g['unrecorded'] == [_goodput.BEFORE_LOGGER, _goodput.RESTORE_IN_STARTUP,
                             _goodput.NOT_TIMED_HOOKS, _goodput.NO_LAUNCH_CLOCK,
                             _goodput.NO_SUMMARY]
  text = report.format_goodput(g)
  assert text.splitlines() == [
      'goodput 37.4% of 23.5 s (2 launches) | startup n/a | compile 14.7 s | checkpoint n/a | '
      'barrier wait 0.0 s | restart n/a | other n/a',
      'goodput: not split out: start-up; checkpoint restore; checkpoint saves; gaps between '
      'launches; closing']


def test_steps_fetched_together_split_at_their_returns(tmp_path):
  """Steps 2-4 fetched at once at 13: 2 and 3 end when they returned, 4 at the fetch."""
  rows = [{'step': 1, 'time_s': 10.0, 'returned_s': 9.0, 'start_unix_s': 0.0},
          {'step': 2, 'time_s': 13.0, 'returned_s': 11.0},
          {'step': 3, 'time_s': 13.0, 'returned_s': 12.0, 'held_up_by_compile': True},
          {'step': 4, 'time_s': 13.0, 'returned_s': 12.5}]
  tmp_path.joinpath('metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  g = report.goodput(tmp_path)  # steady: step 2 (1 s) and 4 (1 s); 1 and 3 train 1 s each
  assert g['badput_s']['compile'] == 9.0 and g['productive_s'] == 4.0 and g['wall_s'] == 13.0


def test_a_run_without_step_times_is_one_config_error(tmp_path):
  with pytest.raises(ConfigError, match=r'no metrics\.jsonl in'):
    report.goodput(tmp_path)
  (tmp_path / 'metrics.jsonl').write_text('{"step": 1, "loss": 2.0}\n')  # before time_s
  with pytest.raises(ConfigError, match=r'metrics\.jsonl:1: not a metrics line with time_s'):
    report.goodput(tmp_path)


def test_loss_curves_hold_the_evaluations(tmp_path):
  curves = report.load_loss(_write_run(tmp_path))
  assert curves.steps.tolist() == list(range(1, 9)) and curves.loss[1] == 1.0
  assert curves.eval_steps.tolist() == [4, 8] and curves.eval_loss.tolist() == [0.9, 0.7]
  assert report.plot_loss(curves, tmp_path / 'loss.png').read_bytes()[:4] == b'\x89PNG'


def test_the_report_prints_goodput_and_plots_the_loss(tmp_path, capsys):
  run_dir = _write_run(tmp_path / 'run')
  assert main([str(run_dir)]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[-6] == ('goodput 19.4% of 31.0 s (2 launches) | startup 2.0 s | compile 15.0 s | '
                     'checkpoint 0.8 s | barrier wait 2.0 s | restart 4.5 s | other 0.8 s')
  assert out[-5] == 'goodput: not split out: checkpoint restore'
  assert out[-1] == f'wrote {run_dir / "loss.png"}'
  assert (run_dir / 'loss.png').read_bytes()[:4] == b'\x89PNG'
  # Without telemetry (one process): the objective, the goodput line, and loss.png for the
  # evaluations.
  (run_dir / 'telemetry.jsonl').unlink()
  assert main([str(run_dir)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith('loss: 2 at step 1 → 0.25 at step 8')  # run.json names no schmp
  assert lines[1] == 'eval_loss: 0.9 at step 4 → 0.7 at step 8 (2 evaluations)'
  assert lines[2].startswith('goodput 25.8% of 31.0 s')  # no barrier wait without telemetry
  assert lines[-2:] == [f'wrote {run_dir / "objective.png"}', f'wrote {run_dir / "loss.png"}']
