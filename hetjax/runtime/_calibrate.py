"""Measuring the machine at hand: all-reduce latency and bandwidth across workers, device speed
and memory (what a run's `hetjax.runtime.Cluster` and the planner's measured cluster record)."""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hetjax.core import LinkCost


@dataclasses.dataclass(frozen=True)
class AllReduceFit:
  """A ring all-reduce model fitted to two measurements: t(b) = 2(n−1)·α + 2(n−1)/n · b/β
  (`hetjax.core.LinkCost.fit_ring_all_reduce`; `link` is the fitted model).

  Attributes:
    workers: n, the number of participants measured.
    alpha_s: per-message latency.
    beta_bytes_per_s: bandwidth.
    small_s, large_s: the measured seconds for ``small_bytes`` and ``large_bytes``.
  """

  workers: int
  alpha_s: float
  beta_bytes_per_s: float
  small_bytes: int
  small_s: float
  large_bytes: int
  large_s: float

  @property
  def link(self) -> LinkCost:
    """The fitted α and β as the α–β model the planner and the virtual clocks price with."""
    return LinkCost(self.alpha_s, self.beta_bytes_per_s)


def time_allreduce(mesh: Mesh, axis: str, floats: int, repeats: int = 10) -> float:
  """Median seconds of a `lax.psum` over ``axis`` of ``floats`` float32 per participant.

  Every process of the job must call this with the same arguments (it is a collective).
  """
  x = _stacked_ones(mesh, axis, floats)
  reduce = jax.jit(jax.shard_map(lambda v: lax.psum(v, axis), mesh=mesh,
                                 in_specs=PartitionSpec(axis), out_specs=PartitionSpec()))
  return median_seconds(reduce, x, repeats)


def median_seconds(fn, arg, repeats: int = 10) -> float:
  """Median wall seconds of ``fn(arg)`` (waited for) after one untimed, compiling call."""
  jax.block_until_ready(fn(arg))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(arg))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def seconds_per_call(fn, args: tuple, rounds: int = 5, calls: int = 5) -> float:
  """Median over ``rounds`` of the seconds per call of ``calls`` back-to-back calls of
  ``fn(*args)``, waited for at the end, after one untimed call (compile, first touch): calls
  issued as a step issues its programs, one's dispatch overlapping the last one's work.

  Raises:
    RuntimeError: if a timing is not a positive finite number (the clock misbehaved).
  """
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(calls):
      out = fn(*args)
    jax.block_until_ready(out)
    samples.append((time.perf_counter() - start) / calls)
  seconds = float(np.median(samples))
  if not (np.isfinite(seconds) and seconds > 0):
    raise RuntimeError(f'a timing of {seconds} s: the clock or the device misbehaved')
  return seconds


def _stacked_ones(mesh: Mesh, axis: str, floats: int) -> jax.Array:
  n = mesh.shape[axis]
  sharding = NamedSharding(mesh, PartitionSpec(axis))
  return jax.make_array_from_callback((n * floats,), sharding,
                                      lambda index: np.ones((floats,), np.float32))


def fit_allreduce(mesh: Mesh, axis: str, large_floats: int, repeats: int = 10) -> AllReduceFit:
  """Fits α and β from an all-reduce of one float and one of ``large_floats`` floats."""
  n = mesh.shape[axis]
  small_s = time_allreduce(mesh, axis, 1, repeats)
  large_s = time_allreduce(mesh, axis, large_floats, repeats)
  link = LinkCost.fit_ring_all_reduce(n, small_s, 4 * large_floats, large_s)
  return AllReduceFit(n, link.alpha_s, link.beta_bytes_per_s, 4, small_s, 4 * large_floats,
                      large_s)


_MATMUL = 256  # n of the n×n×n matmuls timed per device
_ACCELERATOR_MATMUL = 4096  # the same on a GPU or TPU

#: Operations chained in one timed program on an accelerator (one on a CPU, where a single one
#: runs long enough). On an accelerator a call's dispatch and wait cost more than a 4096²
#: bfloat16 product or a 16 MiB update itself: each, timed alone, runs at a fraction of what
#: the chip does. Sixteen in one program share that cost.
ACCELERATOR_CHAIN = 16


def chain_length(device: jax.Device) -> int:
  """How many operations a timed program chains on ``device``: 1 on a CPU,
  `ACCELERATOR_CHAIN` elsewhere."""
  return 1 if device.platform == 'cpu' else ACCELERATOR_CHAIN


def matmul_seconds(x: jax.Array, chain: int, repeats: int, out_shardings=None) -> float:
  """Median seconds of one n×n by n×n product on ``x: [..., n, n]`` (each leading index its
  own product): ``chain`` products ``y ← y @ w`` run back to back in one program, its time
  over ``chain``. ``w = 2x/n``: for ``x`` uniform in [0, 1) a product's entries average those
  of ``y`` (no overflow or underflow in 16-bit floats; ones double each time, 2¹⁶ after 16, well
  inside float32), and every product depends on the last, so none is skipped."""
  n = x.shape[-1]

  def products(a):
    w = a * jnp.asarray(2.0 / n, a.dtype)
    return lax.fori_loop(0, chain, lambda _, y: jnp.einsum('...ij,...jk->...ik', y, w), a)

  return median_seconds(jax.jit(products, out_shardings=out_shardings), x, repeats) / chain


def device_flops_per_s(devices, repeats: int = 5) -> float:
  """FLOP/s of one of ``devices``: every device multiplies n×n matrices at once (so devices
  that share cores, like virtual CPU devices, are measured sharing them); FLOPs over the median
  time. n is 256 on CPUs and 4096 on accelerators (`_ACCELERATOR_MATMUL`: a 256³ product is
  mostly launch overhead on a GPU, which would price the device orders of magnitude too slow),
  where `ACCELERATOR_CHAIN` products run in one program (`matmul_seconds`). ``devices`` may be
  this process's (a run's discovery) or the job's (the planner's)."""
  mesh = Mesh(np.array(list(devices)), ('all',))
  count = mesh.devices.size
  first = mesh.devices.flat[0]
  n = _MATMUL if first.platform == 'cpu' else _ACCELERATOR_MATMUL
  sharding = NamedSharding(mesh, PartitionSpec('all'))
  a = jax.device_put(jnp.ones((count, n, n), jnp.float32), sharding)
  return 2 * n ** 3 / matmul_seconds(a, chain_length(first), repeats, out_shardings=sharding)


def device_memory(devices) -> float:
  """Bytes one of ``devices`` can hold: the accelerator's limit, or the host's RAM shared out.
  Another process's devices cannot be asked: they are taken to be like this process's."""
  local = devices[0].process_index == jax.process_index()
  try:
    stats = devices[0].memory_stats() if local else None
  except Exception:  # not every backend implements memory_stats
    stats = None
  if stats and stats.get('bytes_limit'):
    return float(stats['bytes_limit'])
  try:
    host = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    host = 8 << 30
  return float(host) / max(len(devices), 1)
