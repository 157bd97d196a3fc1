"""hetjax.launch: the worker environment, prefixed output, teardown on failure, timeout and Ctrl-C.

The workers are tiny `python -c` programs (no JAX), so each launch takes well under a second
unless a test waits on purpose (the 3 s SIGTERM grace).
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hetjax import launch
from hetjax._errors import ConfigError
from hetjax.runtime._launcher import LaunchResult, find_free_ports, launch_local

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINE = re.compile(r'\[w(\d+)\] (.*)')


def _launch(code: str, workers: int, **kwargs) -> tuple[LaunchResult, list[str], float]:
  """Runs ``code`` as ``workers`` processes; returns the result, the output lines and seconds."""
  out = io.StringIO()
  start = time.monotonic()
  result = launch_local([sys.executable, '-c', textwrap.dedent(code)], workers, stdout=out,
                        **kwargs)
  return result, out.getvalue().splitlines(), time.monotonic() - start


def _pids(lines: list[str], tag: str) -> list[int]:
  """The pids that workers printed as ``tag <pid>``."""
  return [int(m[2].split()[1]) for m in map(LINE.fullmatch, lines) if m[2].startswith(tag + ' ')]


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:  # a killed grandchild may stay a zombie until init reaps it: it is not running
    return pathlib.Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def _assert_gone(pids: list[int]) -> None:
  assert pids
  deadline = time.monotonic() + 2.0  # SIGKILL is delivered asynchronously
  while any(map(_running, pids)) and time.monotonic() < deadline:
    time.sleep(0.02)
  assert not [pid for pid in pids if _running(pid)], 'processes left running'


def test_find_free_ports_are_distinct_and_a_busy_range_is_a_config_error():
  ports = find_free_ports(8)
  assert len(set(ports)) == 8 and all(0 < p < 65536 for p in ports)
  with socket.socket() as busy:
    busy.bind(('127.0.0.1', 0))
    port = busy.getsockname()[1]
    with pytest.raises(ConfigError, match=f'found 0 free ports in port range {port}-{port}'):
      find_free_ports(1, (port, port))
  with pytest.raises(ConfigError, match='but need 3'):
    find_free_ports(3, (port, port + 1))
  for bad in [(10, 5), (0, 10), (60000, 70000)]:
    with pytest.raises(ConfigError, match='not LOW-HIGH within 1-65535'):
      find_free_ports(1, bad)


def test_slowdown_validator_runs_before_any_worker_starts():
  seen = []

  def validate(spec):
    seen.append(spec)
    raise ConfigError(f'bad slowdown {spec!r}')

  with pytest.raises(ConfigError, match="bad slowdown 'x3'"):
    launch_local(['false'], 2, slowdown='x3', timeout=5, validate_slowdown=validate)
  assert seen == ['x3']


ENV_KEYS = ['HETJAX_COORDINATOR', 'HETJAX_NUM_WORKERS', 'HETJAX_WORKER_ID',
            'HETJAX_TRANSFER_ADDRESS', 'HETJAX_SLOWDOWN', 'HETJAX_INIT_TIMEOUT',
            'JAX_NUM_CPU_DEVICES', 'JAX_CPU_COLLECTIVES_IMPLEMENTATION', 'PYTHONUNBUFFERED',
            'FROM_PARENT']
PRINT_ENV = f'import json, os; print(json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS}}}))'


def _envs(lines: list[str]) -> dict[int, dict]:
  envs = {int(m[1]): json.loads(m[2]) for m in map(LINE.fullmatch, lines)}
  assert all(env['HETJAX_WORKER_ID'] == str(i) for i, env in envs.items())
  return envs


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_every_worker_gets_the_environment_contract():
  result, lines, _ = _launch(PRINT_ENV, 3, devices_per_worker=2, slowdown='1,2,4',
                             init_timeout=7.5, timeout=30,
                             env={**os.environ, 'FROM_PARENT': 'kept'})
  assert result == LaunchResult(0, None, 'all workers exited with status 0')
  envs = _envs(lines)
  assert sorted(envs) == [0, 1, 2]
  [coordinator] = {env['HETJAX_COORDINATOR'] for env in envs.values()}
  transfer = [env['HETJAX_TRANSFER_ADDRESS'] for env in envs.values()]
  assert all(re.fullmatch(r'127\.0\.0\.1:\d+', a) for a in [coordinator, *transfer])
  assert len({a.split(':')[1] for a in [coordinator, *transfer]}) == 4
  same = {'HETJAX_NUM_WORKERS': '3', 'HETJAX_SLOWDOWN': '1,2,4', 'HETJAX_INIT_TIMEOUT': '7.5',
          'JAX_NUM_CPU_DEVICES': '2', 'JAX_CPU_COLLECTIVES_IMPLEMENTATION': 'gloo',
          'PYTHONUNBUFFERED': '1', 'FROM_PARENT': 'kept'}
  assert all(env.items() >= same.items() for env in envs.values())


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_optional_variables_are_unset_and_ports_come_from_the_range():
  env = {k: v for k, v in os.environ.items() if not k.startswith('HETJAX_')}
  result, lines, _ = _launch(PRINT_ENV, 2, port_range=(24000, 24999), timeout=30, env=env,
                             devices_per_worker=(1, 3))  # unequal workers: a count each
  assert result.returncode == 0
  for i, worker in _envs(lines).items():
    assert worker['HETJAX_SLOWDOWN'] is None and worker['HETJAX_INIT_TIMEOUT'] is None
    assert worker['JAX_NUM_CPU_DEVICES'] == ('1', '3')[i]
    for key in ['HETJAX_COORDINATOR', 'HETJAX_TRANSFER_ADDRESS']:
      assert 24000 <= int(worker[key].split(':')[1]) <= 24999


PRINT_CPUS = """
    import os, threading
    thread = threading.Thread(target=lambda: print('thread', sorted(os.sched_getaffinity(0))))
    thread.start()
    thread.join()
    print('main', os.environ['HETJAX_WORKER_ID'], sorted(os.sched_getaffinity(0)))
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, 'sched_setaffinity'), reason='Linux only')
def test_pinned_workers_run_on_one_cpu_each_round_robin_and_the_launcher_keeps_its_own():
  mine = sorted(os.sched_getaffinity(0))
  result, lines, _ = _launch(PRINT_CPUS, 3, timeout=30, pin_cores=True)
  assert result.returncode == 0
  seen = [m[2].split(' ', 2) for m in map(LINE.fullmatch, lines) if m]
  main = {int(w): cpus for tag, w, cpus in (x for x in seen if x[0] == 'main')}
  assert main == {i: str([mine[i % len(mine)]]) for i in range(3)}
  threads = sorted(' '.join(x[1:]) for x in seen if x[0] == 'thread')  # a worker's new threads
  assert threads == sorted(str([mine[i % len(mine)]]) for i in range(3))
  assert sorted(os.sched_getaffinity(0)) == mine
  result, lines, _ = _launch(PRINT_CPUS, 2, timeout=30)  # not pinned: every CPU
  assert sorted(m[2].split(' ', 2)[2] for m in map(LINE.fullmatch, lines)
                if m and m[2].startswith('main')) == [str(mine)] * 2


