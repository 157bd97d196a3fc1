"""`LocalChannel`: `Channel`'s interface for threads of one process, with no coordination service.

It lets code written against `Channel` (e.g. the SDPipe group scheduler and its clients) run in
one process: in tests, and for replicas driven by threads. Values go through JSON like
`Channel`'s, so what works here also works over the coordination service.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any


class LocalChannel:
  """An in-memory key-value store with blocking reads, safe across threads.

  Example::

    ch = LocalChannel()
    ch.set('ready/0', {'speed': 1.0})
    ch.wait('ready/0', timeout_s=1.0)   # {'speed': 1.0}
  """

  def __init__(self):
    self._values: dict[str, str] = {}
    self._changed = threading.Condition()

  def set(self, key: str, value: Any) -> None:
    raw = json.dumps(value)
    with self._changed:
      self._values[key] = raw
      self._changed.notify_all()

  def wait(self, key: str, timeout_s: float) -> Any | None:
    """The value at ``key`` once it exists, or ``None`` after ``timeout_s`` seconds."""
    end = time.monotonic() + max(0.0, timeout_s)
    with self._changed:
      while key not in self._values:
        left = end - time.monotonic()
        if left <= 0:
          return None
        self._changed.wait(left)
      return json.loads(self._values[key])

  def get(self, key: str, timeout_s: float = 60.0) -> Any:
    value = self.wait(key, timeout_s)
    if value is None and key not in self._values:
      raise TimeoutError(f'key {key!r} did not appear within {timeout_s} s')
    return value

  def try_get(self, key: str) -> Any | None:
    with self._changed:
      raw = self._values.get(key)
    return None if raw is None else json.loads(raw)

  def increment(self, key: str, amount: int = 1) -> int:
    with self._changed:
      value = int(json.loads(self._values.get(key, '0'))) + int(amount)
      self._values[key] = json.dumps(value)
      self._changed.notify_all()
      return value

  def delete(self, key: str) -> None:
    with self._changed:
      self._values.pop(key, None)
