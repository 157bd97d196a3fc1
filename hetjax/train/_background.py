"""`Background`: one job at a time on a daemon thread, its result or exception on a future.

What `OverlapTrainer` runs its all-reduce on while the main thread computes the next gradient.
One job at a time keeps every worker's collectives in one order (the order of `submit` calls);
an exception on the thread is not lost: `Future.result` raises it on the caller's thread; and
`close` joins the thread, so it does not outlive the program that owns it (a daemon thread, so
that a collective stuck on a dead peer cannot hold the process open either).

Example::

  >>> runner = Background('example')
  >>> runner.submit(sum, (1, 2, 3)).result()
  6
  >>> runner.submit(int, 'x').result()
  Traceback (most recent call last):
  ...
  ValueError: invalid literal for int() with base 10: 'x'
  >>> runner.close()
  True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Background:
  """Runs ``fn(*args)`` on a fresh daemon thread named ``name``, one job at a time."""

  def __init__(self, name: str):
    self.name = name
    self._thread: threading.Thread | None = None

  @property
  def busy(self) -> bool:
    return self._thread is not None and self._thread.is_alive()

  def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
    """Starts ``fn(*args)``; its future holds the result or the exception it raised.

    Raises:
      RuntimeError: the previous job is still running (collect it with its future first).
    """
    if self.busy:
      raise RuntimeError(f'{self.name}: the previous job is still running')
    future: Future = Future()

    def run():
      if not future.set_running_or_notify_cancel():
        return
      try:
        future.set_result(fn(*args))
      except BaseException as e:  # handed to the caller's thread by the future
        future.set_exception(e)

    self._thread = threading.Thread(target=run, name=self.name, daemon=True)
    self._thread.start()
    return future

  def close(self, timeout_s: float | None = None) -> bool:
    """Waits up to ``timeout_s`` (None: as long as it takes) for a running job; True when no
    thread is left."""
    if self._thread is not None:
      self._thread.join(timeout_s)
    return not self.busy
