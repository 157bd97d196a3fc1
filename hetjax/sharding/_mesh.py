"""Building meshes with Auto axis types, and parsing mesh shapes given as text."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from hetjax._errors import ConfigError

DEFAULT_AXES = ('data', 'model')


def parse_mesh_shape(text: str, axis_names: Sequence[str] = DEFAULT_AXES) -> tuple[int, ...]:
  """Parses ``'4x2'`` (one size per axis) into ``(4, 2)``.

  Raises:
    ConfigError: if the text is not ``len(axis_names)`` positive integers joined by ``x``.
  """
  parts = text.strip().lower().split('x')
  if len(parts) != len(axis_names) or not all(re.fullmatch(r'[1-9]\d*', p) for p in parts):
    example = 'x'.join(['2'] * len(axis_names))
    raise ConfigError(
        f'mesh {text!r} is not {len(axis_names)} positive sizes for axes {tuple(axis_names)} '
        f'(e.g. {example!r})')
  return tuple(int(p) for p in parts)


def make_mesh(
    shape: Sequence[int],
    axis_names: Sequence[str] = DEFAULT_AXES,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """Returns a mesh with `AxisType.Auto` axes over ``devices`` (default: all devices).

  `jax.make_mesh` defaults to Explicit axes; hetjax programs use sharding annotations and let
  XLA propagate them, which is what Auto axes mean.

  Devices of several processes (a job of ``python -m hetjax.launch --workers N``, one jitted
  step over every worker's devices, as MaxText runs multi-host jobs) are laid out process-major:
  the last axis runs fastest, over one process's devices, so with the default axes ``'model'``
  stays inside a process whenever its size divides the local device count and ``'data'`` spans
  the processes, which is where the network is. Two workers of four devices each::

    make_mesh((4, 2)).devices   # [[p0, p0], [p0, p0], [p1, p1], [p1, p1]] (process of each)
    make_mesh((2, 4)).devices   # [[p0, p0, p0, p0], [p1, p1, p1, p1]]
    make_mesh((1, 8)).devices   # [[p0, p0, p0, p0, p1, p1, p1, p1]]: 'model' has to span both

  Within a process the devices keep their given order (`jax.devices()`: by id). TPUs are left
  to `jax.make_mesh`, whose layout follows the slice's interconnect, which spans hosts.

  Raises:
    ConfigError: if the mesh does not use exactly the available devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(shape)
  if len(shape) != len(axis_names):
    raise ConfigError(f'mesh shape {shape} does not match axis names {tuple(axis_names)}')
  processes = sorted({d.process_index for d in devices})
  if math.prod(shape) != len(devices):
    raise ConfigError(_count_message(shape, devices, len(processes)))
  axis_types = (AxisType.Auto,) * len(shape)
  if len(processes) > 1 and devices[0].platform != 'tpu':
    ordered = sorted(devices, key=lambda d: d.process_index)  # stable: keeps the local order
    return Mesh(np.asarray(ordered, dtype=object).reshape(shape), tuple(axis_names),
                axis_types=axis_types)
  return jax.make_mesh(shape, tuple(axis_names), axis_types=axis_types, devices=devices)


def _count_message(shape: tuple[int, ...], devices: list[jax.Device], processes: int) -> str:
  """Why a mesh of ``shape`` does not fit ``devices``, with how to get the right count."""
  need = math.prod(shape)
  hint = ''
  if devices and devices[0].platform == 'cpu':
    # Several workers: each got its devices from the launcher, so that is where to ask.
    if processes > 1:  # a mesh over every worker's devices
      hint = (f' (over {processes} workers: python -m hetjax.launch --workers {processes} '
              f'--devices-per-worker {need // processes})' if need % processes == 0 else
              f' (over {processes} workers, {need} does not divide among them)')
    elif jax.process_count() > 1:
      hint = f' (under python -m hetjax.launch, pass --devices-per-worker {need})'
    else:
      hint = (f' (on CPU: the flag --jax_num_cpu_devices={need}, or '
              f"jax.config.update('jax_num_cpu_devices', {need}) before JAX starts)")
  shape_text = 'x'.join(map(str, shape))
  return (f'mesh {shape_text} needs {need} devices but {len(devices)} '
          f'{devices[0].platform if devices else ""} device(s) are available{hint}')
