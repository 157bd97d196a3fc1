"""Point-to-point array transfers between processes: `jax.experimental.transfer`, wrapped.

Each process (worker or server) starts one transfer server on loopback (``127.0.0.1``, any free
port, and its data transports likewise; JAX's defaults are ``[::]:0`` and ``0.0.0.0:0``) unless
given another address; a port already taken is a one-line `ConfigError`. The owner of arrays
*offers* them under a number (`Transport.offer`: ``server.await_pull``); another process that
knows the owner's address and the number *takes* them (`Transport.take`:
``connect(address).pull``), giving shapes, dtypes and the device to put them on. An offer is
taken once (checked: a second pull of the same number waits forever), so each pull gets its
own offer. Transfers are asynchronous and unordered: no process waits for another to join,
unlike a cross-host ``device_put``. Addresses travel over the key-value channel.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import transfer

from hetjax._errors import ConfigError
from hetjax.runtime import port_in_use


class Transport:
  """This process's transfer server and its connections to others.

  Args:
    device: where arrays taken from others are put (this process's first device by default).
    bind: the address to listen on (loopback by default: ``'127.0.0.1:0'``, any free port);
      the data transports listen on its host, any free port.

  Raises:
    ConfigError: ``bind`` cannot be listened on (e.g. its port is already in use).
  """

  def __init__(self, device: jax.Device | None = None, bind: str = '127.0.0.1:0'):
    self.device = device or jax.local_devices()[0]
    host = bind.rsplit(':', 1)[0]
    try:
      self._server = transfer.start_transfer_server(self.device.client, bind, [f'{host}:0'])
    except jax.errors.JaxRuntimeError as e:  # 'FAILED_PRECONDITION: bind: Address already in use'
      what = "this process's parameter-server transfer server"
      if 'Address already in use' in str(e):
        raise ConfigError(port_in_use(bind, what)) from None
      raise ConfigError(f'cannot listen on {bind} ({what}): {str(e).strip()[:200]}') from None
    self._connections: dict[str, Any] = {}
    self._numbers = itertools.count(1)
    self._lock = threading.Lock()
    self._sharding = jax.sharding.SingleDeviceSharding(self.device)

  @property
  def address(self) -> str:
    return self._server.address()

  def offer(self, arrays: Sequence[jax.Array]) -> int:
    """Offers ``arrays`` for one pull; returns the number to pull them by."""
    with self._lock:
      number = next(self._numbers)
    self._server.await_pull(number, list(arrays))
    return number

  def take(self, address: str, number: int,
           specs: Sequence[tuple[Sequence[int], str]]) -> list[jax.Array]:
    """The arrays offered at ``address`` under ``number``, of ``specs`` ``(shape, dtype)``."""
    with self._lock:
      connection = self._connections.get(address)
      if connection is None:
        connection = self._connections[address] = self._server.connect(address)
    abstract = [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), sharding=self._sharding)
                for shape, dtype in specs]
    return list(connection.pull(number, abstract))