def test_pinning_where_the_platform_cannot_is_one_line(monkeypatch):
  from hetjax.runtime import _affinity
  monkeypatch.delattr(_affinity.os, 'sched_setaffinity', raising=False)
  with pytest.raises(ConfigError, match=r'^pinning workers to cores needs os.sched_setaffinity'):
    _affinity.worker_cpus(2)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_stdout_and_stderr_lines_are_prefixed_with_the_worker(tmp_path):
  result, lines, _ = _launch(r"""
      import os, sys
      i = os.environ['HETJAX_WORKER_ID']
      sys.stdout.write(f'out {i}\nsecond {i}\n')
      sys.stderr.write(f'err {i}\n')
      sys.stderr.write(f'[Gloo] Rank {i} is connected to 1 peer ranks. Expected number of '
                       'connected peer ranks is : 1\n')  # chatter: the log keeps it (issue 44)
      sys.stdout.buffer.write(b'bad \xff byte\n')
      sys.stdout.write(f'tail {i}')  # no newline at the end
      """, 2, timeout=30, log_dir=tmp_path)
  assert result.returncode == 0
  for i in range(2):
    for text in [f'out {i}', f'second {i}', f'err {i}', 'bad \ufffd byte', f'tail {i}']:
      assert f'[w{i}] {text}' in lines
  assert len(lines) == 10 and all(LINE.fullmatch(line) for line in lines)
  logged = (tmp_path / 'launch.log').read_text()
  assert all(f'[w{i}] [Gloo] Rank {i} is connected to 1 peer' in logged for i in range(2))


