"""The α–β link model: what moving bytes costs, written once for every place that prices it.

A message of b bytes over a link of latency α (seconds) and bandwidth β (bytes/s) takes
α + b / β. A ring collective over n members runs in passes of n − 1 steps; in each step every
member sends 1/n of the data to its neighbour, so one pass costs (n − 1)·α + (n − 1)/n · b/β on
every link at once. An all-reduce is two passes (a reduce-scatter, then an all-gather):

  ring all-reduce of b bytes over n = 2(n − 1)·α + 2(n − 1)/n · b/β   (0 for n = 1)

Emulated links (`hetjax.emulation.Links`), the virtual clocks (`hetjax.simulation`,
`hetjax.simulation.simulate_sync`), the planner's cost models, the calibration that fits α and β
to measured all-reduces (`hetjax.runtime.fit_allreduce`) and the benches all price through this
module, so a change to the model is one change, and a number means the same in each of them.
Pure arithmetic: no devices, no clocks.

Example::

  >>> link = LinkCost(alpha_s=2e-3, beta_bytes_per_s=1e7)   # 2 ms, 10 MB/s
  >>> round(link.send_s(1_000_000), 6)                       # 2 ms + 1 MB at 10 MB/s
  0.102
  >>> round(link.ring_all_reduce_s(1_000_000, 4), 6)         # 6 steps of 2 ms; 1.5 MB each link
  0.162
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable

from hetjax._errors import ConfigError


class Collective(enum.Enum):
  """What a step program moves across the links (`hetjax.core.Pace.exchange` prices it):

  * ``GRADIENT``: a step's gradient exchange, however the links carry it: a ring all-reduce
    over every worker, or, through a server, each worker's own push and pull
    (`hetjax.emulation.Exchange`);
  * ``ALL_REDUCE``: a ring all-reduce over every worker, whatever else the links could do;
  * ``ALL_GATHER``: a ring all-gather over every worker, the bytes being each worker's part.
  """

  GRADIENT = 'gradient'
  ALL_REDUCE = 'all-reduce'
  ALL_GATHER = 'all-gather'


def ring_steps(n: int, passes: int = 2) -> int:
  """Messages each member sends in ``passes`` ring passes over ``n`` members: passes × (n − 1)
  (an all-reduce is 2 passes; an all-gather or a reduce-scatter 1)."""
  return passes * (n - 1)


def ring_fraction(n: int, passes: float = 2) -> float:
  """The part of the data each member's link carries in ``passes`` ring passes over ``n``:
  passes × (n − 1) / n (1.5 for an all-reduce over 4)."""
  return passes * (n - 1) / n


def ring_bytes(nbytes: float, n: int, passes: float = 2) -> float:
  """Bytes through each member's link in ``passes`` ring passes of ``nbytes`` over ``n``."""
  return passes * (n - 1) / n * nbytes


@dataclasses.dataclass(frozen=True)
class LinkCost:
  """One link's latency α and bandwidth β; the defaults cost nothing.

  Attributes:
    alpha_s: seconds per message, finite and >= 0.
    beta_bytes_per_s: bytes per second, > 0 (``inf``: no limit).
  """

  alpha_s: float = 0.0
  beta_bytes_per_s: float = math.inf

  def __post_init__(self):
    if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
      raise ConfigError(f'link latency alpha_s must be finite and >= 0, got {self.alpha_s!r}')
    if not self.beta_bytes_per_s > 0:  # also NaN
      raise ConfigError(f'link bandwidth beta_bytes_per_s must be > 0, got '
                        f'{self.beta_bytes_per_s!r}')

  @classmethod
  def slowest(cls, links: Iterable[LinkCost]) -> LinkCost:
    """The pace of a collective over ``links``: the largest latency and the least bandwidth
    (a ring step ends when its slowest link has delivered)."""
    links = list(links)
    if not links:
      raise ConfigError('the slowest of no links')
    return cls(max(link.alpha_s for link in links), min(link.beta_bytes_per_s for link in links))

  def time_s(self, messages: float, nbytes: float) -> float:
    """``messages`` latencies plus ``nbytes`` through the link: messages·α + bytes/β."""
    return messages * self.alpha_s + nbytes / self.beta_bytes_per_s

  def send_s(self, nbytes: float) -> float:
    """One message of ``nbytes``: α + bytes/β (a push, a pull, a point-to-point transfer)."""
    return self.alpha_s + nbytes / self.beta_bytes_per_s

  def ring_all_reduce_s(self, nbytes: float, n: int) -> float:
    """A ring all-reduce of ``nbytes`` over ``n`` members: 2(n − 1)·α + 2(n − 1)/n · bytes/β,
    0 for fewer than two members."""
    if n < 2:
      return 0.0
    return self.time_s(ring_steps(n), ring_bytes(nbytes, n))

  def ring_all_gather_s(self, nbytes_each: float, n: int) -> float:
    """A ring all-gather over ``n`` members, each contributing ``nbytes_each``: (n − 1)·α +
    (n − 1) · bytes_each/β, 0 for fewer than two members."""
    if n < 2:
      return 0.0
    return self.time_s(ring_steps(n, passes=1), (n - 1) * nbytes_each)

  @classmethod
  def fit_ring_all_reduce(cls, n: int, small_s: float, large_bytes: float,
                          large_s: float) -> LinkCost:
    """α and β from two timed all-reduces over ``n`` members: a tiny one of ``small_s``
    (all latency: α = small_s / 2(n − 1)) and one of ``large_bytes`` taking ``large_s`` (the
    difference is the bandwidth term). One member: α = small_s, β = inf (nothing to move)."""
    alpha = small_s / max(ring_steps(n), 1)
    extra = max(large_s - small_s, 1e-9)
    beta = ring_bytes(large_bytes, n) / extra if n > 1 else math.inf
    return cls(alpha, beta)

  @classmethod
  def for_time(cls, seconds: float, messages: float, nbytes: float, alpha_s: float) -> LinkCost:
    """The link of latency ``alpha_s`` on which ``messages`` messages carrying ``nbytes`` in
    all take ``seconds`` (`time_s` solved for β): a bench's network of a chosen cost.

    Raises:
      ConfigError: the latencies alone take ``seconds`` or more.
    """
    room = seconds - messages * alpha_s
    if not room > 0:
      raise ConfigError(f'{messages:g} latencies of {alpha_s:g} s alone take {seconds:g} s or '
                        'more: no bandwidth gives that time')
    return cls(alpha_s, nbytes / room)
