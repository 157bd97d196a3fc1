"""A small-message channel over the JAX coordination service's key-value store.

This is the one module in hetjax that touches a private JAX handle: the distributed runtime
client behind `jax.distributed` (``jax._src.distributed.global_state.client``). Everything else
(shares, tokens, group assignments, telemetry) goes through `Channel`.
"""

from __future__ import annotations

import json
from typing import Any

from jax._src import distributed as _distributed  # the only private JAX import in hetjax


class Channel:
  """Key-value messages between workers, namespaced by ``prefix``.

  Values are JSON. ``get`` blocks until the key exists (or the timeout passes); ``try_get``
  returns ``None`` at once. Keys are strings like ``'telemetry/12/3'``.

  Example::

    ch = Channel('run0')
    ch.set(f'ready/{worker}', {'speed': 123.0})
    speeds = [ch.get(f'ready/{w}')['speed'] for w in range(workers)]
  """

  def __init__(self, prefix: str = 'hetjax'):
    client = _distributed.global_state.client
    if client is None:
      raise RuntimeError('the coordination service is not running: call '
                         'hetjax.runtime.initialize() in a multi-worker job first')
    self._client, self._prefix = client, prefix.rstrip('/')

  def _key(self, key: str) -> str:
    return f'{self._prefix}/{key}'

  def set(self, key: str, value: Any) -> None:
    self._client.key_value_set(self._key(key), json.dumps(value), allow_overwrite=True)

  def get(self, key: str, timeout_s: float = 60.0) -> Any:
    return json.loads(self._client.blocking_key_value_get(self._key(key), int(timeout_s * 1000)))

  def wait(self, key: str, timeout_s: float) -> Any | None:
    """The value at ``key`` once it exists, or ``None`` if ``timeout_s`` passes first.

    The coordination service counts the timeout in whole milliseconds (at least 1); other
    failures (the service gone) raise.
    """
    try:
      raw = self._client.blocking_key_value_get(self._key(key), max(1, round(timeout_s * 1000)))
    except Exception as e:  # a timeout is a JaxRuntimeError whose message says so
      if 'DEADLINE_EXCEEDED' in str(e):
        return None
      raise
    return json.loads(raw)

  def try_get(self, key: str) -> Any | None:
    try:
      return json.loads(self._client.key_value_try_get(self._key(key)))
    except Exception:  # NOT_FOUND is raised as a runtime error
      return None

  def increment(self, key: str, amount: int = 1) -> int:
    """Atomically adds ``amount`` to the integer at ``key`` and returns the new value.

    The coordination service applies increments one at a time, so concurrent callers never see
    the same value: with ``amount`` 1 every caller gets a distinct ticket 1, 2, 3, … (a missing
    key counts as 0); ``amount`` 0 reads the value without changing it. The value is stored as
    a decimal integer, so `get` and `try_get` read it too. Each call is one round trip to the
    coordinator.

    Example::

      ticket = ch.increment('tokens/12') - 1   # 0, 1, 2, … across all workers
    """
    return int(self._client.key_value_increment(self._key(key), int(amount)))

  def delete(self, key: str) -> None:
    self._client.key_value_delete(self._key(key))

  def barrier(self, name: str, timeout_s: float = 60.0) -> None:
    """Blocks until every worker reached the barrier ``name`` (each name used once)."""
    self._client.wait_at_barrier(self._key(name), int(timeout_s * 1000))