SLEEPER = """
    import os, signal, subprocess, sys, time
    i = int(os.environ['HETJAX_WORKER_ID'])
    print('worker', os.getpid(), flush=True)
    """


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize('death, expected', [
    ('sys.exit(3)', LaunchResult(3, 2, 'worker 2 exited with status 3')),
    ('os.kill(os.getpid(), signal.SIGKILL)',
     LaunchResult(128 + 9, 2, 'worker 2 was killed by SIGKILL')),
])
def test_a_failing_worker_stops_the_others_and_is_named(death, expected, tmp_path):
  result, lines, seconds = _launch(SLEEPER + f"""
    pathlib = __import__('pathlib')
    (pathlib.Path({str(tmp_path)!r}) / str(i)).touch()
    if i == 2:  # once the others are up (their pids printed)
      while len(list(pathlib.Path({str(tmp_path)!r}).iterdir())) < 3:
        time.sleep(0.02)
      {death}
    time.sleep(60)
    """, 3, timeout=30)
  assert result == expected
  # The others sleep 60 s: stopped, not waited for, the job ends in a fraction of that.
  assert seconds < 60 / 2
  _assert_gone(_pids(lines, 'worker'))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_grandchildren_of_failed_and_stopped_workers_are_killed(tmp_path):
  result, lines, seconds = _launch(SLEEPER + f"""
    child = subprocess.Popen(['sleep', '60'])  # holds the worker's stdout open too
    print('grandchild', child.pid, flush=True)
    pathlib = __import__('pathlib')
    (pathlib.Path({str(tmp_path)!r}) / str(i)).touch()
    if i == 1:
      while len(list(pathlib.Path({str(tmp_path)!r}).iterdir())) < 2:
        time.sleep(0.02)
      sys.exit(1)
    time.sleep(60)
    """, 2, timeout=30)
  assert result == LaunchResult(1, 1, 'worker 1 exited with status 1')
  assert seconds < 60 / 2  # the survivor and the grandchildren sleep 60 s: stopped, not waited
  assert len(_pids(lines, 'grandchild')) == 2
  _assert_gone(_pids(lines, 'grandchild') + _pids(lines, 'worker'))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_timeout_stops_everything_even_a_worker_that_ignores_sigterm():
  result, lines, seconds = _launch(SLEEPER + """
    child = subprocess.Popen(['sleep', '60'])
    print('grandchild', child.pid, flush=True)
    if i == 0:
      signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
    """, 2, timeout=1.0)
  assert result == LaunchResult(124, None, 'timed out after 1 s; stopped all workers')
  # SIGTERM, a 3 s grace, then SIGKILL: at least the timeout and the grace, and well under
  # the 60 s the workers (one deaf to SIGTERM) and their children would sleep.
  assert 1.0 + 3.0 <= seconds < 60 / 2
  _assert_gone(_pids(lines, 'grandchild') + _pids(lines, 'worker'))


def _cli(*args: str) -> list[str]:
  return [sys.executable, '-m', 'hetjax.launch', *args]


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize('sig, status, message', [
    (signal.SIGINT, 130, 'launch: interrupted'),
    (signal.SIGTERM, 143, 'launch: interrupted by SIGTERM'),
    (signal.SIGHUP, 129, 'launch: interrupted by SIGHUP'),
])
def test_a_signal_to_the_launcher_stops_every_worker(sig, status, message):
  code = 'import os, time; print("worker", os.getpid(), flush=True); time.sleep(60)'
  command = _cli('--workers', '2', '--timeout', '30', '--', sys.executable, '-c', code)
  with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True) as proc:
    try:
      lines = [proc.stdout.readline().rstrip('\n') for _ in range(2)]  # both workers are up
      start = time.monotonic()
      proc.send_signal(sig)
      out, err = proc.communicate(timeout=15)
    finally:
      proc.kill()  # a no-op once it has exited
  assert proc.returncode == status, (out, err)
  assert err.splitlines() == [message]
  assert time.monotonic() - start < 5
  _assert_gone(_pids(lines, 'worker'))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_workers_exit_when_the_launcher_is_sigkilled():
  """A SIGKILLed launcher cannot stop its workers; they notice it is gone and exit."""
  code = ('import os, sys, time; sys.path.insert(0, os.getcwd()); from hetjax import runtime; '
          'runtime.initialize(init_timeout_s=60); print("worker", os.getpid(), flush=True); '
          'time.sleep(60)')
  command = _cli('--workers', '2', '--timeout', '90', '--', sys.executable, '-c', code)
  with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        text=True) as proc:
    try:
      lines = [proc.stdout.readline().rstrip('\n') for _ in range(2)]  # both joined the job
      proc.kill()
      proc.wait(timeout=10)
    finally:
      proc.kill()
  pids = _pids(lines, 'worker')
  assert len(pids) == 2, lines
  deadline = time.monotonic() + 5.0  # the watch polls every second
  while any(map(_running, pids)) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not [pid for pid in pids if _running(pid)], 'workers outlived their launcher'


