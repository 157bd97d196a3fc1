"""What a launch prints when a worker fails: the healthy lines, then the cause and one line per
worker, with every line of every worker in the launch log (`hetjax.runtime._console`).

The console cases run on a scripted clock; the launched ones are tiny `python -c` workers.
"""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from hetjax import ConfigError, launch
from hetjax.runtime._console import LINGER_S, Console
from hetjax.runtime._launcher import LaunchResult, launch_local

ROOT = pathlib.Path(__file__).resolve().parents[1]


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def _console():
  out, log, clock = io.StringIO(), io.StringIO(), _Clock()
  console = Console(out, log, clock)
  return console, out, log, clock


TRACEBACK = ['Traceback (most recent call last):', '  File "train.py", line 3, in <module>',
             "    raise ValueError('boom')", 'ValueError: boom']


def test_a_traceback_is_held_back_and_shown_when_the_worker_goes_on():
  console, out, log, clock = _console()
  w0, w1 = console.add('w0'), console.add('w1')
  console.write(w0, 'step 1')
  for line in TRACEBACK:
    console.write(w1, line)
  console.write(w0, 'step 2')
  assert out.getvalue().splitlines() == ['[w0] step 1', '[w0] step 2']
  clock.now = LINGER_S + 1  # still running long after: an error it recovered from
  console.write(w1, 'retrying')
  assert out.getvalue().splitlines()[2:] == [f'[w1] {x}' for x in [*TRACEBACK, 'retrying']]
  assert len(log.getvalue().splitlines()) == 7
  assert console.error(w1) == 'ValueError: boom' and console.tracebacks() == {w1: 0.0}


def test_held_lines_come_out_when_the_worker_exits_0_and_never_once_the_job_failed():
  console, out, _, _ = _console()
  w0, w1, w2 = console.add('w0'), console.add('w1'), console.add('w2')
  console.write(w0, 'E1127 00:07:23.857599   12306 agent.cc:289] a transient error')
  console.end(w0, 0)
  assert out.getvalue() == '[w0] E1127 00:07:23.857599   12306 agent.cc:289] a transient error\n'
  console.write(w1, 'F1127 00:07:23.857868   12306 client.h:80] Terminating process because')
  console.end(w1, -6)  # the job failed: nothing more on the console
  console.write(w2, 'step 3')
  console.end(w2, 0)
  assert len(out.getvalue().splitlines()) == 1
  assert console.error(w1) == 'Terminating process because' and console.error(w2) is None
  assert console.last(w2) == 'step 3'


def test_gloo_connection_chatter_goes_to_the_log_only():
  """Issue 44: every launch printed one ``[Gloo] Rank N is connected …`` line per worker."""
  console, out, log, _ = _console()
  w0, w1 = console.add('w0'), console.add('w1')
  for w in (w0, w1):
    console.write(w, f'[Gloo] Rank {w} is connected to 1 peer ranks. Expected number of '
                     'connected peer ranks is : 1')
    console.write(w, f'step 1 of worker {w}')
  console.write(w0, '[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected '
                    'peer ranks is : 3')  # a rank short of its peers is news, not chatter
  console.write(w1, '[Gloo] AllGather failed')
  assert out.getvalue().splitlines() == [
      '[w0] step 1 of worker 0', '[w1] step 1 of worker 1',
      '[w0] [Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer '
      'ranks is : 3', '[w1] [Gloo] AllGather failed']
  logged = log.getvalue().splitlines()
  assert len(logged) == 6 and sum('is connected to 1 peer ranks' in x for x in logged) == 3


def test_the_error_is_the_exception_the_last_traceback_ended_with():
  console, *_ = _console()
  w = console.add('w0')
  for line in ['E1127 00:00:00.000001 1 a.cc:1] first error',
               'F1127 00:00:00.000002 1 a.cc:2] fatal', *TRACEBACK, '',
               'During handling of the above exception, another exception occurred:', '',
               'Traceback (most recent call last):', '  File "x.py", line 1',
               'jaxlib.XlaRuntimeError: INTERNAL: lost peer', 'more of the message']:
    console.write(w, line)
  assert console.error(w) == 'jaxlib.XlaRuntimeError: INTERNAL: lost peer'
  console, *_ = _console()
  w = console.add('w0')
  console.write(w, 'E1127 00:00:00.000001 1 a.cc:1] an error')
  console.write(w, 'F1127 00:00:00.000002 1 a.cc:2] the fatal one')
  assert console.error(w) == 'the fatal one'


