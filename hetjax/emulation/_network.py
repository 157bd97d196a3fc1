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

Text form (`parse_links`): ``none``, or ``link:LATENCY_MS:BANDWIDTH_MB_S`` with one value for
every worker or one per worker (``inf`` bandwidth: no limit), e.g. ``link:1:100`` or
``link:1:1000,1000,1000,100`` (worker 3 on a 10× slower link).

Example::

  >>> links = parse_links('link:2:100,100,100,10', workers=4)
  >>> round(links.transfer_s(3, 1_000_000), 4)      # 2 ms + 1 MB at 10 MB/s
  0.102
  >>> round(links.all_reduce_s(range(4), 1_000_000), 4)   # 6 steps of 2 ms; 1.5 MB at 10 MB/s
  0.162
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence

from hetjax._errors import ConfigError
from hetjax.core._links import LinkCost

_MB = 1e6


@dataclasses.dataclass(frozen=True)
class Links:
  """Each worker's link: ``latency_s[w]`` (α) and ``bandwidth[w]`` bytes/s (β, inf: no limit)."""

  latency_s: tuple[float, ...]
  bandwidth: tuple[float, ...]

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
    return f'link:{ms}:{mb}'

  def _check(self, worker: int) -> None:
    if not 0 <= worker < self.workers:
      raise ConfigError(f'worker {worker} is not one of the {self.workers} workers of the links')


def parse_links(spec: str, workers: int) -> Links:
  """``none`` or ``link:LATENCY_MS:BANDWIDTH_MB_S`` (module docstring) for ``workers`` workers.

  Raises:
    ConfigError: one line naming what is wrong.
  """
  text = spec.strip()
  if text == 'none':
    return Links.none(workers)
  name, _, rest = text.partition(':')
  fields = rest.split(':') if rest else []
  if name != 'link' or len(fields) != 2:
    raise ConfigError(f'bad links {spec!r}; expected none or link:LATENCY_MS:BANDWIDTH_MB_S '
                      '(one value, or one per worker, each)')
  latency = _values(fields[0], workers, 'latency')
  bandwidth = _values(fields[1], workers, 'bandwidth')
  return Links(tuple(a / 1e3 for a in latency), tuple(b * _MB for b in bandwidth))


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
