"""A plan whose sub-models sit on different device groups, as pipeline stages that train it.

One SPMD program cannot run one sub-model on some devices and the next on others (two meshes'
arrays never enter one `jax.jit`), so a grouped plan runs as a pipeline
(`hetjax.pipeline.PipelineTrainer`): every run of consecutive sub-models on the same group of
workers is one stage, on a mesh of that group's devices (`hetjax.bench.group_factors`: the
workers' factors first), with the plan's layout for each of its sub-models (`Plan.rules` on that
mesh). Activations cross between groups at stage boundaries, split by rows
(`hetjax.pipeline._transfer`); micro-batches let groups overlap.

Example: wide & deep with the table row-sharded over 4 workers and the tower on the 2 fast ones::

  plan = Plan('mixed', 8, (SubmodelPlan('embedding', Layout(8)), SubmodelPlan('wide', Layout(8)),
                           SubmodelPlan('tower', Layout(1), group=(0, 1))), workers=4)
  layouts = plan_stages(plan, [link.name for link in model.chain()])
  [len(s.mesh.devices.flat) for s in layouts]   # [8, 4]: embedding+wide on 8, tower on 4
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from hetjax._errors import ConfigError
from hetjax.pipeline import StageLayout
from hetjax.planner._layout import axis_names
from hetjax.planner._plan import Plan


def worker_devices(plan: Plan, devices: Sequence[jax.Device] | None = None
                   ) -> tuple[tuple[jax.Device, ...], ...]:
  """Each plan worker's devices.

  Under several processes, worker i is process i (the plan must have one worker per
  process, with each process's device count). In one process, the plan's workers are
  consecutive slices of its devices (``worker_devices`` counts, or equal), so a grouped plan can
  be trained and tested on one machine's devices.

  Raises:
    ConfigError: the plan's workers or device counts do not match the job's.
  """
  devices = list(jax.devices() if devices is None else devices)
  processes = sorted({d.process_index for d in devices})
  if len(processes) > 1:
    by_process = [tuple(d for d in devices if d.process_index == p) for p in processes]
    counts = tuple(len(d) for d in by_process)
    if len(by_process) != plan.workers or counts != plan.counts:
      raise ConfigError(f'plan {plan.name!r} is for {plan.workers} workers with '
                        f'{list(plan.counts)} devices; this job has {len(by_process)} workers '
                        f'with {list(counts)}')
    return tuple(by_process)
  if len(devices) != plan.devices:
    raise ConfigError(plan.count_error(devices))
  edges = np.cumsum((0, *plan.counts))
  return tuple(tuple(devices[a:b]) for a, b in itertools.pairwise(edges))


def plan_stages(plan: Plan, links: Sequence[str], devices: Sequence[jax.Device] | None = None
                ) -> tuple[StageLayout, ...]:
  """The stages that train ``plan``: one per run of consecutive sub-models on one group.

  Args:
    plan: the plan; its sub-models must be the model's chain links, in chain order.
    links: the chain's link names in forward order (`hetjax.pipeline.HasChain.chain`).
    devices: all devices of the job (default: `jax.devices()`), see `worker_devices`.

  Raises:
    ConfigError: sub-models that are not the chain's links in order, or devices that do not
      match the plan.
  """
  names = [s.name for s in plan.submodels]
  if names != list(links):
    raise ConfigError(f'plan {plan.name!r} lists sub-models {names}; its groups train as '
                      f'pipeline stages, which need the model\'s chain links in order: '
                      f'{list(links)}')
  per_worker = worker_devices(plan, devices)
  runs: list[list[int]] = []
  for i, s in enumerate(plan.submodels):
    if runs and plan.members(plan.submodels[runs[-1][0]]) == plan.members(s):
      runs[-1].append(i)
    else:
      runs.append([i])
  layouts = []
  for run in runs:
    first = plan.submodels[run[0]]
    factors = plan.group_factors(first)
    group = [d for w in plan.members(first) for d in per_worker[w]]
    mesh = Mesh(np.array(group, dtype=object).reshape(factors), axis_names(factors),
                axis_types=(AxisType.Auto,) * len(factors))
    rules = plan.rules([plan.submodels[i] for i in run], factors)
    layouts.append(StageLayout((run[0], run[-1] + 1), mesh, rules))
  return tuple(layouts)