# Worker 1 raises and stays alive (as JAX keeps it in its shutdown barrier); its peers then fail
# with what a lost peer makes a JAX job print, and exit first. The peers ignore the launcher's
# SIGTERM (its 3-s grace lets them fail on their own): on a loaded machine one peer can still be
# sleeping when the other's exit ends the job, and stopped then, it would print nothing to name
# (a fresh clone's suite on 2 cores). Worker 1 raises once all three are up, and its marker
# appears once its traceback is out (atexit runs after it is printed; the last registered first).
RAISES = """
    import atexit, os, pathlib, signal, sys, time
    i, marker = os.environ['HETJAX_WORKER_ID'], pathlib.Path(sys.argv[1]) / 'raised'
    if i != '1':
      signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print('ready', i, flush=True)
    (pathlib.Path(sys.argv[1]) / f'ready-{i}').touch()
    if i == '1':
      while len(list(pathlib.Path(sys.argv[1]).glob('ready-*'))) < 3:
        time.sleep(0.02)
      atexit.register(time.sleep, 30)
      atexit.register(marker.touch)
      def train():
        raise ValueError('boom')
      train()
    while not marker.exists():
      time.sleep(0.02)
    time.sleep(2.5)  # the launcher names a traceback printed at least 1 s before the first exit
    for k in range(12):
      print(f'E1127 00:07:23.85{k:04d}   12306 coordination_service_agent.cc:289] Polled an '
            'error from coordination service', flush=True)
      print('Barrier result: DEADLINE_EXCEEDED: Barrier timed out.', flush=True)
    def step():
      raise RuntimeError('Gloo AllGather failed: Connection closed by peer')
    step()
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_failed_job_prints_one_line_per_worker_and_logs_everything(tmp_path):
  workdir = tmp_path / 'run'
  command = [sys.executable, '-m', 'hetjax.launch', '--workers', '3', '--timeout', '30', '--',
             sys.executable, '-c', textwrap.dedent(RAISES), str(tmp_path), f'--workdir={workdir}']
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=50)
  assert proc.returncode == 1, (proc.stdout, proc.stderr)
  assert sorted(proc.stdout.splitlines()) == ['[w0] ready 0', '[w1] ready 1', '[w2] ready 2']
  err = proc.stderr.splitlines()
  assert len(err) <= 3 + 3, err  # the cause, a line per worker, the log
  assert err[0].startswith('launch: worker 1 raised ValueError: boom; its peers failed after it '
                           '(worker '), err
  # Workers 0 and 2 fail alike: the first to exit ends the job, and the other, ignoring the
  # launcher's SIGTERM (RAISES), exits on its own within its grace; each line names its cause.
  gloo = '(RuntimeError: Gloo AllGather failed: Connection closed by peer)'
  peers = {f'launch:   worker {w}: {how} {gloo}' for w in (0, 2)
           for how in ('exited with status 1', 'stopped by the launcher')}
  assert err[2] == 'launch:   worker 1: stopped by the launcher (ValueError: boom)', err
  assert {err[1], err[3]} <= peers and 'worker 0' in err[1] and 'worker 2' in err[3], err
  assert 'exited with status 1' in err[1] + err[3], err  # the first exit ended the job
  log = workdir / 'launch.log'
  assert err[4] == f'launch: the full output of every worker: {log}'
  logged = log.read_text().splitlines()
  start = logged.index('[w1] Traceback (most recent call last):')
  assert logged[start + 1].startswith('[w1]   File "<string>", line ')
  assert '[w1] ValueError: boom' in logged[start:]
  assert sum('] Polled an error' in x for x in logged) == 24
  assert sum(x == '[w0] RuntimeError: Gloo AllGather failed: Connection closed by peer'
             for x in logged) == 1
  assert logged[-4:-3] == ['# ' + err[0].removeprefix('launch: ')]


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_worker_that_raised_and_lingered_is_named_with_its_exception():
  code = ('import atexit, os, time\nif os.environ["HETJAX_WORKER_ID"] == "1":\n'
          '  atexit.register(time.sleep, 2.5)\n  raise ValueError("boom")\ntime.sleep(30)')
  result = launch_local([sys.executable, '-c', code], 2, stdout=io.StringIO(), timeout=30)
  try:
    assert result == LaunchResult(1, 1, 'worker 1 raised ValueError: boom, then exited with '
                                         'status 1')
  finally:
    shutil.rmtree(os.path.dirname(result.log))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_without_a_log_dir_the_log_is_kept_only_when_the_job_failed():
  code = ('import os, sys, time\nif os.environ["HETJAX_WORKER_ID"] == "1":\n'
          '  print("bad input", flush=True)\n  sys.exit(2)\ntime.sleep(30)')
  out = io.StringIO()
  result = launch_local([sys.executable, '-c', code], 2, stdout=out, timeout=30)
  try:
    assert (result.returncode, result.failed_worker) == (2, 1)
    assert result.workers == ('worker 0: stopped by the launcher',
                              'worker 1: exited with status 2 (bad input)')
    assert pathlib.Path(result.log).read_text().count('[w1] bad input') == 1
  finally:
    assert os.path.basename(os.path.dirname(result.log)).startswith('hetjax-launch-')
    shutil.rmtree(os.path.dirname(result.log))
  result = launch_local([sys.executable, '-c', 'print("fine")'], 1, stdout=out, timeout=30)
  assert result.returncode == 0 and result.log is None and result.workers == ()


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_log_in_a_run_directory_the_job_deleted_is_written_again(tmp_path):
  """train.py --overwrite deletes the run directory the log is in, after the launch began."""
  run = tmp_path / 'run'
  code = f'import shutil; shutil.rmtree({str(run)!r}); print("after", flush=True)'
  result = launch_local([sys.executable, '-c', code], 1, stdout=io.StringIO(), timeout=30,
                        log_dir=run)
  assert result.returncode == 0 and result.log == str(run / 'launch.log')
  lines = (run / 'launch.log').read_text().splitlines()
  assert lines[0].startswith('# ') and '[w0] after' in lines


def test_the_log_dir_is_the_commands_workdir_unless_given():
  assert launch.log_dir(None, ['python', 'train.py', '--workdir', 'runs/a', '--workdir=runs/b']) \
      == 'runs/b'
  assert launch.log_dir('logs', ['python', 'train.py', '--workdir=runs/b']) == 'logs'
  assert launch.log_dir(None, ['python', 'train.py', '--workdir=']) is None
  assert launch.log_dir(None, ['python', 'train.py', '--workdir']) is None
  with pytest.raises(ConfigError, match='--log-dir is empty'):
    launch.log_dir(' ', [])
