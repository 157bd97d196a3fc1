"""Emulated network links: each worker's latency α and bandwidth β, so that a transfer of b bytes
takes α + b / β, and communication-bound regimes exist on one machine.

On localhost a push, a pull or a collective costs microseconds; a cluster's links cost
milliseconds. `Links` says what each worker's link costs, and `Links.pad` sleeps a real
transfer up to that time (as `KnownSpeedHost` does for compute): the transfer itself still
happens, only its duration is defined. A collective over several workers runs at the pace of
its slowest link: a ring all-reduce of b bytes over n workers moves 2 (n − 1) / n × b through
every link in 2 (n − 1) steps (`Links.all_reduce_s`). The arithmetic is the one α–β model every
layer prices with (`hetjax.core.LinkCost`); `Links` adds one link per worker, the text form and
the padding.

How a step's gradient crosses the links is the `Exchange`: a ``ring`` all-reduce (the default,
the shares mode's collective) moves in lock step, so every worker waits for the slowest link
and a slow link costs everyone the same; through a ``server`` (an aggregator on fast links: a
parameter server, a federated setting's coordinator) each worker pushes its gradient and pulls
the sum through its own link, 2 (α + b / β) a step, so a worker on a slow link finishes its
step later than the others and a share policy can give it fewer rows (`exchange_s`; the
parameter-server scheme ``ps-bsp`` of `hetjax.simulation.iteration_s` prices the same).

Text form (`parse_links`): ``none``, or ``link:LATENCY_MS:BANDWIDTH_MB_S[:exchange=ring|server]``
with one value for every worker or one per worker (``inf`` bandwidth: no limit), e.g.
``link:1:100``, ``link:1:1000,1000,1000,100`` (worker 3 on a 10× slower link) or
``link:1,1,1,20:1000,1000,1000,100:exchange=server`` (worker 3's own push and pull slower).

Example::

  >>> links = parse_links('link:2:100,100,100,10', workers=4)
  >>> round(links.transfer_s(3, 1_000_000), 4)      # 2 ms + 1 MB at 10 MB/s
  0.102
  >>> round(links.all_reduce_s(range(4), 1_000_000), 4)   # 6 steps of 2 ms; 1.5 MB at 10 MB/s
  0.162
  >>> server = parse_links('link:2:100,100,100,10:exchange=server', workers=4)
  >>> [round(s, 4) for s in server.exchange_s(1_000_000)]   # each its own push and pull
  [0.024, 0.024, 0.024, 0.204]
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable, Iterable, Sequence

from hetjax._errors import ConfigError, parse_choice
from hetjax._links import LinkCost

_MB = 1e6


class Exchange(enum.Enum):
  """How a step's gradient crosses the links (module docstring): ``ring``, one all-reduce paced
  by the slowest link; ``server``, each worker's own push and pull through its link."""

  RING = 'ring'
  SERVER = 'server'


