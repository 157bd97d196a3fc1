"""The slowdowns of the workers that remain after some were left out of a job."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError
from hetjax.emulation._traces import SlowdownTrace, _Trace


@dataclasses.dataclass(frozen=True)
class SubsetTrace(_Trace):
  """``trace`` seen by the workers ``hosts`` of it only: worker i runs on host ``hosts[i]``.

  A job restarted on fewer workers (``launch --min-workers``) keeps the slowdown spec it was
  given for all of them; each remaining worker keeps its own host's speed.

  Example::

    >>> SubsetTrace(StaticTrace((1, 1, 1, 3)), (0, 1, 3)).factors(0)
    array([1., 1., 3.])
  """

  trace: SlowdownTrace
  hosts: tuple[int, ...]

  def __post_init__(self):
    hosts = tuple(int(h) for h in self.hosts)
    if not hosts or len(set(hosts)) != len(hosts) or not all(
        0 <= h < self.trace.workers for h in hosts):
      raise ConfigError(f'hosts {list(hosts)} are not distinct workers of the slowdown spec '
                        f'for {self.trace.workers}')
    object.__setattr__(self, 'hosts', hosts)

  @property
  def workers(self) -> int:
    return len(self.hosts)

  def factors(self, step: int) -> np.ndarray:
    return np.asarray(self.trace.factors(step))[list(self.hosts)]

  def delays(self, step: int) -> np.ndarray:
    return np.asarray(self.trace.delays(step))[list(self.hosts)]

  def describe(self) -> str:
    return f'{self.trace.describe()} on workers {",".join(map(str, self.hosts))}'


def subset(trace: SlowdownTrace, hosts: Sequence[int]) -> SlowdownTrace:
  """``trace`` itself when ``hosts`` is all of its workers in order, else a `SubsetTrace`."""
  if tuple(hosts) == tuple(range(trace.workers)):
    return trace
  return SubsetTrace(trace, tuple(hosts))
