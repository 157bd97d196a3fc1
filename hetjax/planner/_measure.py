"""Measuring the cluster at hand for the planner: device speed, memory, α and β."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.planner._cluster import ClusterSpec, WorkerSpec
from hetjax.runtime._calibrate import fit_allreduce, median_seconds

_MATMUL = 256  # n of the n×n×n matmuls timed per device


def measure_cluster(devices=None, repeats: int = 5) -> ClusterSpec:
  """This job's devices as a `ClusterSpec`, measured, not assumed.

  Speed: every device multiplies 256×256 matrices at once (so devices that share cores, like
  virtual CPU devices, are measured sharing them); FLOPs over the median time, per device.
  Bandwidth: every device updating 16 MiB at once, bytes read and written per second.
  Memory: the accelerator's ``bytes_limit``, or on CPU the host's physical memory split over
  its local devices. α and β: an all-reduce over all devices fitted as in
  `hetjax.runtime.fit_allreduce` (one float, then 1 MiB).
  """
  devices = list(devices if devices is not None else jax.devices())
  mesh = Mesh(np.array(devices), ('all',))
  speed = _flops_per_device(mesh, repeats)
  bandwidth = _bandwidth_per_device(mesh, repeats)
  fit = fit_allreduce(mesh, 'all', 1 << 18, repeats) if len(devices) > 1 else None
  by_worker: dict[int, list] = {}
  for d in devices:
    by_worker.setdefault(d.process_index, []).append(d)
  workers = tuple(WorkerSpec(len(ds), speed, device_memory(ds), bandwidth)
                  for ds in by_worker.values())
  alpha = fit.alpha_s if fit else 1e-6
  beta = fit.beta_bytes_per_s if fit else 1e12
  return ClusterSpec(workers, alpha_s=alpha, beta_bytes_per_s=beta)


def _flops_per_device(mesh: Mesh, repeats: int) -> float:
  n, count = _MATMUL, mesh.devices.size
  sharding = NamedSharding(mesh, PartitionSpec('all'))
  a = jax.device_put(jnp.ones((count, n, n), jnp.float32), sharding)
  matmul = jax.jit(lambda x: jnp.einsum('bij,bjk->bik', x, x), out_shardings=sharding)
  return 2 * n ** 3 / median_seconds(matmul, a, repeats)


def _bandwidth_per_device(mesh: Mesh, repeats: int) -> float:
  """Bytes/s one device streams (read + write) while every device updates 16 MiB at once."""
  floats, count = 1 << 22, mesh.devices.size
  sharding = NamedSharding(mesh, PartitionSpec('all'))
  a = jax.device_put(jnp.ones((count, floats), jnp.float32), sharding)
  update = jax.jit(lambda x: x * 0.999 + 1.0, out_shardings=sharding)
  return 2 * 4 * floats / median_seconds(update, a, repeats)


def device_memory(devices) -> float:
  """Bytes one of ``devices`` can hold: the accelerator's limit, or the host's RAM shared out.
  Another process's devices cannot be asked: they are taken to be like this process's."""
  local = devices[0].process_index == jax.process_index()
  stats = devices[0].memory_stats() if local and hasattr(devices[0], 'memory_stats') else None
  if stats and stats.get('bytes_limit'):
    return float(stats['bytes_limit'])
  try:
    host = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError):
    host = 8 << 30
  return float(host) / max(len(devices), 1)
