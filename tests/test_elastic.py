"""Elastic runs without JAX in the workers: restarts, leaving a worker out, naming a stopped or
stuck worker, the watchdog's verdicts, and what a restarted train.py reads and writes.

The launched workers are tiny `python -c` programs, so each launch takes about a second.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from hetjax import ConfigError, balance, core, emulation, models, planner, runtime, sharding
from hetjax.run import _restarts as _elastic
from hetjax.runtime import _elastic_env, _verdict
from hetjax.runtime._launcher import _STOPPED_POLL_SECONDS, launch_local


def _elastic_launch(code: str, workers: int, **kwargs):
  out, said, results = io.StringIO(), [], []
  result = runtime.launch_elastic([sys.executable, '-c', textwrap.dedent(code)], workers,
                                  stdout=out, log=said.append,
                                  on_result=lambda _, r: results.append(r), timeout=60,
                                  **kwargs)
  return result, said, results, out.getvalue().splitlines()


FAIL_ONCE = """
    import os, sys
    attempt, me = os.environ['HETJAX_RESTART'], os.environ['HETJAX_WORKER_ID']
    print('attempt', attempt, 'hosts', os.environ.get('HETJAX_HOSTS'),
          'cause', os.environ.get('HETJAX_RESTART_CAUSE'))
    sys.exit(1 if (attempt, me) == ('0', '1') else 0)
"""


@pytest.mark.timeout(60)
def test_a_failed_job_is_restarted_with_its_attempt_and_cause():
  result, said, results, lines = _elastic_launch(FAIL_ONCE, 3, max_restarts=2)
  assert result.returncode == 0 and len(results) == 2
  assert results[0].failed_worker == 1 and results[0].detected_at is not None
  assert said == ['launch: worker 1 exited with status 1',
                  'launch: restart 1 of 2 on workers 0,1,2']
  assert sum('attempt 1 hosts None cause worker 1 exited with status 1' in x for x in lines) == 3


ALWAYS_FAILS_1 = """
    import os, sys
    print('attempt', os.environ['HETJAX_RESTART'], 'hosts', os.environ.get('HETJAX_HOSTS'),
          'of', os.environ['HETJAX_ORIGINAL_WORKERS'])
    sys.exit(1 if os.environ['HETJAX_WORKER_ID'] == '1' and
             os.environ.get('HETJAX_HOSTS') is None else 0)
"""


@pytest.mark.timeout(60)
def test_a_worker_failing_twice_in_a_row_is_left_out_down_to_min_workers():
  result, said, _, lines = _elastic_launch(ALWAYS_FAILS_1, 4, max_restarts=3, min_workers=3)
  assert result.returncode == 0
  assert said[2] == 'launch: worker 1 exited with status 1; worker 1 failed twice in a row: ' \
                    'left out'
  assert said[3] == 'launch: restart 2 of 3 on workers 0,2,3'
  # the workers keep their names (and lines) and learn their hosts
  assert '[w3] attempt 2 hosts 0,2,3 of 4' in lines and not any('[w1] attempt 2' in x
                                                                 for x in lines)
  # at min_workers nobody is left out: the restarts run out and the failure is the result
  result, said, _, _ = _elastic_launch(ALWAYS_FAILS_1, 4, max_restarts=2)
  assert result.returncode == 1 and result.failed_worker == 1 and 'left out' not in str(said)


@pytest.mark.timeout(60)
def test_bad_input_and_timeouts_are_not_restarted():
  result, said, results, _ = _elastic_launch('import sys; sys.exit(2)', 2, max_restarts=3)
  assert result.returncode == 2 and len(results) == 1 and said == []
  with pytest.raises(ConfigError, match='min workers'):
    _elastic_launch('pass', 2, min_workers=3)
  with pytest.raises(ConfigError, match='max restarts'):
    _elastic_launch('pass', 2, max_restarts=-1)


# Worker 1 leaves its pid and stops; the others wait until /proc shows it stopped (`is_stopped`,
# run from its file: no JAX import), then for the launcher to look: it reads /proc every
# _STOPPED_POLL_SECONDS of its clock, in the poll that reaps an exit, so 4 periods leave a margin.
STOP_ONE = """
    import os, runpy, signal, sys, time
    me, pid_file, verdict_py, look_s = os.environ['HETJAX_WORKER_ID'], *sys.argv[1:]
    if me == '1':
      with open(pid_file + '.tmp', 'w') as f:
        f.write(str(os.getpid()))
      os.replace(pid_file + '.tmp', pid_file)
      os.kill(os.getpid(), signal.SIGSTOP)
    else:
      is_stopped = runpy.run_path(verdict_py)['is_stopped']
      deadline = time.monotonic() + 20
      while not (os.path.exists(pid_file) and is_stopped(int(open(pid_file).read()))):
        if time.monotonic() > deadline:
          sys.exit('worker 1 did not stop within 20 s')
        time.sleep(0.01)
      time.sleep(4 * float(look_s))
    sys.exit(1 if me == '0' else 0)   # a peer fails after worker 1 stopped, as gloo's would
