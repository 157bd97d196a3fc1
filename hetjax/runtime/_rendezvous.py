"""Ports of a launched job: a pre-flight roll call on the coordinator's port, and bind checks.

JAX's coordination service aborts the process (a C++ fatal error, SIGABRT) when a worker does
not register within the initialization timeout, with a gRPC status instead of a name. hetjax
first runs this roll call on the same port: worker 0 listens, every other worker says its id,
and either everyone is there (worker 0 answers ``go`` and closes the port for JAX to bind) or,
at the deadline, every waiting worker learns which ids never showed up and raises a
`ConfigError` naming them.

What binds here: worker 0's roll call listens on the coordinator's bind address (the one JAX's
coordinator takes next: ``HETJAX_COORDINATOR``, loopback when `hetjax.launch` set it, or
``JAX_COORDINATOR_BIND_ADDRESS`` when given); the other workers only connect.

A port that is taken is one line, not a traceback or a crash: `check_port` binds the address
once and raises ``ConfigError('port P on HOST (what) is already in use')``. It binds as gRPC
and JAX's transfer servers do (``SO_REUSEADDR``, so a port in TIME_WAIT passes) but without
``SO_REUSEPORT``, so it also catches a listener that set it, e.g. a stale JAX coordinator that
gRPC would otherwise share the port with. The check is not race-free: a port can be taken
between it and JAX's own bind (see `hetjax.runtime.initialize` for what each bind then does).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import time

from hetjax._errors import ConfigError


def host_port(address: str) -> tuple[str, int]:
  """``'HOST:PORT'`` (``'[::1]:PORT'`` for IPv6; an empty host is ``127.0.0.1``) as a pair."""
  host, _, port = address.rpartition(':')
  try:
    return host.strip('[]') or '127.0.0.1', int(port)
  except ValueError:
    raise ConfigError(f'address {address!r} is not HOST:PORT') from None


def is_loopback(host: str) -> bool:
  """Whether ``host`` (a name or an address, no port) is this machine's loopback."""
  if host == 'localhost':
    return True
  try:
    return ipaddress.ip_address(host.strip('[]')).is_loopback
  except ValueError:
    return False


def port_in_use(address: str, what: str) -> str:
  """The one-line message for a taken port, e.g. ``port 1234 on 127.0.0.1 (the coordinator,
  HETJAX_COORDINATOR) is already in use``."""
  host, port = host_port(address)
  return f'port {port} on {host} ({what}) is already in use'


def _bound(address: str, what: str) -> socket.socket:
  """A TCP socket bound to ``address`` (``SO_REUSEADDR``), or a `ConfigError` naming ``what``."""
  host, port = host_port(address)
  sock = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    sock.close()
    if e.errno == errno.EADDRINUSE:
      raise ConfigError(port_in_use(address, what)) from None
    raise ConfigError(f'cannot listen on {address} ({what}): {e.strerror or e}') from None
  return sock


def check_port(address: str, what: str) -> None:
  """Raises a `ConfigError` naming the port and ``what`` if ``address`` cannot be bound now."""
  _bound(address, what).close()


def roll_call(address: str, workers: int, worker: int, timeout_s: float,
              bind: str | None = None, what: str = 'the coordinator') -> None:
  """Returns once all ``workers`` are up; raises `ConfigError` naming the absent ones.

  Worker 0 listens on ``bind`` (``address`` by default); a taken port is a `ConfigError`
  naming it and ``what``. The others connect to ``address``.
  """
  if workers == 1:
    return
  if worker == 0:
    _host(bind or address, workers, timeout_s, what)
  else:
    _join(address, worker, timeout_s)


def _host(address: str, workers: int, timeout_s: float, what: str) -> None:
  deadline = time.monotonic() + timeout_s
  server = _bound(address, what)
  server.listen(workers)
  present: dict[int, socket.socket] = {}
  try:
    while len(present) < workers - 1 and time.monotonic() < deadline:
      server.settimeout(max(0.01, deadline - time.monotonic()))
      try:
        conn, _ = server.accept()
      except TimeoutError:
        break
      conn.settimeout(5)
      try:
        present[int(conn.recv(64).decode().split()[1])] = conn
      except (OSError, ValueError, IndexError):
        conn.close()
    missing = sorted(set(range(1, workers)) - set(present))
    message = (f'worker(s) {", ".join(map(str, missing))} of {workers} did not start within '
               f'{timeout_s:g} s' if missing else 'go')
    for conn in present.values():
      with contextlib.suppress(OSError):
        conn.sendall((message + '\n').encode())
    if missing:
      raise ConfigError(message)
  finally:
    for conn in present.values():
      conn.close()
    server.close()


def _join(address: str, worker: int, timeout_s: float) -> None:
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      conn = socket.create_connection(host_port(address), timeout=1)
      break
    except OSError:
      if time.monotonic() >= deadline:
        raise ConfigError(f'worker 0 (the coordinator at {address}) did not start within '
                          f'{timeout_s:g} s') from None
      time.sleep(0.1)
  with conn:
    conn.sendall(f'hetjax {worker}\n'.encode())
    conn.settimeout(max(1.0, deadline - time.monotonic() + 5))
    try:
      answer = conn.recv(256).decode().strip()
    except OSError:
      answer = ''
  if answer != 'go':
    raise ConfigError(answer or f'worker 0 at {address} closed the roll call without an answer')
