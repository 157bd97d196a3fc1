"""`Cluster`: what the job's workers are, as a value every worker agrees on.

Its JSON (`Cluster.to_json`, a run's ``cluster.json``) is the planner's cluster format
(`hetjax.planner.ClusterSpec.from_json`), so what a run measured is what the next plan is made
for: one object, ``{"workers": [...]}``, each worker with ``devices`` (their names; the planner
counts them), ``speed`` (FLOP/s of one device) and ``memory`` (bytes of one device), plus what
only a run knows: ``samples_per_s`` on its reference step (slowdown included), ``worker``,
``host`` and ``device_kind``. Links (``alpha_s``, ``beta_…``) are left to the planner's
defaults or to whoever edits the file.

Example::

  {"workers": [{"worker": 0, "host": "a", "devices": ["cpu:0", "cpu:1"], "device_kind": "cpu",
                "memory": 8.4e9, "speed": 2.1e10, "samples_per_s": 5120.0}, ...]}

Files of older runs (a JSON list of workers, with ``speed`` in samples/s and no device speed)
still load here; the planner refuses them in one line, as they say nothing of FLOP/s.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping, Sequence

import jax

from hetjax._errors import ConfigError
from hetjax.runtime._calibrate import device_flops_per_s, device_memory
from hetjax.runtime._kv import Channel


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
  """One worker: its devices and its measured speed.

  Attributes:
    worker: the worker id (`jax.process_index()`).
    host: the host name.
    devices: the local devices, e.g. ``('cpu:0', 'cpu:1')``.
    device_kind: `jax.Device.device_kind` of the first local device.
    memory_bytes: memory of one device: the accelerator's limit, or the host's physical memory
      shared out over its local devices (`device_memory`); ``None`` in older files.
    speed: samples per second on the reference step, slowdown included.
    flops_per_s: FLOP/s of one device (`device_flops_per_s`); ``None`` in older files.
  """

  worker: int
  host: str
  devices: tuple[str, ...]
  device_kind: str
  memory_bytes: int | None
  speed: float
  flops_per_s: float | None = None

  def to_json(self) -> dict:
    """This worker's entry of the cluster format (module docstring)."""
    out = {'worker': self.worker, 'host': self.host, 'devices': list(self.devices),
           'device_kind': self.device_kind, 'memory': self.memory_bytes,
           'samples_per_s': self.speed}
    if self.flops_per_s is not None:
      out['speed'] = self.flops_per_s
    return out

  @classmethod
  def from_json(cls, entry: Mapping) -> WorkerInfo:
    """Reads an entry of `to_json`, or of an older run's list (its field names, speed in
    samples/s)."""
    try:
      if 'samples_per_s' not in entry:  # an older run's entry: the field names as they were
        return cls(**{**entry, 'devices': tuple(entry['devices'])})
      return cls(int(entry['worker']), str(entry['host']), tuple(entry['devices']),
                 str(entry['device_kind']), entry.get('memory'), float(entry['samples_per_s']),
                 None if entry.get('speed') is None else float(entry['speed']))
    except (KeyError, TypeError, ValueError) as e:
      raise ConfigError(f'bad worker entry in a cluster: {type(e).__name__}: {e}') from None


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The workers of a job, in worker order. Plain data: JSON round-trips via `to_json`, which
  the planner reads too (module docstring)."""

  workers: tuple[WorkerInfo, ...]

  @property
  def size(self) -> int:
    return len(self.workers)

  @property
  def speeds(self) -> tuple[float, ...]:
    """Each worker's samples/s on the reference step."""
    return tuple(w.speed for w in self.workers)

  def to_json(self) -> dict:
    return {'workers': [w.to_json() for w in self.workers]}

  @classmethod
  def from_json(cls, data: Mapping | Sequence[Mapping]) -> Cluster:
    """Reads `to_json`'s object, or an older run's list of workers."""
    rows = data.get('workers') if isinstance(data, Mapping) else data
    if not isinstance(rows, list | tuple):
      raise ConfigError('a cluster needs "workers": a list of worker entries')
    return cls(tuple(WorkerInfo.from_json(r) for r in rows))


def local_worker_info(speed: float, flops_per_s: float | None = None) -> WorkerInfo:
  """This process's `WorkerInfo`, with ``speed`` (samples/s) as measured by the caller and the
  FLOP/s of one device measured here unless given."""
  devices = jax.local_devices()
  flops = device_flops_per_s(devices, repeats=3) if flops_per_s is None else float(flops_per_s)
  return WorkerInfo(
      worker=jax.process_index(), host=socket.gethostname(),
      devices=tuple(f'{d.platform}:{d.id}' for d in devices), device_kind=devices[0].device_kind,
      memory_bytes=int(device_memory(devices)), speed=float(speed), flops_per_s=flops)


def discover_cluster(speed: float, channel: Channel | None = None, timeout_s: float = 60.0) -> Cluster:
  """Every worker publishes its `WorkerInfo` and reads everyone's: the same `Cluster` everywhere.

  Args:
    speed: this worker's measured samples/s on the reference step.
    channel: the coordination channel (not needed in a single-process run).
  """
  mine = local_worker_info(speed)
  if jax.process_count() == 1 or channel is None:
    return Cluster((mine,))
  channel.set(f'cluster/{mine.worker}', mine.to_json())
  rows = [channel.get(f'cluster/{w}', timeout_s) for w in range(jax.process_count())]
  return Cluster.from_json(rows)
