"""A worker's emulated host on emulated links: the `hetjax.core.Pace` of a share step whose
exchange crosses `Links`.

The host (a `KnownSpeedHost`, or None for the machine's own speed) pads each compute phase;
the links pad each transfer, by how the links carry it (`Exchange`): under the ring exchange a
collective is padded, after it ran, to its ring time on the slowest link (`Links.all_reduce_s`,
`Links.all_gather_s`), so every worker waits for the slowest; under the server exchange a
step's gradient first takes this worker's own push and pull (`Links.exchange_s`), then joins
the sum, so the step ends when the slowest compute-plus-transfer does. A ring collective asked
of links through a server is refused in one line (the all-reduce scheduler overlaps ring
all-reduces; the server exchange has none).

Example::

  links = parse_links('link:1:1000,1000,1000,20:exchange=server', workers=4)
  pace = LinkedHost(links, worker=3, host=host)        # host: this worker's KnownSpeedHost
  with pace.exchange(4_000_000):                        # sleeps 2 × (1 ms + 4 MB at 20 MB/s)
    grads = all_reduce(grads)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator

from hetjax._errors import ConfigError
from hetjax._links import Collective
from hetjax.emulation._hosts import KnownSpeedHost
from hetjax.emulation._network import Exchange, Links


@dataclasses.dataclass(frozen=True)
class LinkedHost:
  """Worker ``worker``'s ``host`` on ``links`` (module docstring).

  Attributes:
    links: every worker's link, and how a step's gradient crosses them.
    worker: this worker's index in ``links`` (and its host's).
    host: this worker's host of known speed; None: compute at the machine's own speed.
    clock: seconds, monotonic (`time.perf_counter`; injectable for tests).
  """

  links: Links
  worker: int
  host: KnownSpeedHost | None = None
  clock: Callable[[], float] = time.perf_counter

  def __post_init__(self):
    self.links.link(self.worker)  # a worker of the links, or a one-line ConfigError
    if self.host is not None and self.host.worker != self.worker:
      raise ConfigError(f'the host of worker {self.host.worker} on the links of worker '
                        f'{self.worker}')

  def factor(self, step: int) -> float:
    return 1.0 if self.host is None else self.host.factor(step)

  def load(self, step: int) -> float | None:
    return None if self.host is None else self.host.load(step)

  def pad(self, step: int, rows: int, measured_s: float) -> tuple[float, float]:
    return (0.0, 0.0) if self.host is None else self.host.pad(step, rows, measured_s)

  def pad_action(self, step: int, stage: int, kind: str, measured_s: float
                 ) -> tuple[float, float]:
    if self.host is None:
      return 0.0, 0.0
    return self.host.pad_action(step, stage, kind, measured_s)

  @contextlib.contextmanager
  def exchange(self, nbytes: int, collective: Collective = Collective.GRADIENT
               ) -> Iterator[None]:
    """Around a transfer of ``nbytes`` as ``collective``: this worker's push and pull slept
    first (server exchange), or the rest of the ring time slept after (module docstring)."""
    links = self.links
    if links.exchange is Exchange.SERVER:
      if collective is not Collective.GRADIENT:
        raise ConfigError(f'links {links.describe()} exchange through a server (each worker\'s '
                          f'own push and pull), with no ring {collective.value} to emulate: '
                          'drop exchange= (the all-reduce scheduler overlaps ring all-reduces)')
      links.pad(links.exchange_s(nbytes)[self.worker], 0.0)
      yield
      return
    start = self.clock()
    yield
    members = range(links.workers)
    seconds = (links.all_gather_s(members, nbytes) if collective is Collective.ALL_GATHER
               else links.all_reduce_s(members, nbytes))
    links.pad(seconds, self.clock() - start)