GPUS = 'CUDA_VISIBLE_DEVICES=0,1'
BAD_INPUT = {  # name: (arguments, the error line says); GPUS marks the one case that sets it
    'zero workers': ('--workers 0 -- true', 'workers must be between 1 and 1024, got 0'),
    'too many workers': ('--workers 1025 -- true', 'got 1025'),
    'zero devices': ('--workers 2 --devices-per-worker 0 -- true',
                     'devices per worker must be at least 1, got 0'),
    'nothing after --': ('--workers 2 --', 'no command given'),
    'no --': ('--workers 2', 'no command given'),
    'port range syntax': ('--workers 2 --port-range 24000:25000 -- true',
                          "port range '24000:25000' is not LOW-HIGH"),
    'more workers than ports': ('--workers 4 --port-range 24000-24001 -- true',
                                'in port range 24000-24001 but need 5'),
    'zero timeout': ('--workers 2 --timeout 0 -- true', 'timeout must be a positive number'),
    'negative init timeout': ('--workers 2 --init-timeout -1 -- true',
                              'init timeout must be a positive number'),
    'workers not a number': ('--workers two -- true', "--workers: invalid int value: 'two'"),
    'missing --workers': ('-- true', 'give --workers N (or --devices D0,D1,… with one count'),
    'devices not numbers': ('--devices 2,one -- true', "--devices '2,one' is not comma-separated"),
    'devices and workers disagree': ('--workers 2 --devices 2,1,1 -- true',
                                     '--workers 2 but --devices lists 3 workers'),
    'devices twice': ('--devices 2,1 --devices-per-worker 2 -- true',
                      'give --devices-per-worker or --devices, not both'),
    'a worker without devices': ('--devices 2,0 -- true',
                                 'every worker needs at least 1 device, got [2, 0]'),
    'unequal workers than GPUs': (f'{GPUS} --devices 2,1 -- true',
                                  "with [2, 1] devices need 3 GPUs"),
    'empty slowdown': ('--workers 1 --slowdown= -- true', 'slowdown spec is empty'),
    'more workers than GPUs': (f'{GPUS} --workers 2 --devices-per-worker 2 -- true',
                               "need 4 GPUs but CUDA_VISIBLE_DEVICES='0,1' lists 2"),
    'no such program': ('--workers 1 -- /nonexistent/program',
                        'cannot start worker 0: /nonexistent/program: No such file or directory'),
    'negative restarts': ('--workers 2 --max-restarts -1 -- true',
                          'max restarts must be a non-negative integer, got -1'),
    'more min workers than workers': ('--workers 2 --min-workers 3 -- true',
                                      'min workers must be between 1 and the 2 workers, got 3'),
    'zero stall timeout': ('--workers 2 --stall-timeout 0 -- true',
                           'stall timeout must be a positive number of seconds'),
    'empty log dir': ('--workers 2 --log-dir= -- true', '--log-dir is empty'),
    'log dir under a file': ('--workers 1 -- true --workdir=/dev/null/run',
                             'cannot write the launch log /dev/null/run/launch.log: Not a '
                             'directory'),
}


def _check_usage_error(status: int | str | None, out: str, err: str, fragment: str) -> None:
  assert status == 2 and out == '', (status, out, err)
  [line] = err.splitlines()
  assert line.startswith('launch: error: ') and fragment in line, line


@pytest.mark.parametrize('name', list(BAD_INPUT))
def test_bad_input_is_one_error_line_and_status_2(monkeypatch, capsys, name):
  args, fragment = BAD_INPUT[name]
  monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
  if args.startswith(GPUS):
    monkeypatch.setenv(*GPUS.split('='))
  with pytest.raises(SystemExit) as exited:
    launch.main(args.removeprefix(GPUS).split())
  _check_usage_error(exited.value.code, *capsys.readouterr(), fragment)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_bad_input_on_the_command_line_exits_2_without_a_traceback():
  """One case per error path, run in parallel: each start pays ~1 s for `import jax`."""
  env = {k: v for k, v in os.environ.items() if k != 'CUDA_VISIBLE_DEVICES'}
  names = ['workers not a number', 'no --', 'more workers than ports', 'no such program']
  procs = [subprocess.Popen(_cli(*BAD_INPUT[name][0].split()), cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name in names]
  for name, proc in zip(names, procs, strict=True):
    with proc:
      out, err = proc.communicate(timeout=50)
    _check_usage_error(proc.returncode, out, err, BAD_INPUT[name][1])


def test_the_command_line_passes_per_worker_device_counts_on(monkeypatch):
  got = []
  monkeypatch.setattr(launch, 'launch_elastic',
                      lambda *a, **k: got.append(a) or LaunchResult(0, None, 'ok'))
  assert launch.main(['--devices', '2,1,1', '--', 'true']) == 0
  assert launch.main(['--workers', '2', '--devices-per-worker', '3', '--', 'true']) == 0
  assert [a[1:3] for a in got] == [(3, (2, 1, 1)), (2, 3)]


def test_the_command_line_passes_pin_cores_on(monkeypatch):
  got = []
  monkeypatch.setattr(launch, 'launch_elastic',
                      lambda *a, **k: got.append(k) or LaunchResult(0, None, 'ok'))
  assert launch.main(['--workers', '2', '--', 'true']) == 0
  assert launch.main(['--workers', '2', '--pin-cores', '--', 'true']) == 0
  assert [k['pin_cores'] for k in got] == [False, True]
