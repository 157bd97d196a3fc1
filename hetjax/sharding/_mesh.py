"""Building meshes with Auto axis types, and parsing mesh shapes given as text."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import jax
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

  Raises:
    ConfigError: if the mesh does not use exactly the available devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(shape)
  if len(shape) != len(axis_names):
    raise ConfigError(f'mesh shape {shape} does not match axis names {tuple(axis_names)}')
  if math.prod(shape) != len(devices):
    hint = ''
    if devices and devices[0].platform == 'cpu':
      # Several workers: each got its devices from the launcher, so that is where to ask.
      hint = (f' (under python -m hetjax.launch, pass --devices-per-worker {math.prod(shape)})'
              if jax.process_count() > 1 else
              f' (on CPU, add --jax_num_cpu_devices={math.prod(shape)})')
    shape_text = 'x'.join(map(str, shape))
    raise ConfigError(
        f'mesh {shape_text} needs {math.prod(shape)} devices but {len(devices)} '
        f'{devices[0].platform if devices else ""} device(s) are available{hint}')
  return jax.make_mesh(
      shape, tuple(axis_names), axis_types=(AxisType.Auto,) * len(shape), devices=devices)
