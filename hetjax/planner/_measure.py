"""Measuring the cluster at hand for the planner: device speed, memory, α and β."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.planner._cluster import ClusterSpec, WorkerSpec
from hetjax.runtime import (
  chain_length,
  device_flops_per_s,
  device_memory,
  fit_allreduce,
  median_seconds,
)

_UPDATE_FLOATS = 1 << 22  # 16 MiB updated per device on a CPU
_ACCELERATOR_UPDATE_FLOATS = 1 << 26  # 256 MiB on an accelerator: microseconds at its bandwidth


def measure_cluster(devices=None, repeats: int = 5) -> ClusterSpec:
  """This job's devices as a `ClusterSpec`, measured, not assumed.

  Speed: every device multiplies 256×256 matrices at once (so devices that share cores, like
  virtual CPU devices, are measured sharing them); FLOPs over the median time, per device.
  Bandwidth: every device updating 16 MiB at once (256 MiB on an accelerator, 16 updates
  chained in one program), bytes read and written per second.
  Memory: the accelerator's ``bytes_limit``, or on CPU the host's physical memory split over
  its local devices. α and β: an all-reduce over all devices fitted as in
  `hetjax.runtime.fit_allreduce` (one float, then 1 MiB).
  """
  devices = list(devices if devices is not None else jax.devices())
  mesh = Mesh(np.array(devices), ('all',))
  speed = device_flops_per_s(devices, repeats)
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


def _bandwidth_per_device(mesh: Mesh, repeats: int) -> float:
  """Bytes/s one device streams (read + write) while every device updates its buffer at once:
  16 MiB on a CPU; on an accelerator 256 MiB, `chain_length` updates in one program (each reads
  and writes the whole buffer: one loop iteration cannot fuse into the next), so a call's
  dispatch is not counted as memory time."""
  first, count = mesh.devices.flat[0], mesh.devices.size
  floats = _UPDATE_FLOATS if first.platform == 'cpu' else _ACCELERATOR_UPDATE_FLOATS
  chain = chain_length(first)
  sharding = NamedSharding(mesh, PartitionSpec('all'))
  a = jax.device_put(jnp.ones((count, floats), jnp.float32), sharding)
  update = jax.jit(lambda x: jax.lax.fori_loop(0, chain, lambda _, y: y * 0.999 + 1.0, x),
                   out_shardings=sharding)
  return 2 * 4 * floats * chain / median_seconds(update, a, repeats)
