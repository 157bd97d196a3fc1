"""Starting a multi-controller JAX job with settings that fail fast instead of hanging.

What listens where, for a job of `hetjax.launch` (``HETJAX_COORDINATOR=127.0.0.1:P``):

* JAX's coordinator (worker 0): the coordinator address itself, so loopback; JAX's own default
  is every interface (``[::]:P``). ``JAX_COORDINATOR_BIND_ADDRESS`` overrides it.
* The roll call (worker 0, `roll_call`): the same address, closed before JAX binds it.
* Gloo, the CPU collectives (every worker): the address the machine's host name resolves to
  (JAX's choice; it has no public setting for it). On the development and CI machines that is
  127.0.0.1; where it is a LAN address, gloo listens there.
* The cross-host transfer socket (every worker, on its first cross-host ``device_put``):
  ``HETJAX_TRANSFER_ADDRESS`` (``127.0.0.1:Q``), and its data transports on that host, any
  port; JAX's default for those is ``0.0.0.0:0`` four times. A
  ``jax_cross_host_transport_addresses`` set before `initialize` is replaced.
* The parameter server's transfer servers (`hetjax.ps.Transport`): ``127.0.0.1:0`` unless
  given another address.

With ``HETJAX_COORDINATOR`` set by hand the same rules apply to the addresses given. Under
SLURM, Open MPI, Kubernetes or Cloud TPU, JAX's cluster detection and JAX's defaults apply
unchanged: the coordinator listens on every interface (``[::]:port``), as a multi-host job
needs, and gloo on the host name's address.

A port that is already taken is a one-line `ConfigError` naming it and what it is for
(``port P on 127.0.0.1 (the coordinator, HETJAX_COORDINATOR) is already in use``): worker 0
checks the coordinator's port before the roll call, every worker its transfer socket's port.
The checks cannot be race-free; if the port is taken in the microseconds between the check and
JAX's own bind, JAX's coordinator crashes the process (a segmentation fault: nothing to catch),
while a taken transfer port is caught where it is first bound (`hetjax.pipeline`, `hetjax.ps`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time

import jax

from hetjax._errors import ConfigError
from hetjax.runtime._rendezvous import check_port, roll_call

#: Environment variables that `hetjax.launch` sets for each local worker.
ENV_COORDINATOR = 'HETJAX_COORDINATOR'
ENV_NUM_WORKERS = 'HETJAX_NUM_WORKERS'
ENV_WORKER_ID = 'HETJAX_WORKER_ID'
ENV_TRANSFER_ADDRESS = 'HETJAX_TRANSFER_ADDRESS'
ENV_INIT_TIMEOUT = 'HETJAX_INIT_TIMEOUT'
ENV_SLOWDOWN = 'HETJAX_SLOWDOWN'
ENV_LAUNCHER_PID = 'HETJAX_LAUNCHER_PID'
ENV_NETWORK = 'HETJAX_NETWORK'
ENV_BIND = 'JAX_COORDINATOR_BIND_ADDRESS'  # JAX's own; honoured here (JAX skips it given ours)
_TRANSPORTS = 4  # JAX's number of data transports per transfer socket
_WATCH_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class WorkerContext:
  """Who this process is in the job.

  Attributes:
    worker: this worker's id (`jax.process_index()`).
    workers: number of workers (`jax.process_count()`).
    coordinator: the coordinator address, or ``None`` for a single-process run.
    slowdown: the slowdown spec this worker was launched with (``HETJAX_SLOWDOWN``), if any.
    network: the emulated links it was launched with (``HETJAX_NETWORK``, the text of
      `hetjax.emulation.parse_links`), if any.
  """

  worker: int
  workers: int
  coordinator: str | None
  slowdown: str | None = None
  network: str | None = dataclasses.field(
      default_factory=lambda: os.environ.get(ENV_NETWORK) or None)

  @property
  def is_chief(self) -> bool:
    return self.worker == 0


def _int_env(name: str) -> int:
  try:
    return int(os.environ[name])
  except ValueError:
    raise ConfigError(f'{name}={os.environ[name]!r} is not an integer') from None


def initialize(
    *,
    init_timeout_s: int = 60,
    heartbeat_timeout_s: int = 10,
    shutdown_timeout_s: int = 10,
    auto_detect: bool = True,
) -> WorkerContext:
  """Joins (or starts) the job's coordination service; call once, before any JAX computation.

  Three cases:

  * Launched by ``python -m hetjax.launch`` (``HETJAX_COORDINATOR`` is set): the coordinator
    binds to that loopback address only (JAX's default binds every interface;
    ``JAX_COORDINATOR_BIND_ADDRESS`` overrides it), a roll call on that port names any worker
    that does not start (JAX would abort the process), CPU collectives use gloo (on loopback
    too), and each worker gets its own cross-host transfer socket (``HETJAX_TRANSFER_ADDRESS``)
    for stage-to-stage transfers. A taken port is a `ConfigError` (module docstring).
  * Under SLURM, Open MPI, Kubernetes (JobSet) or Cloud TPU (``auto_detect``): JAX's own cluster
    detection supplies the addresses; only the timeouts below are ours.
  * Otherwise: a single-process run; nothing is initialised.

  The timeouts are short on purpose: a dead worker makes its peers' collectives fail (gloo
  closes the connection) and the coordinator notices the missing heartbeat after
  ``heartbeat_timeout_s``, so the job ends in seconds instead of JAX's default 100–300 s. A
  worker that never starts makes the others fail after ``init_timeout_s`` with a clear message.

  Returns:
    this process's `WorkerContext`.

  Raises:
    ConfigError: bad launcher environment, a port already in use, or peers that did not
      connect in time.
  """
  slowdown = os.environ.get(ENV_SLOWDOWN) or None
  if jax.distributed.is_initialized():
    return WorkerContext(jax.process_index(), jax.process_count(), None, slowdown)
  timeouts = dict(heartbeat_timeout_seconds=heartbeat_timeout_s,
                  shutdown_timeout_seconds=shutdown_timeout_s)
  coordinator = os.environ.get(ENV_COORDINATOR)
  if coordinator:
    _exit_with_launcher()
    workers, worker = _int_env(ENV_NUM_WORKERS), _int_env(ENV_WORKER_ID)
    if not 0 <= worker < workers:
      raise ConfigError(f'{ENV_WORKER_ID}={worker} is outside 0..{workers - 1}')
    if os.environ.get(ENV_INIT_TIMEOUT):
      try:
        init_timeout_s = max(1, math.ceil(float(os.environ[ENV_INIT_TIMEOUT])))
      except ValueError:
        raise ConfigError(f'{ENV_INIT_TIMEOUT}={os.environ[ENV_INIT_TIMEOUT]!r} is not a '
                          'number of seconds') from None
    bind = os.environ.get(ENV_BIND) or coordinator
    what = f'the coordinator, {ENV_BIND if os.environ.get(ENV_BIND) else ENV_COORDINATOR}'
    transfer = os.environ.get(ENV_TRANSFER_ADDRESS)
    if transfer:
      check_port(transfer, f"worker {worker}'s transfer socket, {ENV_TRANSFER_ADDRESS}")
    if worker == 0:
      check_port(bind, what)
    roll_call(coordinator, workers, worker, init_timeout_s, bind=bind, what=what)
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    if transfer:
      _transfer_on(transfer)
    try:
      jax.distributed.initialize(
          coordinator_address=coordinator, num_processes=workers, process_id=worker,
          coordinator_bind_address=bind, initialization_timeout=init_timeout_s,
          **timeouts)
    except Exception as e:  # JAX raises XlaRuntimeError/RuntimeError with a long gRPC text
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise ConfigError(
          f'worker {worker} of {workers} could not join the job at {coordinator} within '
          f'{init_timeout_s} s (did every worker start?): {first[:200]}') from None
    return WorkerContext(worker, workers, coordinator, slowdown)
  if auto_detect and _cluster_detected():
    jax.distributed.initialize(initialization_timeout=init_timeout_s, **timeouts)
    return WorkerContext(jax.process_index(), jax.process_count(), 'auto', slowdown)
  return WorkerContext(0, 1, None, slowdown)


def _transfer_on(address: str) -> None:
  """The cross-host transfer socket on ``address``, its data transports on the same host, any
  port (JAX's default for those is every interface)."""
  jax.config.update('jax_cross_host_transfer_socket_address', address)
  host = address.rpartition(':')[0] or '127.0.0.1'
  jax.config.update('jax_cross_host_transport_addresses', ','.join([f'{host}:0'] * _TRANSPORTS))


def _exit_with_launcher() -> None:
  """Ends this launched worker within a second of its launcher's death, however it died.

  The launcher stops its workers on every path it lives through (exit, timeout, signals), but a
  SIGKILLed launcher (e.g. by ``subprocess.run(timeout=…)`` or the OOM killer) cannot, and the
  job's coordinator lives in worker 0, so the workers would run on. A daemon thread checks the
  launcher's pid (``HETJAX_LAUNCHER_PID``) every second and exits the process when it is gone.
  """
  raw = os.environ.get(ENV_LAUNCHER_PID)
  if not raw:
    return
  pid = _int_env(ENV_LAUNCHER_PID)

  def watch() -> None:
    while True:
      try:
        os.kill(pid, 0)
      except ProcessLookupError:
        with contextlib.suppress(OSError):  # the output pipe died with the launcher
          print(f'hetjax: the launcher (pid {pid}) is gone; worker exits', file=sys.stderr,
                flush=True)
        os._exit(1)
      except PermissionError:  # alive, owned by someone else
        pass
      time.sleep(_WATCH_SECONDS)

  threading.Thread(target=watch, name='hetjax-launcher-watch', daemon=True).start()


def _cluster_detected() -> bool:
  """Whether one of the environments JAX can auto-configure from is present."""
  markers = ('SLURM_JOB_ID', 'OMPI_COMM_WORLD_SIZE', 'JOBSET_NAME', 'TPU_WORKER_HOSTNAMES',
             'MEGASCALE_COORDINATOR_ADDRESS')
  if os.environ.get('SLURM_JOB_ID') and int(os.environ.get('SLURM_NTASKS', '1')) <= 1:
    return False  # a single-task SLURM allocation is a single-process run
  return any(os.environ.get(m) for m in markers)