@dataclasses.dataclass(frozen=True)
class Links:
  """Each worker's link: ``latency_s[w]`` (α) and ``bandwidth[w]`` bytes/s (β, inf: no limit),
  and how a step's gradient crosses them (`Exchange`)."""

  latency_s: tuple[float, ...]
  bandwidth: tuple[float, ...]
  exchange: Exchange = Exchange.RING

  def __post_init__(self):
    if len(self.latency_s) != len(self.bandwidth) or not self.latency_s:
      raise ConfigError(f'links need a latency and a bandwidth per worker, got '
                        f'{len(self.latency_s)} and {len(self.bandwidth)}')
    if any(not (math.isfinite(a) and a >= 0) for a in self.latency_s):
      raise ConfigError(f'link latencies must be finite and >= 0, got {self.latency_s}')
    if any(not b > 0 for b in self.bandwidth):  # also NaN
      raise ConfigError(f'link bandwidths must be > 0, got {self.bandwidth}')

  @classmethod
  def none(cls, workers: int) -> Links:
    """Links that cost nothing: the machine's own transfers, unpadded."""
    return cls((0.0,) * workers, (math.inf,) * workers)

  @property
  def workers(self) -> int:
    return len(self.latency_s)

  @property
  def free(self) -> bool:
    return all(a == 0 for a in self.latency_s) and all(math.isinf(b) for b in self.bandwidth)

  def link(self, worker: int) -> LinkCost:
    """``worker``'s link as the α–β model."""
    self._check(worker)
    return LinkCost(self.latency_s[worker], self.bandwidth[worker])

  def transfer_s(self, worker: int, nbytes: int) -> float:
    """Seconds for ``nbytes`` through ``worker``'s link: α + bytes / β (a push or a pull)."""
    link = self.link(worker)
    if nbytes < 0:
      raise ConfigError(f'a transfer of {nbytes} bytes')
    return link.send_s(nbytes)

  def all_reduce_s(self, workers: Iterable[int], nbytes: int) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` among ``workers``: 2 (n − 1) steps, each
    moving b / n bytes through every link, paced by the slowest latency and bandwidth."""
    members = sorted(set(workers))
    links = [self.link(w) for w in members]
    if len(members) < 2:
      return 0.0
    return LinkCost.slowest(links).ring_all_reduce_s(nbytes, len(members))

  def all_gather_s(self, workers: Iterable[int], nbytes_each: int) -> float:
    """Seconds for a ring all-gather among ``workers``, each contributing ``nbytes_each``:
    n − 1 steps, each moving one member's bytes through every link, at the slowest's pace."""
    members = sorted(set(workers))
    links = [self.link(w) for w in members]
    if len(members) < 2:
      return 0.0
    return LinkCost.slowest(links).ring_all_gather_s(nbytes_each, len(members))

  def exchange_s(self, nbytes: int) -> tuple[float, ...]:
    """Each worker's seconds of one step's exchange of an ``nbytes`` gradient, by `exchange`:
    the ring all-reduce over every worker (`all_reduce_s`, the same for all), or its own push
    and pull through its link (2 × `transfer_s`). A worker's step is its compute plus this."""
    if self.exchange is Exchange.RING:
      return (self.all_reduce_s(range(self.workers), nbytes),) * self.workers
    return tuple(2 * self.transfer_s(w, nbytes) for w in range(self.workers))

  def pad(self, seconds: float, measured_s: float,
          sleep: Callable[[float], None] = time.sleep) -> float:
    """Sleeps the rest of ``seconds`` (a `transfer_s` or `all_reduce_s`) after a real transfer
    of ``measured_s``; returns the time slept (0 if the real one took longer)."""
    rest = seconds - measured_s
    if rest > 0:
      sleep(rest)
      return rest
    return 0.0

  def describe(self) -> str:
    if self.free:
      return 'none'
    ms = ','.join(f'{a * 1e3:g}' for a in _collapse(self.latency_s))
    mb = ','.join('inf' if math.isinf(b) else f'{b / _MB:g}' for b in _collapse(self.bandwidth))
    via = '' if self.exchange is Exchange.RING else f':exchange={self.exchange.value}'
    return f'link:{ms}:{mb}{via}'

  def _check(self, worker: int) -> None:
    if not 0 <= worker < self.workers:
      raise ConfigError(f'worker {worker} is not one of the {self.workers} workers of the links')


def parse_links(spec: str, workers: int) -> Links:
  """``none`` or ``link:LATENCY_MS:BANDWIDTH_MB_S[:exchange=ring|server]`` (module docstring)
  for ``workers`` workers.

  Raises:
    ConfigError: one line naming what is wrong.
  """
  text = spec.strip()
  if text == 'none':
    return Links.none(workers)
  name, _, rest = text.partition(':')
  fields = rest.split(':') if rest else []
  positional, given = fields[:2], fields[2:]
  if (name != 'link' or len(positional) != 2 or any('=' in f for f in positional)
      or not all('=' in f for f in given)):
    raise ConfigError(f'bad links {spec!r}; expected none or link:LATENCY_MS:BANDWIDTH_MB_S'
                      '[:exchange=ring|server] (one value, or one per worker, each)')
  options = dict(f.partition('=')[::2] for f in given)
  if given and (len(given) > 1 or set(options) != {'exchange'}):
    raise ConfigError(f'bad links options {":".join(given)!r} in {spec!r}; known: '
                      'exchange=ring|server')
  exchange = parse_choice(Exchange, options.get('exchange', 'ring'), 'links exchange')
  latency = _values(fields[0], workers, 'latency')
  bandwidth = _values(fields[1], workers, 'bandwidth')
  return Links(tuple(a / 1e3 for a in latency), tuple(b * _MB for b in bandwidth), exchange)


def _values(text: str, workers: int, what: str) -> tuple[float, ...]:
  try:
    values = [float(t) for t in text.split(',')]
  except ValueError:
    raise ConfigError(f'link {what} {text!r} is not a list of numbers') from None
  if len(values) not in (1, workers):
    raise ConfigError(f'link {what} has {len(values)} values for {workers} workers; give '
                      f'{workers} or 1')
  return tuple(values * workers if len(values) == 1 else values)


def _collapse(values: Sequence[float]) -> Sequence[float]:
  return values[:1] if len(set(values)) == 1 else values
