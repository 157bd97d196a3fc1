"""What the planner knows about a cluster: workers (devices, speed, memory) and the links.

A cluster file lists the workers and the α–β link model (α seconds per message, β bytes per
second), with an optional faster pair for links inside one worker::

  {"workers": [{"devices": 4, "speed": 2e12, "memory": 16e9},
               {"devices": 4, "speed": 1e12, "memory": 16e9}],
   "alpha_s": 2e-5, "beta_gbit_s": 10,
   "intra_alpha_s": 1e-6, "intra_beta_gbit_s": 800}

``speed`` is FLOP/s and ``memory`` bytes, both per device; an optional ``bandwidth`` (memory
bytes/s per device) makes the cost model charge memory traffic too. β may be given as
``beta_gbit_s`` (gigabits per second, as links are sold) or ``beta_bytes_per_s``.

``devices`` is a count or the devices' names: the ``cluster.json`` a run writes
(`hetjax.runtime.Cluster.to_json`) is this format, its workers listing their devices by name
with fields the planner does not use (``samples_per_s``, ``host``, …), so
``ClusterSpec.load('runs/x/cluster.json')`` plans for the cluster that run measured.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
from collections.abc import Mapping, Sequence

from hetjax._checks import number, positive_int, positive_number
from hetjax._errors import ConfigError
from hetjax.core import LinkCost


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
  """One worker (process) and its local devices, which are alike.

  Attributes:
    devices: local devices.
    flops_per_s: sustained FLOP/s of one device.
    memory_bytes: memory of one device.
    memory_bytes_per_s: sustained memory bandwidth of one device; None leaves memory traffic
      out of the cost model (compute-bound devices).
  """

  devices: int
  flops_per_s: float
  memory_bytes: float
  memory_bytes_per_s: float | None = None


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
  """Workers and the α–β cost of their links: a message of m bytes takes α + m / β seconds.

  Attributes:
    workers: in process order (worker i is process i; the plan mesh puts workers first).
    alpha_s: latency of one message between workers.
    beta_bytes_per_s: bandwidth between workers.
    intra_alpha_s: latency inside a worker (None: same as between workers).
    intra_beta_bytes_per_s: bandwidth inside a worker (None: same as between workers).
  """

  workers: tuple[WorkerSpec, ...]
  alpha_s: float = 1e-5
  beta_bytes_per_s: float = 1.25e9
  intra_alpha_s: float | None = None
  intra_beta_bytes_per_s: float | None = None

  def __post_init__(self):
    if not self.workers:
      raise ConfigError('a cluster needs at least one worker')
    for i, w in enumerate(self.workers):
      positive_int(w.devices, f'worker {i}: "devices"')
      positive_number(w.flops_per_s, f'worker {i}: flops_per_s')
      positive_number(w.memory_bytes, f'worker {i}: memory_bytes')
    number(self.alpha_s, 'cluster: alpha_s')
    positive_number(self.beta_bytes_per_s, 'cluster: beta_bytes_per_s')
    if self.intra_alpha_s is not None:
      number(self.intra_alpha_s, 'cluster: intra_alpha_s')
    if self.intra_beta_bytes_per_s is not None:
      positive_number(self.intra_beta_bytes_per_s, 'cluster: intra_beta_bytes_per_s')

  @functools.cached_property
  def devices(self) -> int:
    """Devices over all workers."""
    return sum(w.devices for w in self.workers)

  @functools.cached_property
  def counts(self) -> tuple[int, ...]:
    """Each worker's device count."""
    return tuple(w.devices for w in self.workers)

  @functools.cached_property
  def devices_per_worker(self) -> int | None:
    """The workers' common device count, or None if they differ."""
    counts = {w.devices for w in self.workers}
    return counts.pop() if len(counts) == 1 else None

  @functools.cached_property
  def uniform_speed(self) -> bool:
    """Whether every device is equally fast (then only the all-workers group is worth trying)."""
    return len({w.flops_per_s for w in self.workers}) == 1

  def link(self, inside_worker: bool) -> LinkCost:
    """The α–β link of a collective inside one worker or across workers."""
    if not inside_worker:
      return LinkCost(self.alpha_s, self.beta_bytes_per_s)
    alpha = self.alpha_s if self.intra_alpha_s is None else self.intra_alpha_s
    beta = self.beta_bytes_per_s if self.intra_beta_bytes_per_s is None else (
        self.intra_beta_bytes_per_s)
    return LinkCost(alpha, beta)

  def with_bandwidth(self, beta_bytes_per_s: float) -> ClusterSpec:
    """The same cluster with every link at ``beta_bytes_per_s`` (α unchanged): what a plan
    would cost on another network."""
    return dataclasses.replace(self, beta_bytes_per_s=beta_bytes_per_s, intra_beta_bytes_per_s=None)

  def with_slowdowns(self, factors: Sequence[float]) -> ClusterSpec:
    """The same cluster with worker i's devices ``factors[i]`` times slower (speed and memory
    bandwidth divided by it): what the planner should know of emulated hosts of known speed
    (`hetjax.emulation`) or of hosts another job slows down.

    Example: ``measured.with_slowdowns((1, 1, 3, 3))`` — workers 2 and 3 at a third the speed.
    """
    factors = tuple(float(f) for f in factors)
    if len(factors) != len(self.workers) or not all(math.isfinite(f) and f > 0 for f in factors):
      raise ConfigError(f'slowdowns {list(factors)} must be {len(self.workers)} positive finite '
                        'factors, one per worker')
    workers = tuple(dataclasses.replace(
        w, flops_per_s=w.flops_per_s / f,
        memory_bytes_per_s=None if w.memory_bytes_per_s is None else w.memory_bytes_per_s / f)
        for w, f in zip(self.workers, factors, strict=True))
    return dataclasses.replace(self, workers=workers)

  def regroup(self, counts: Sequence[int]) -> ClusterSpec:
    """The same devices as workers of ``counts`` devices each (their per-device speed, memory and
    bandwidth those of the first worker): a one-process measurement of this machine's devices
    standing for a job of several workers. Links keep their measured α and β.

    Raises:
      ConfigError: counts that do not add up to the cluster's devices.
    """
    counts = tuple(int(c) for c in counts)
    if sum(counts) != self.devices or any(c < 1 for c in counts):
      raise ConfigError(f'worker device counts {list(counts)} must be positive and add up to '
                        f'the {self.devices} devices of the cluster')
    first = self.workers[0]
    return dataclasses.replace(self, workers=tuple(dataclasses.replace(first, devices=c)
                                                   for c in counts))

  @classmethod
  def uniform(cls, workers: int, devices_per_worker: int, flops_per_s: float,
              memory_bytes: float, alpha_s: float = 1e-5, beta_bytes_per_s: float = 1.25e9,
              **links: float) -> ClusterSpec:
    """``workers`` identical workers. Example: ``ClusterSpec.uniform(128, 8, 1e12, 16e9)`` is a
    1,024-device cluster; ``links`` may set ``intra_alpha_s`` / ``intra_beta_bytes_per_s``."""
    if workers < 1:
      raise ConfigError(f'a cluster needs at least one worker, got {workers}')
    spec = WorkerSpec(devices_per_worker, flops_per_s, memory_bytes)
    return cls((spec,) * workers, alpha_s, beta_bytes_per_s, **links)

  @classmethod
  def from_json(cls, data: Mapping) -> ClusterSpec:
    """Reads the format in this module's docstring.

    Raises:
      ConfigError: no workers, or a worker whose ``devices``, ``speed`` or ``memory`` is missing,
        not a number, zero, negative or NaN (the message names the worker and the field).
    """
    if isinstance(data, list):
      raise ConfigError('a cluster must be a JSON object {"workers": [...]}, got a list: a '
                        'cluster.json of an older run, without device speeds; rerun to rewrite it')
    if not isinstance(data, Mapping):
      raise ConfigError(f'a cluster must be a JSON object, got {type(data).__name__}')
    entries = data.get('workers')
    if not isinstance(entries, list) or not entries:
      raise ConfigError('a cluster needs "workers": a non-empty list of '
                        '{"devices", "speed", "memory"}')
    workers = []
    for i, entry in enumerate(entries):
      if not isinstance(entry, Mapping):
        raise ConfigError(f'worker {i}: expected {{"devices", "speed", "memory"}}, got {entry!r}')
      devices = entry.get('devices', 1)
      if isinstance(devices, list) and devices and all(isinstance(d, str) for d in devices):
        devices = len(devices)  # a run's cluster.json names them
      positive_int(devices, f'worker {i}: "devices"')
      bandwidth = (_number(entry, 'bandwidth', f'worker {i}') if 'bandwidth' in entry
                   else None)
      workers.append(WorkerSpec(int(devices), _number(entry, 'speed', f'worker {i}'),
                                _number(entry, 'memory', f'worker {i}'), bandwidth))
    links = {'alpha_s': _link(data, 'alpha_s', 1e-5),
             'beta_bytes_per_s': _beta(data, 'beta', 1.25e9),
             'intra_alpha_s': _link(data, 'intra_alpha_s', None),
             'intra_beta_bytes_per_s': _beta(data, 'intra_beta', None)}
    return cls(tuple(workers), **links)

  @classmethod
  def load(cls, path: str | os.PathLike) -> ClusterSpec:
    path = pathlib.Path(path)
    try:
      data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise ConfigError(f'cannot read cluster {path}: {e}') from None
    return cls.from_json(data)

  def to_json(self) -> dict:
    out = {'workers': [{'devices': w.devices, 'speed': w.flops_per_s, 'memory': w.memory_bytes,
                        **({'bandwidth': w.memory_bytes_per_s} if w.memory_bytes_per_s else {})}
                       for w in self.workers],
           'alpha_s': self.alpha_s, 'beta_bytes_per_s': self.beta_bytes_per_s}
    if self.intra_alpha_s is not None:
      out['intra_alpha_s'] = self.intra_alpha_s
    if self.intra_beta_bytes_per_s is not None:
      out['intra_beta_bytes_per_s'] = self.intra_beta_bytes_per_s
    return out


def _number(entry: Mapping, field: str, where: str) -> float:
  if field not in entry:
    raise ConfigError(f'{where}: missing "{field}"')
  return positive_number(entry[field], f'{where}: "{field}"')


def _link(data: Mapping, field: str, default: float | None) -> float | None:
  if field not in data:
    return default
  return number(data[field], f'cluster: {field}')


def _beta(data: Mapping, prefix: str, default: float | None) -> float | None:
  """β from ``<prefix>_gbit_s`` (Gbit/s) or ``<prefix>_bytes_per_s``."""
  gbit, raw = f'{prefix}_gbit_s', f'{prefix}_bytes_per_s'
  if gbit in data and raw in data:
    raise ConfigError(f'cluster: give "{gbit}" or "{raw}", not both')
  if gbit in data:
    return positive_number(data[gbit], f'cluster: {gbit}') * 1e9 / 8
  if raw in data:
    return positive_number(data[raw], f'cluster: {raw}')
  return default
