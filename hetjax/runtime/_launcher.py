"""Starts N local worker processes for one multi-process JAX job, and never leaves one behind.

One process per worker on one machine is how hetjax tests and benchmarks heterogeneity. Each
worker gets its base environment plus what `jax.distributed` and hetjax read::

  HETJAX_COORDINATOR=127.0.0.1:P          the same for every worker
  HETJAX_NUM_WORKERS=N  HETJAX_WORKER_ID=i
  HETJAX_TRANSFER_ADDRESS=127.0.0.1:Q_i   a different port per worker
  HETJAX_SLOWDOWN=spec  HETJAX_INIT_TIMEOUT=seconds   only when given
  HETJAX_NETWORK=spec                     emulated links, only when given
  HETJAX_NUM_SERVERS=K                    a parameter-server job: the last K processes are servers
  HETJAX_LAUNCHER_PID=pid                 a worker exits when this process is gone
  HETJAX_VERDICT_DIR=dir                  where the stall watchdog names a stuck worker
  HETJAX_HOSTS=0,1,3                      the workers' original ids, when some were left out
  JAX_NUM_CPU_DEVICES=D  JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo  PYTHONUNBUFFERED=1

With ``pin_cores`` each worker process runs on one core, dealt round robin (`_affinity`): what
emulated hosts need when the workers outnumber the cores.

Every line a process prints goes to the launch log (``launch.log`` in ``log_dir``); to the
console only while the job is healthy (`hetjax.runtime._console`). When the job fails, the
result carries one line per process and the log's path instead of the peers' tracebacks.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import itertools
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from hetjax._checks import between, positive_seconds
from hetjax._errors import ConfigError
from hetjax.runtime._affinity import affinity_for_children, worker_cpus
from hetjax.runtime._console import LINGER_S, Console
from hetjax.runtime._elastic_env import ENV_HOSTS, ENV_VERDICT_DIR
from hetjax.runtime._verdict import is_stopped, read_verdict

MAX_WORKERS = 1024
_POLL_SECONDS = 0.05
_GRACE_SECONDS = 3.0
_DRAIN_SECONDS = 1.0  # a failed worker's output still in its pipe (unless a process escaped)
_STOPPED_POLL_SECONDS = 0.25
#: A traceback printed at least this long before the first process exited started the failure
#: (its peers' own tracebacks come after that exit).
_RAISED_BEFORE_S = 1.0
#: The most of a worker's own error that its verdict line quotes.
_ERROR_CHARS = 100
LOG_FILE = 'launch.log'
#: A process stopped (SIGSTOP) this long is named and the job ended, when no stall timeout is
#: given: JAX's coordination service ends its peers about as soon (its 10 s heartbeat timeout).
DEFAULT_STOPPED_SECONDS = 10.0
_LIVE_GROUPS: set[int] = set()  # process groups whose leader is not reaped yet
_SIGNAL_NAMES = {s.value: s.name for s in signal.Signals}
_STOPPING = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP)  # the launcher's


@dataclasses.dataclass(frozen=True)
class LaunchResult:
  """How a launched job ended.

  Attributes:
    returncode: 0 if all workers exited 0; else the first failing worker's status (128 + signal if
      a signal killed it); 124 on timeout; 128 + signal when the launcher gets SIGINT (130),
      SIGTERM or SIGHUP.
    failed_worker: the process index of the process to blame (servers come after the
      workers), or None: the first that failed, unless one was stopped (SIGSTOP) or the stall
      watchdog named another (`hetjax.runtime._verdict`).
    cause: one sentence for people, e.g. ``'worker 2 exited with status 1'``.
    detected_at: when the launcher saw the failure or stall (`time.time`), before it stopped
      the others; None if the job did not fail.
    workers: when the job failed or timed out, one line per process on how it ended and its own
      error, e.g. ``'worker 1: exited with status 1 (ValueError: boom)'``; else empty.
    log: the launch log holding every line of every process, or None (with no ``log_dir``,
      the log of a job that succeeded or was interrupted is deleted).
  """

  returncode: int
  failed_worker: int | None
  cause: str
  detected_at: float | None = dataclasses.field(default=None, compare=False)
  workers: tuple[str, ...] = dataclasses.field(default=(), compare=False)
  log: str | None = dataclasses.field(default=None, compare=False)

  def verdict(self) -> list[str]:
    """What the command line prints when the job did not succeed: the cause, then (for a failed
    or timed-out job) one line per process and where the full output is."""
    lines = [self.cause, *(f'  {line}' for line in self.workers)]
    if self.workers and self.log:
      lines.append(f'the full output of every worker: {self.log}')
    return lines


def find_free_ports(n: int, port_range: tuple[int, int] | None = None) -> list[int]:
  """``n`` distinct ports on 127.0.0.1 that were free a moment ago (from ``lo..hi`` if given).

  All ``n`` sockets are held until the last is bound, so the ports differ; a worker can still lose
  a race for one later (the usual caveat of port 0). A range that cannot supply ``n`` ports (the
  "more workers than ports" case) is a `ConfigError`.

  Example::

    >>> coordinator, *transfer = find_free_ports(3, (20000, 20100))
  """
  if port_range is not None and not 1 <= port_range[0] <= port_range[1] <= 65535:
    raise ConfigError('port range {}-{} is not LOW-HIGH within 1-65535'.format(*port_range))
  candidates = [0] * n if port_range is None else range(port_range[0], port_range[1] + 1)
  with contextlib.ExitStack() as bound:
    ports: list[int] = []
    for port in candidates:
      if len(ports) == n:
        break
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      try:
        sock.bind(('127.0.0.1', port))
      except OSError:
        sock.close()
      else:
        ports.append(bound.enter_context(sock).getsockname()[1])
    if len(ports) < n:
      where = 'on 127.0.0.1' if port_range is None else 'in port range {}-{}'.format(*port_range)
      raise ConfigError(f'found {len(ports)} free ports {where} but need {n} (workers + 1)')
    return ports


def device_counts(workers: int, devices: int | Sequence[int]) -> tuple[int, ...]:
  """Each worker's device count: ``devices`` for every worker, or one count per worker.

  Raises:
    ConfigError: a count below 1, or a list whose length is not the worker count.
  """
  if isinstance(devices, int):
    if devices < 1:
      raise ConfigError(f'devices per worker must be at least 1, got {devices}')
    return (devices,) * workers
  counts = tuple(devices)
  if len(counts) != workers:
    raise ConfigError(f'{len(counts)} device counts {list(counts)} for {workers} workers: give '
                      'one per worker')
  if any(not isinstance(c, int) or c < 1 for c in counts):
    raise ConfigError(f'every worker needs at least 1 device, got {list(counts)}')
  return counts


def _check(command: Sequence[str], workers: int, counts: tuple[int, ...], slowdown: str | None,
           timeout: float | None, init_timeout: float | None, env: Mapping[str, str]) -> None:
  if not command:
    raise ConfigError('no command given; put it after --, e.g. -- python train.py')
  for what, seconds in (('timeout', timeout), ('init timeout', init_timeout)):
    if seconds is not None:  # None: no limit
      positive_seconds(seconds, what)
  if slowdown is not None and not slowdown.strip():
    raise ConfigError('slowdown spec is empty')
  gpus, need = env.get('CUDA_VISIBLE_DEVICES', ''), sum(counts)
  # CUDA stops at the first invalid id ('-1'); an empty list hides all GPUs: a CPU job.
  visible = list(itertools.takewhile(lambda d: d and not d.startswith('-'),
                                     (d.strip() for d in gpus.split(','))))
  if visible and len(visible) < need:
    raise ConfigError(f'{workers} workers with {list(counts)} devices need {need} GPUs but '
                      f'CUDA_VISIBLE_DEVICES={gpus!r} lists {len(visible)}')


def _killpg(pid: int, sig: int) -> None:
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(pid, sig)


@atexit.register
def _kill_leftovers() -> None:
  for pid in list(_LIVE_GROUPS):
    _killpg(pid, signal.SIGKILL)


def _pump(i: int, proc: subprocess.Popen[bytes], console: Console) -> None:
  """Passes each line of a process's merged stdout/stderr on to the console, then how it
  ended (at once: a failed worker silences its peers' reports before the next poll)."""
  with proc.stdout as pipe:
    for raw in iter(pipe.readline, b''):
      console.write(i, raw.decode('utf-8', errors='replace').removesuffix('\n'))
  with contextlib.suppress(subprocess.TimeoutExpired):  # closed its output but runs on
    console.end(i, proc.wait(timeout=_GRACE_SECONDS))


class _Workers:
  """The worker processes, each the leader of its own process group."""

  def __init__(self, console: Console, workers: int, hosts: Sequence[int] | None = None):
    self.console, self._readers, self.workers = console, [], workers
    self.hosts = tuple(range(workers)) if hosts is None else tuple(hosts)
    self.live: dict[int, subprocess.Popen[bytes]] = {}  # process id -> process not yet reaped
    self.codes: dict[int, int] = {}  # process id -> its exit status, once reaped
    self.signaled: set[int] = set()  # the processes this launcher stopped

  def name(self, i: int) -> str:
    """``'worker h'`` (h: the worker's original id), or ``'server j'`` after the workers."""
    return f'worker {self.hosts[i]}' if i < self.workers else f'server {i - self.workers}'

  def stopped(self) -> list[int]:
    """The live processes that are stopped (SIGSTOP), by index."""
    return [i for i, p in sorted(self.live.items()) if is_stopped(p.pid)]

  def start(self, command: Sequence[str], env: Mapping[str, str],
            cpus: frozenset[int] | None = None) -> None:
    i = len(self._readers)
    try:
      with affinity_for_children(cpus):
        proc = subprocess.Popen(list(command), env=dict(env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as e:
      raise ConfigError(f'cannot start {self.name(i)}: {command[0]}: {e.strerror}') from None
    _LIVE_GROUPS.add(proc.pid)
    self.live[i] = proc
    self.console.add(f'w{self.hosts[i]}' if i < self.workers else f's{i - self.workers}')
    self._readers.append(threading.Thread(target=_pump, args=(i, proc, self.console),
                                          daemon=True))
    self._readers[-1].start()

  def reap(self) -> list[tuple[int, int]]:
    """(worker, returncode) of the workers that exited since the last call, by worker id."""
    done = [(i, p.returncode) for i, p in sorted(self.live.items()) if p.poll() is not None]
    for i, rc in done:  # kill what a worker left behind now, while its group id is still ours
      _killpg(self.live[i].pid, signal.SIGKILL)
      _LIVE_GROUPS.discard(self.live.pop(i).pid)
      self.codes[i] = rc
    return done

  def drain(self, i: int, timeout: float = _DRAIN_SECONDS) -> None:
    """Waits up to ``timeout`` s for process ``i``'s output to be read to its end: what a
    worker printed before it failed reaches the console before the console goes quiet."""
    self._readers[i].join(timeout=timeout)

  def ended(self, i: int) -> str:
    """How process ``i`` ended, e.g. ``'exited with status 1'``, ``'stopped by the launcher'``."""
    rc = self.codes.get(i)
    if rc is None:
      return 'still running'
    if rc < 0 and i in self.signaled and -rc in _STOPPING:
      return 'stopped by the launcher'
    return (f'exited with status {rc}' if rc >= 0 else
            f'was killed by {_SIGNAL_NAMES.get(-rc, f"signal {-rc}")}')

  def stop(self, sig: int, grace: float, hurry: Callable[[], bool] = lambda: False) -> None:
    """Sends ``sig`` to every live group, waits up to ``grace`` s, then SIGKILLs the rest."""
    self.reap()  # who ended on its own before the launcher stopped the rest
    self.signaled.update(self.live)
    for s in (sig, signal.SIGKILL):
      for proc in self.live.values():
        _killpg(proc.pid, s)
      deadline = time.monotonic() + grace
      while self.live and time.monotonic() < deadline and not hurry():
        time.sleep(_POLL_SECONDS)
        self.reap()
    for proc in self.live.values():
      proc.wait()
    self.reap()
    deadline = time.monotonic() + 2.0  # all output out before the verdict, unless a process
    for reader in self._readers:       # that escaped its group (setsid) still holds a pipe
      reader.join(timeout=max(0.0, deadline - time.monotonic()))


def launch_local(command: Sequence[str], workers: int, devices_per_worker: int | Sequence[int] = 1,
                 slowdown: str | None = None, timeout: float | None = None,
                 init_timeout: float | None = None, port_range: tuple[int, int] | None = None,
                 env: Mapping[str, str] | None = None, stdout: TextIO | None = None,
                 validate_slowdown: Callable[[str], object] | None = None,
                 pin_cores: bool = False, servers: int = 0, network: str | None = None,
                 validate_network: Callable[[str], object] | None = None,
                 stall_timeout: float | None = None, hosts: Sequence[int] | None = None,
                 log_dir: str | os.PathLike[str] | None = None) -> LaunchResult:
  """Runs ``command`` as ``workers`` local processes and waits for all of them.

  The job ends when every worker exited 0; when the first one fails (the others get SIGTERM, then
  SIGKILL after a 3 s grace); when one has been stopped (SIGSTOP) for ``stall_timeout`` s; after
  ``timeout`` s; or on SIGINT/SIGTERM/SIGHUP to this process (passed on to the workers, same
  grace; a second signal skips it). The worker blamed is the one the stall watchdog named, else
  a stopped one (its peers fail after it), else one that raised an exception at least 1 s
  before the first process exited (JAX keeps it alive in its shutdown barrier while its peers
  fail), else the first to fail. Each worker is its own process group and every group is
  SIGKILLed at the end, so nothing a worker started is left running.

  Once a worker failed (or the job is being stopped), the peers' tracebacks and runtime errors
  stay out of ``stdout``: every line goes to the launch log, and the result says how each
  process ended (`LaunchResult.workers`, `LaunchResult.verdict`).

  Example::

    >>> launch_local([sys.executable, 'train.py', '--workdir=runs/a'], workers=4,
    ...              slowdown='static:1,1,2,4', timeout=600, log_dir='runs/a')
    [w0] step 1/100 | loss 2.31
    ...
    LaunchResult(returncode=1, failed_worker=2, cause='worker 2 exited with status 1')

  Args:
    command: the program and its arguments, run unchanged by every worker.
    workers: how many processes (1..1024).
    devices_per_worker: virtual CPU devices per process (``JAX_NUM_CPU_DEVICES``), the same
      for every worker or one count per worker (a job of unequal workers, e.g. ``(2, 1, 1)``).
    slowdown: passed on as ``HETJAX_SLOWDOWN``; must not be empty.
    timeout: seconds before the whole job is stopped (returncode 124); None: no limit.
    init_timeout: passed on as ``HETJAX_INIT_TIMEOUT``.
    port_range: ``(low, high)``, inclusive, to take the ports from; None: any free ports.
    env: the workers' base environment; None: this process's environment.
    stdout: where the workers' ``[w{i}] ``-prefixed lines go while the job is healthy; None:
      ``sys.stdout``.
    validate_slowdown: called with ``slowdown`` first; raises `ConfigError` if it is bad.
    pin_cores: run worker i on CPU i mod (CPUs this process may use) only (Linux), so that
      emulated hosts hold with more workers than cores (`hetjax.runtime._affinity`).
    servers: parameter servers (`hetjax.ps`) started after the workers, one device each, in
      the same JAX job (``HETJAX_NUM_SERVERS``); their lines come out as ``[s{j}]``, and a
      failing server is named as ``server j``.
    network: emulated links, passed on as ``HETJAX_NETWORK`` (`hetjax.emulation.parse_links`).
    validate_network: called with ``network`` first; raises `ConfigError` if it is bad.
    stall_timeout: seconds a stopped worker may stay stopped before the job is ended with it
      named (default `DEFAULT_STOPPED_SECONDS`); the in-job watchdog's timeout is separate
      (``HETJAX_STALL_TIMEOUT``, set by `hetjax.runtime.launch_elastic`).
    hosts: the workers' original ids (``HETJAX_HOSTS``), when a restart left some out: worker
      i is named, and its lines prefixed, by ``hosts[i]``.
    log_dir: where the launch log ``launch.log`` goes (created; appended to by every launch,
      restarts included), e.g. the run directory. None: a new temporary directory, kept when
      the job failed or timed out.

  Returns:
    A `LaunchResult`; nothing goes to stderr (the CLI prints ``result.verdict()``).

  Raises:
    ConfigError: bad arguments, too few free ports or GPUs, or a command that cannot start.
  """
  base = dict(os.environ if env is None else env)
  between(workers, 1, MAX_WORKERS, 'workers')
  between(servers, 0, MAX_WORKERS, 'servers')
  counts = device_counts(workers, devices_per_worker) + (1,) * servers
  _check(command, workers, counts, slowdown, timeout, init_timeout, base)
  if slowdown is not None and validate_slowdown is not None:
    validate_slowdown(slowdown)
  if network is not None and validate_network is not None:
    validate_network(network)
  if hosts is not None and len(hosts) != workers:
    raise ConfigError(f'{len(hosts)} host ids for {workers} workers')
  if stall_timeout is not None:  # None: automatic
    positive_seconds(stall_timeout, 'stall timeout')
  processes = workers + servers
  coordinator, *transfer = find_free_ports(processes + 1, port_range)
  base |= {'HETJAX_COORDINATOR': f'127.0.0.1:{coordinator}',
           'HETJAX_NUM_WORKERS': str(processes), 'PYTHONUNBUFFERED': '1',
           'JAX_CPU_COLLECTIVES_IMPLEMENTATION': 'gloo', 'HETJAX_LAUNCHER_PID': str(os.getpid())}
  optional = {'HETJAX_SLOWDOWN': slowdown, 'HETJAX_INIT_TIMEOUT': init_timeout,
              'HETJAX_NETWORK': network, 'HETJAX_NUM_SERVERS': servers or None}
  base |= {k: str(v) for k, v in optional.items() if v is not None}
  base.pop(ENV_HOSTS, None)  # never inherited from this process's own environment
  if hosts is not None and tuple(hosts) != tuple(range(workers)):
    base[ENV_HOSTS] = ','.join(str(h) for h in hosts)
  cpus = worker_cpus(processes) if pin_cores else [None] * processes
  log, log_path = _open_log(log_dir)
  log.write(f'# {datetime.datetime.now().isoformat(timespec="seconds")}: {processes} '
            f'processes run {shlex.join(command)}\n')
  # SIGINT/SIGTERM/SIGHUP are recorded, not raised, so the poll loop shuts the job down in order.
  received: list[int] = []
  main = threading.current_thread() is threading.main_thread()  # only it may set handlers
  previous = {s: signal.signal(s, lambda signum, _: received.append(signum))
              for s in ((signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if main else ())}
  job = _Workers(Console(sys.stdout if stdout is None else stdout, log), workers, hosts)
  verdicts = base[ENV_VERDICT_DIR] = tempfile.mkdtemp(prefix='hetjax-verdict-')
  result = None
  try:
    for i, port in enumerate(transfer):
      job.start(command, base | {'HETJAX_WORKER_ID': str(i), 'JAX_NUM_CPU_DEVICES': str(counts[i]),
                                 'HETJAX_TRANSFER_ADDRESS': f'127.0.0.1:{port}'}, cpus[i])
    result = _supervise(job, timeout, received, stall_timeout or DEFAULT_STOPPED_SECONDS,
                        verdicts)
  finally:
    job.stop(signal.SIGKILL, 0.0)  # kills leftovers and flushes the output on every path
    shutil.rmtree(verdicts, ignore_errors=True)
    for s, handler in previous.items():
      signal.signal(s, signal.SIG_DFL if handler is None else handler)
    result = _close_log(job, result, log, log_path, keep=log_dir is not None,
                        interrupted=bool(received))
  return result


def _shorten(error: str) -> str:
  """``error`` cut to its first sentence, or to `_ERROR_CHARS` characters, if longer."""
  if len(error) <= _ERROR_CHARS:
    return error
  end = error.find('. ', 0, _ERROR_CHARS)
  return error[:end + 1] if end > 0 else error[:_ERROR_CHARS] + '…'


def _open_log(log_dir: str | os.PathLike[str] | None) -> tuple[TextIO, str]:
  """The launch log, opened for appending (and reading back, `_close_log`), and its path."""
  directory = tempfile.mkdtemp(prefix='hetjax-launch-') if log_dir is None else os.fspath(log_dir)
  path = os.path.join(directory, LOG_FILE)
  try:
    os.makedirs(directory, exist_ok=True)
    return open(path, 'a+', encoding='utf-8'), path
  except OSError as e:
    raise ConfigError(f'cannot write the launch log {path}: {e.strerror}') from None


def _close_log(job: _Workers, result: LaunchResult | None, log: TextIO, path: str, *,
               keep: bool, interrupted: bool) -> LaunchResult | None:
  """Adds how each process ended to the result and the log, and closes the log: written again
  if the job deleted it (a run directory replaced by ``--overwrite``); deleted with its
  temporary directory if nobody asked for it and no verdict points at it (the job succeeded,
  never ran, or was interrupted)."""
  failed = result is not None and result.returncode != 0
  lines = []
  for i in sorted(job.codes):
    error = job.console.error(i)
    if error is None and job.codes[i] > 0 and i not in job.signaled:  # e.g. a one-line error
      error = job.console.last(i) or None
    lines.append(f'{job.name(i)}: {job.ended(i)}' + (f' ({_shorten(error)})' if error else ''))
  with contextlib.suppress(OSError, ValueError):
    if result is not None:
      job.console.note(f'# {result.cause}')
    for line in lines:
      job.console.note(f'#   {line}')
    log.flush()
    if os.fstat(log.fileno()).st_nlink == 0:  # deleted under us: write it out again
      log.seek(0)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'a', encoding='utf-8') as again:
        shutil.copyfileobj(log, again)
  log.close()
  unseen = not failed or interrupted  # no verdict points at the log (or the job never ran)
  if unseen and not keep:
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return result
  if result is None:
    return None
  return dataclasses.replace(result, workers=() if unseen else tuple(lines), log=path)


def _supervise(job: _Workers, timeout: float | None, received: list[int], stall_timeout: float,
               verdicts: str) -> LaunchResult:
  """Polls every 50 ms until all workers exited 0, one failed or stayed stopped, time ran out
  or a signal came."""
  deadline = math.inf if timeout is None else time.monotonic() + timeout
  stopped_since: dict[int, float] = {}
  next_look = 0.0
  while True:
    if received:
      sig = received[0]
      job.console.quiet()
      job.stop(sig, _GRACE_SECONDS, hurry=lambda: len(received) > 1)
      name = 'interrupted' if sig == signal.SIGINT else f'interrupted by {signal.Signals(sig).name}'
      return LaunchResult(128 + sig, None, name)
    now = time.monotonic()
    if now >= next_look:  # reading /proc for every process: not at every poll
      stopped = job.stopped()
      stopped_since = {i: stopped_since.get(i, now) for i in stopped}
      next_look = now + _STOPPED_POLL_SECONDS
    failed = sorted((rc != -signal.SIGKILL, i, rc) for i, rc in job.reap() if rc != 0)
    if failed:  # a SIGKILLed worker before peers that failed in the same poll
      _, worker, rc = failed[0]
      job.drain(worker)  # its group was killed by reap, so its pipe closes at once
      job.console.quiet()
      how = (f'exited with status {rc}' if rc > 0 else
             f'was killed by {_SIGNAL_NAMES.get(-rc, f"signal {-rc}")}')
      code, blamed, cause = rc if rc > 0 else 128 - rc, worker, f'{job.name(worker)} {how}'
      verdict = read_verdict(verdicts)
      if verdict is not None:
        blamed, cause = verdict[0], verdict[1]
      elif stopped_since:
        blamed = min(stopped_since, key=stopped_since.get)
        cause = (f'{job.name(blamed)} was stopped (SIGSTOP) for '
                 f'{now - stopped_since[blamed]:.1f} s; its peers failed waiting for it ({cause})')
      elif (raised := _raised_first(job.console, now)) is not None:
        blamed, error = raised, job.console.error(raised) or 'an exception'
        cause = (f'{job.name(raised)} raised {error}, then {how}' if raised == worker else
                 f'{job.name(raised)} raised {error}; its peers failed after it ({cause})')
      seen = time.time()
      job.stop(signal.SIGTERM, _GRACE_SECONDS)
      return LaunchResult(code, blamed, cause, seen)
    if not job.live:
      return LaunchResult(0, None, 'all workers exited with status 0')
    late = [i for i, t in stopped_since.items() if now - t >= stall_timeout]
    if late:
      job.console.quiet()
      seen = time.time()
      job.stop(signal.SIGTERM, _GRACE_SECONDS)
      return LaunchResult(1, late[0], f'{job.name(late[0])} was stopped (SIGSTOP) for '
                                      f'{now - stopped_since[late[0]]:.1f} s: no progress', seen)
    if now >= deadline:
      job.console.quiet()
      job.stop(signal.SIGTERM, _GRACE_SECONDS)
      return LaunchResult(124, None, f'timed out after {timeout:g} s; stopped all workers')
    time.sleep(_POLL_SECONDS)


def _raised_first(console: Console, now: float) -> int | None:
  """The process whose traceback began first, at least `_RAISED_BEFORE_S` and at most
  `LINGER_S` before ``now`` (when the first process exited), or None."""
  raised = [(t, i) for i, t in console.tracebacks().items()
            if now - LINGER_S <= t <= now - _RAISED_BEFORE_S]
  return min(raised)[1] if raised else None
