"""A pre-flight roll call on the coordinator's port, before `jax.distributed.initialize`.

JAX's coordination service aborts the process (a C++ fatal error, SIGABRT) when a worker does
not register within the initialization timeout, with a gRPC status instead of a name. hetjax
first runs this roll call on the same port: worker 0 listens, every other worker says its id,
and either everyone is there (worker 0 answers ``go`` and closes the port for JAX to bind) or,
at the deadline, every waiting worker learns which ids never showed up and raises a
`ConfigError` naming them.
"""

from __future__ import annotations

import contextlib
import socket
import time

from hetjax._errors import ConfigError


def _host_port(address: str) -> tuple[str, int]:
  host, _, port = address.rpartition(':')
  return host.strip('[]') or '127.0.0.1', int(port)


def roll_call(address: str, workers: int, worker: int, timeout_s: float) -> None:
  """Returns once all ``workers`` are up; raises `ConfigError` naming the absent ones."""
  if workers == 1:
    return
  if worker == 0:
    _host(address, workers, timeout_s)
  else:
    _join(address, worker, timeout_s)


def _host(address: str, workers: int, timeout_s: float) -> None:
  deadline = time.monotonic() + timeout_s
  server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  server.bind(_host_port(address))
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
      conn = socket.create_connection(_host_port(address), timeout=1)
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
