"""`Cluster`: what the job's workers are, as a value every worker agrees on."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Sequence

import jax

from hetjax.runtime._kv import Channel


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
  """One worker: its devices and its measured speed.

  Attributes:
    worker: the worker id (`jax.process_index()`).
    host: the host name.
    devices: the local devices, e.g. ``('cpu:0', 'cpu:1')``.
    device_kind: `jax.Device.device_kind` of the first local device.
    memory_bytes: memory per device where the runtime reports it (accelerators), else the host's
      physical memory; ``None`` if neither is known.
    speed: samples per second on the reference step, slowdown included.
  """

  worker: int
  host: str
  devices: tuple[str, ...]
  device_kind: str
  memory_bytes: int | None
  speed: float


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The workers of a job, in worker order. Plain data: JSON round-trips via `to_json`."""

  workers: tuple[WorkerInfo, ...]

  @property
  def size(self) -> int:
    return len(self.workers)

  @property
  def speeds(self) -> tuple[float, ...]:
    return tuple(w.speed for w in self.workers)

  def to_json(self) -> list[dict]:
    return [dataclasses.asdict(w) for w in self.workers]

  @classmethod
  def from_json(cls, rows: Sequence[dict]) -> Cluster:
    return cls(tuple(WorkerInfo(**{**r, 'devices': tuple(r['devices'])}) for r in rows))


def _memory_bytes(device: jax.Device) -> int | None:
  try:
    stats = device.memory_stats()
  except Exception:  # not every backend implements memory_stats
    stats = None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  try:
    return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None


def local_worker_info(speed: float) -> WorkerInfo:
  """This process's `WorkerInfo`, with ``speed`` as measured by the caller."""
  devices = jax.local_devices()
  return WorkerInfo(
      worker=jax.process_index(), host=socket.gethostname(),
      devices=tuple(f'{d.platform}:{d.id}' for d in devices), device_kind=devices[0].device_kind,
      memory_bytes=_memory_bytes(devices[0]), speed=float(speed))


def discover_cluster(speed: float, channel: Channel | None = None, timeout_s: float = 60.0) -> Cluster:
  """Every worker publishes its `WorkerInfo` and reads everyone's: the same `Cluster` everywhere.

  Args:
    speed: this worker's measured samples/s on the reference step.
    channel: the coordination channel (not needed in a single-process run).
  """
  mine = local_worker_info(speed)
  if jax.process_count() == 1 or channel is None:
    return Cluster((mine,))
  channel.set(f'cluster/{mine.worker}', dataclasses.asdict(mine))
  rows = [channel.get(f'cluster/{w}', timeout_s) for w in range(jax.process_count())]
  return Cluster.from_json(rows)
