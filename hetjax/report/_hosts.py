"""The emulated hosts a run ran on, as its ``run.json`` records them, said in one line.

A run with a slowdown pads every worker's step to a host of known speed: ``fixed_s + rows ×
row_s`` seconds for a host of speed 1, times the worker's slowdown (`hetjax.emulation`). Those
two numbers are the cluster the run emulated, so a report names them and where they came from
(``host_source``): calibrated at start, declared by ``emulation.host_row_s``, or reused from
another run's directory (``emulation.hosts``, ``--hosts=RUN_DIR``). Two runs whose numbers
differ ran on two clusters, whatever their policies (`hetjax.report.compare_runs` warns).

Example::

  >>> describe_hosts({'host_row_s': 2.5e-5, 'host_fixed_s': 0.0012, 'host_source': 'reused',
  ...                 'hosts_from': 'runs/first'})
  'hosts: 0.025 ms a row + 1.2 ms a step (a host of speed 1), reused from runs/first'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

#: ``run.json``'s list of the calibration's retries (`hetjax.run`'s record of them).
RETRIES = 'host_calibration_retries'


def hosts_of(run: Mapping[str, Any]) -> tuple[float, float] | None:
  """``(row_s, fixed_s)`` of the hosts ``run`` (a ``run.json``) emulated; None when it
  emulated none (no slowdown, a plan's stages, or a run written before hosts were recorded)."""
  row, fixed = run.get('host_row_s'), run.get('host_fixed_s') or 0.0
  if not (_seconds(row) and row > 0 and _seconds(fixed)):
    return None
  return float(row), float(fixed)


def describe_hosts(run: Mapping[str, Any], prefix: str = 'hosts: ') -> str | None:
  """One line naming the hosts' costs and their source (module docstring); None when the run
  emulated none."""
  hosts = hosts_of(run)
  if hosts is None:
    return None
  return prefix + f'{cost(run)}, {source(run)}'


def cost(run: Mapping[str, Any]) -> str:
  """The hosts' cost: ``'0.025 ms a row + 1.2 ms a step (a host of speed 1)'``; a SchMP run's
  cost is per unit of its work."""
  row, fixed = hosts_of(run) or (0.0, 0.0)
  unit = 'a unit of work' if run.get('mode') == 'schmp' else 'a row'
  text = f'{1e3 * row:.3g} ms {unit}'
  if fixed:
    text += f' + {1e3 * fixed:.3g} ms a step'
  return text + ' (a host of speed 1)'


def source(run: Mapping[str, Any]) -> str:
  """Where the hosts came from: ``'calibrated'`` (with its retries, if any),
  ``'declared (emulation.host_row_s)'``, ``'reused from RUN_DIR'``, or ``'source not
  recorded'`` (a run written before it was)."""
  kind = run.get('host_source')
  if kind == 'reused':
    return f'reused from {run.get("hosts_from")}'
  if kind == 'declared':
    return 'declared (emulation.host_row_s)'
  if kind == 'calibrated':
    retries = run.get(RETRIES) or []
    if retries:
      return (f'calibrated at start ({len(retries)} '
              f'{"retry" if len(retries) == 1 else "retries"}: run.json {RETRIES})')
    return 'calibrated at start'
  return 'source not recorded'


def _seconds(value: Any) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value) and value >= 0)