"""


@pytest.mark.timeout(60)
def test_a_stopped_worker_is_blamed_not_the_peer_that_failed_after_it(tmp_path):
  out = io.StringIO()
  command = [sys.executable, '-c', textwrap.dedent(STOP_ONE), str(tmp_path / 'pid'),
             _verdict.__file__, str(_STOPPED_POLL_SECONDS)]
  result = launch_local(command, 3, stdout=out, timeout=30)
  assert result.failed_worker == 1, result
  assert result.cause.startswith('worker 1 was stopped (SIGSTOP) for ')
  assert 'its peers failed waiting for it (worker 0 exited with status 1)' in result.cause


@pytest.mark.timeout(60)
def test_a_worker_stopped_for_the_stall_timeout_ends_the_job_and_is_named():
  code = 'import os, signal, time\nif os.environ["HETJAX_WORKER_ID"] == "2":\n' \
         '  os.kill(os.getpid(), signal.SIGSTOP)\ntime.sleep(30)'
  start = time.monotonic()
  result = launch_local([sys.executable, '-c', code], 3, stdout=io.StringIO(), timeout=30,
                        stall_timeout=1.5)
  assert result.returncode == 1 and result.failed_worker == 2
  assert 'worker 2 was stopped (SIGSTOP) for' in result.cause
  # 1.5 s + polling + the 3 s SIGTERM grace; the bound is under the 30 s the others sleep,
  # so the stall, not their sleep or the launch timeout, ended the job.
  assert time.monotonic() - start < 30 - 5


@pytest.mark.timeout(60)
def test_the_watchdogs_verdict_names_the_culprit():
  code = ('import os, sys\nfrom hetjax.runtime._verdict import write_verdict\n'
          'if os.environ["HETJAX_WORKER_ID"] == "0":\n'
          '  write_verdict(os.environ["HETJAX_VERDICT_DIR"], 2, "worker 2 made no progress")\n'
          '  sys.exit(3)\nimport time; time.sleep(30)')
  result = launch_local([sys.executable, '-c', code], 3, stdout=io.StringIO(), timeout=30)
  assert (result.returncode, result.failed_worker, result.cause) == (
      3, 2, 'worker 2 made no progress')


def test_is_stopped_reads_the_process_state():
  proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
  try:
    assert not _verdict.is_stopped(proc.pid)
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not _verdict.is_stopped(proc.pid) and time.monotonic() < deadline:
      time.sleep(0.01)
    assert _verdict.is_stopped(proc.pid)
  finally:
    proc.kill()
    proc.wait()
  assert not _verdict.is_stopped(proc.pid)
  assert _verdict.read_verdict(None) is None


def _watch(workers, reporting, steps, timeout_s=1.0):
  """Watchdogs for the ``reporting`` workers on one in-process channel; the others publish
  ``steps[w]`` once and nothing after (no heartbeat). Returns the first verdict."""
  channel, verdicts = runtime.LocalChannel(), []
  dogs = [runtime.ProgressWatchdog(channel, w, workers, timeout_s=timeout_s,
                                   on_stall=lambda *v: verdicts.append(v))
          for w in reporting]
  for w in range(workers):
    channel.set(f'progress/{w}', steps[w])
  deadline = time.monotonic() + 10
  while not verdicts and time.monotonic() < deadline:
    time.sleep(0.05)
  for dog in dogs:
    dog.close()
  return verdicts[0] if verdicts else None


@pytest.mark.timeout(30)
def test_the_watchdog_names_a_silent_worker_then_one_behind_then_nobody():
  worker, cause = _watch(3, reporting=[0, 2], steps=[5, 5, 5])
  assert worker == 1 and 'heartbeat stopped' in cause and 'after step 5' in cause
  worker, cause = _watch(3, reporting=[0, 1, 2], steps=[7, 6, 7])
  assert worker == 1 and 'while others finished step 7' in cause
  worker, cause = _watch(2, reporting=[0, 1], steps=[4, 4])
  assert worker is None and cause.startswith('no worker made progress for ')


def test_the_watchdog_is_not_armed_before_every_worker_finished_a_step():
  channel, verdicts = runtime.LocalChannel(), []
  dog = runtime.ProgressWatchdog(channel, 0, 2, timeout_s=0.5,
                                 on_stall=lambda *v: verdicts.append(v))
  channel.set('progress/0', 3)  # worker 1 still compiling
  time.sleep(1.5)  # not a wait: 3 timeouts in which no verdict may come (the thing tested)
  dog.close()
  assert verdicts == []


def test_a_subset_trace_keeps_each_remaining_workers_host():
  trace = emulation.parse_trace('static:1,2,3,4', 4)
  sub = emulation.subset(trace, (0, 2, 3))
  assert sub.workers == 3 and sub.factors(0).tolist() == [1, 3, 4] and sub.factor(1, 5) == 3
  assert emulation.subset(trace, range(4)) is trace
  with pytest.raises(ConfigError, match='not distinct workers'):
    emulation.subset(trace, (0, 4))


def test_the_restart_environment_is_checked(monkeypatch):
  monkeypatch.setenv('HETJAX_HOSTS', '0,2')
  assert runtime.hosts(2) == (0, 2)
  with pytest.raises(ConfigError, match='does not name 3 distinct'):
    runtime.hosts(3)
  monkeypatch.setenv('HETJAX_RESTART', 'x')
  with pytest.raises(ConfigError, match='HETJAX_RESTART'):
    runtime.restart_attempt()
  monkeypatch.setenv('HETJAX_STALL_TIMEOUT', '-1')
  with pytest.raises(ConfigError, match='positive'):
    _elastic_env.stall_timeout()


def _lines(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))


def test_a_restart_trims_lost_steps_and_records_them(tmp_path, monkeypatch):
  monkeypatch.setenv('HETJAX_RESTART', '1')
  monkeypatch.setenv('HETJAX_RESTART_CAUSE', 'worker 2 was killed by SIGKILL')
  _lines(tmp_path / 'metrics.jsonl', [{'step': s, 'loss': 1.0} for s in range(1, 15)])
  with (tmp_path / 'metrics.jsonl').open('a') as f:
    f.write('{"step": 15, "lo')  # cut short by the kill
  _lines(tmp_path / 'telemetry.jsonl', [{'step': s, 'worker': w} for s in range(1, 13)
                                        for w in range(2)])
  row = _elastic.record_restart(tmp_path, 10, workers=2)
  assert (row['steps_lost'], row['last_logged_step'], row['resumed_from']) == (4, 14, 10)
  steps = [json.loads(x)['step'] for x in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert steps == list(range(1, 11))
  assert _elastic.summary_fields(tmp_path) == {
      'restarts': 1, 'steps_lost': [4], 'restart_causes': ['worker 2 was killed by SIGKILL']}
  _elastic.record_restart(tmp_path, 10, workers=1)  # now 1 worker: 2-worker telemetry moves
  assert not (tmp_path / 'telemetry.jsonl').exists()
  assert (tmp_path / 'telemetry-upto-10.jsonl').exists()


def test_shares_on_fewer_workers_start_from_the_survivors_measured_speeds(tmp_path, monkeypatch):
  monkeypatch.setenv('HETJAX_HOSTS', '0,2')
  rows = [{'step': s, 'worker': w, 'share': 64, 'compute_s': 0.01 * (1 + w), 'dilation_s': 0.0,
           'step_s': 0.05, 'load': 1.0} for s in range(1, 21) for w in range(3)]
  _lines(tmp_path / 'telemetry.jsonl', rows)
  policy = balance.Proportional(core.ShareRules(192, 2))
  saved = {'step': 20, 'layout': {'workers': 3, 'hosts': [0, 1, 2]}}
  ctx = runtime.WorkerContext(0, 2, None)
  state = _elastic.reseed_policy(policy, saved, tmp_path, ctx, None)
  shares = policy.update(state, None)[0]
  assert list(shares) == [144, 48]  # hosts 0 and 2: speeds 1 : 1/3
  assert _elastic.reseed_policy(policy, {**saved, 'step': 0}, tmp_path, ctx, None) is None
  assert np.isfinite(state.speeds).all()


@pytest.mark.timeout(120)
def test_a_plan_for_more_devices_is_searched_again_for_the_devices_left(capsys):
  task = models.make_task('wide_deep')
  names = list(sharding.submodel_names(task.make_model))
  old = planner.Plan.from_json({'name': 'sixteen', 'devices': 16,
                                'submodels': {'*': {'data': 16, 'tensor': 1}}}, names)
  plan = _elastic.replan(old, task, 256, runtime.WorkerContext(0, 1, None), None)
  assert plan.devices == jax.device_count() and [s.name for s in plan.submodels] == names
  assert capsys.readouterr().out.startswith(
      f"plan: 'sixteen' is for 16 devices; re-searched for the {jax.device_count()} left: ")


def test_a_restart_resumes_only_from_a_complete_checkpoint(tmp_path, monkeypatch):
  (tmp_path / 'checkpoints' / '10.orbax-checkpoint-tmp-1').mkdir(parents=True)
  (tmp_path / 'checkpoints' / 'replica-0').mkdir()
  assert not _elastic.auto_resume(False, tmp_path)  # the first launch: only --resume resumes
  monkeypatch.setenv('HETJAX_RESTART', '1')
  assert not _elastic.auto_resume(False, tmp_path)  # nothing complete: start over
  (tmp_path / 'checkpoints' / 'replica-0' / '10').mkdir()
  assert _elastic.auto_resume(False, tmp_path)
