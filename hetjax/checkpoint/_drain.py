"""Event loops that let their pending tasks finish before they close, for orbax's failed reads.

Orbax runs each restore on a fresh event loop (``asyncio_utils.run_sync``: ``new_event_loop``,
``run_until_complete``, ``close``). Its reads are gathered: one shard per device, one task
each. When one shard does not read back (a corrupt checkpoint), the gather raises at once and
the loop is closed while its siblings' TensorStore reads are still in flight. Each of those
later finishes on a TensorStore thread that calls ``loop.call_soon_threadsafe`` on the closed
loop (a ``RuntimeError: Event loop is closed`` traceback per read), and each orphaned
coroutine, collected, turns its ``GeneratorExit`` into an ``Exception`` (orbax catches
``BaseException``): "Exception ignored in: <coroutine _read_array_index_and_device_put>" with
a traceback. A run that skipped one bad checkpoint printed some 16 of them after its warning.

`draining_event_loops` installs, for the duration of a read, a policy whose new loops run
their pending tasks to the end in ``close`` (as ``asyncio.run`` does), so every read finishes,
its result or error collected, before the loop goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

#: How long a closing loop waits for its leftover tasks before it cancels them.
DRAIN_TIMEOUT_S = 60.0
_LOCK = threading.RLock()  # one policy swap at a time


class _DrainingLoop(asyncio.SelectorEventLoop):
  """A selector loop whose ``close`` first lets the tasks still pending on it finish."""

  def close(self) -> None:
    if not self.is_running() and not self.is_closed():
      pending = asyncio.all_tasks(self)
      if pending:
        self.run_until_complete(_finish(pending))
    super().close()


async def _finish(tasks: set[asyncio.Task]) -> None:
  """Waits for ``tasks`` (at most `DRAIN_TIMEOUT_S`), cancels any left, and retrieves every
  outcome, so that none is reported as never retrieved."""
  _, late = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
  for task in late:
    task.cancel()
  await asyncio.gather(*tasks, return_exceptions=True)


class _DrainingPolicy(asyncio.AbstractEventLoopPolicy):
  """The policy in force, except that its new loops are `_DrainingLoop`s."""

  def __init__(self, inner: asyncio.AbstractEventLoopPolicy):
    self._inner = inner

  def get_event_loop(self) -> asyncio.AbstractEventLoop:
    return self._inner.get_event_loop()

  def set_event_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
    self._inner.set_event_loop(loop)

  def new_event_loop(self) -> asyncio.AbstractEventLoop:
    return _DrainingLoop()

  def get_child_watcher(self):  # Unix, Python < 3.14: as the inner policy
    return self._inner.get_child_watcher()

  def set_child_watcher(self, watcher) -> None:
    self._inner.set_child_watcher(watcher)


@contextlib.contextmanager
def draining_event_loops() -> Iterator[None]:
  """Within the block, event loops created by `asyncio.new_event_loop` finish their pending
  tasks when closed; the policy in force before is restored after it.

  Example::

    with draining_event_loops():
      handler.restore(path, args)   # a failed read leaves no read running behind it
  """
  with _LOCK:
    inner = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_DrainingPolicy(inner))
    try:
      yield
    finally:
      asyncio.set_event_loop_policy(inner)
