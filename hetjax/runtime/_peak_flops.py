"""The peak FLOP/s of one device: the denominator of model FLOPs utilisation (MFU).

A vendor's datasheet figure is the usual denominator (an H100 SXM: 989 TFLOP/s dense bf16); where
none is declared, a large square matmul in the compute dtype, timed on the device, stands in
for it: the fastest work the device does, so MFU against it says how far a step is from the
device's own matmul speed. On CPU hosts there is no datasheet to trust, and the measured
figure is the only one.

``hetjax.runtime._calibrate.device_flops_per_s`` (the cluster file's ``speed``, what
`hetjax.planner.measure_cluster` prices plans with) is another figure of the same kind: small
float32 256×256 matmuls on every device at once, so devices that share cores are measured sharing
them. Both time jitted matmuls with ``matmul_seconds`` from that module: on an accelerator,
products chained in one program, so that a call's dispatch does not count as matmul time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hetjax._errors import ConfigError
from hetjax.runtime._calibrate import chain_length, matmul_seconds

#: n of the n×n matmul timed, by platform: large enough for an accelerator's peak (8192: 1.1
#: TFLOP, about 1.4 ms at an H100's bfloat16 speed; `ACCELERATOR_CHAIN` of them in one program),
#: and well under a second on a CPU (1024: 2.1 GFLOP, about 40 ms at 50 GFLOP/s).
SIZES = {'cpu': 1024, 'gpu': 8192, 'cuda': 8192, 'rocm': 8192, 'tpu': 8192}
_DEFAULT_SIZE = 8192


def measure_peak_flops(dtype: str = 'float32', device: jax.Device | None = None,
                       size: int | None = None, repeats: int = 5) -> float:
  """FLOP/s of an n×n by n×n matmul in ``dtype`` on ``device``: 2·n³ over the median of
  ``repeats`` timed calls, each waited for, after one call that compiles and warms up; on an
  accelerator each call chains `hetjax.runtime._calibrate.ACCELERATOR_CHAIN` products
  (`matmul_seconds`).

  Example::

    measure_peak_flops()                         # this machine's figure (n = 1024 on a CPU)
    measure_peak_flops('bfloat16', jax.devices()[0])

  Args:
    dtype: the compute dtype (``'float32'``, ``'bfloat16'``, ``'float16'``).
    device: default this process's first device.
    size: n; default `SIZES` of the device's platform (8192 on accelerators, 1024 on CPU).
    repeats: timed calls.

  Raises:
    ConfigError: ``dtype`` is not a floating-point type, or ``size`` or ``repeats`` is not
      positive.
  """
  dtype = _float_dtype(dtype)
  device = jax.local_devices()[0] if device is None else device
  n = SIZES.get(device.platform, _DEFAULT_SIZE) if size is None else size
  if n < 1 or repeats < 1:
    raise ConfigError(f'measure_peak_flops: size and repeats must be positive, got size={n}, '
                      f'repeats={repeats}')
  # Values in [0, 1): no overflow in float16 at n = 4096, and no all-equal input to shortcut.
  x = jax.device_put(np.random.default_rng(0).random((n, n), dtype=np.float32), device)
  x = x.astype(dtype)
  return 2.0 * n ** 3 / matmul_seconds(x, chain_length(device), repeats)


def peak_flops(declared: float | None, dtype: str = 'float32',
               device: jax.Device | None = None) -> tuple[float, str]:
  """The peak FLOP/s of one device and where it came from: ``(declared, 'declared')`` when a
  figure is given (a datasheet's), else ``(measure_peak_flops(dtype, device), 'measured')``.

  Example::

    peak_flops(989e12, 'bfloat16')   # (9.89e14, 'declared'): an H100 SXM's dense bf16
    peak_flops(None)                 # (…, 'measured'): this machine's figure

  Raises:
    ConfigError: ``declared`` is not a positive finite number.
  """
  if declared is None:
    return measure_peak_flops(dtype, device), 'measured'
  try:
    value = float(declared) if not isinstance(declared, bool | str) else None
  except (TypeError, ValueError):
    value = None
  if value is None or not 0 < value < float('inf'):
    raise ConfigError(f'declared peak FLOP/s must be a positive number, got {declared!r}')
  return value, 'declared'


def _float_dtype(dtype: str) -> np.dtype:
  try:
    resolved = jnp.dtype(dtype)
  except TypeError:
    resolved = None
  if resolved is None or not jnp.issubdtype(resolved, jnp.floating):
    raise ConfigError(f'peak FLOP/s is measured in a floating-point dtype (float32, bfloat16, '
                      f'float16), got {dtype!r}')
  return resolved
