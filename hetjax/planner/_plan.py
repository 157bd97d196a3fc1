"""A plan: a layout per sub-model on one mesh, as data (JSON round trip) and as sharding rules.

The planner writes plans, people write them by hand (``hetjax/configs/plans/*.json``), and the
trainer applies their rules unchanged: ``Trainer(task, opt, batch, plan.mesh(), plan.rules())``.

Hand-written format (``"*"`` is every sub-model not named)::

  {"name": "hybrid", "devices": 8,
   "submodels": {"*": {"data": 2, "tensor": 4}, "embedding": {"data": 1, "tensor": 8}}}

A sub-model may run on a group of the workers (``"group": [0, 1]``, default all of them), and
workers may hold different numbers of devices (``"worker_devices": [2, 1, 1]``, default equal):
a plan whose sub-models use different groups trains as stages on those groups
(`hetjax.planner.plan_stages`), an all-workers plan as one SPMD program.

A model that lists no ``submodels()`` has one part, the whole model, named ``"model"``
(`hetjax.planner.WHOLE_MODEL`): ``{"devices": 8, "submodels": {"model": {"data": 2, "tensor":
4}}}``, or ``"*"``. Its layout's rules then apply to every parameter and activation of the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from hetjax._errors import ConfigError
from hetjax.planner._layout import Layout, axis_names, group_factors
from hetjax.planner._whole import WHOLE_MODEL
from hetjax.sharding import LogicalRules, ShardingRules


@dataclasses.dataclass(frozen=True)
class SubmodelPlan:
  """One sub-model's part of a plan, with what the cost model predicted for it.

  Attributes:
    name: the sub-model (a key of the model's ``submodels()``, or `WHOLE_MODEL` for the whole
      of a model without them).
    layout: its tensor-parallel degree and FSDP flag.
    group: the workers whose devices run it (all of them in an SPMD plan).
    predicted_s: modelled seconds per step (compute + its communication + resharding into it).
    comm_bytes: modelled bytes per device per step its layout communicates.
    memory_bytes: modelled bytes per device for its parameters, optimizer state, activations.
  """

  name: str
  layout: Layout
  group: tuple[int, ...] = ()
  predicted_s: float = 0.0
  comm_bytes: float = 0.0
  memory_bytes: float = 0.0


@dataclasses.dataclass(frozen=True)
class Plan:
  """Layouts for every sub-model of a model on ``devices`` devices over ``workers`` workers.

  Attributes:
    name: ``'planner'`` for a searched plan, else the baseline's name (``'pure_dp'``, …).
    devices: total devices; every layout's data × tensor degrees multiply to it.
    workers: processes the devices are spread over (mesh factors put workers first).
    submodels: in forward order.
    predicted_step_s: modelled seconds per step (None for a hand-written plan not yet costed).
    worker_devices: each worker's device count when they differ; ``()``: ``devices / workers``
      each.
  """

  name: str
  devices: int
  submodels: tuple[SubmodelPlan, ...]
  workers: int = 1
  predicted_step_s: float | None = None
  worker_devices: tuple[int, ...] = ()

  def __post_init__(self):
    counts = self.counts  # checks them
    if len(set(counts)) == 1:
      object.__setattr__(self, 'worker_devices', ())

  @property
  def counts(self) -> tuple[int, ...]:
    """Each worker's device count."""
    return worker_counts(self.devices, self.workers, self.worker_devices)

  @property
  def factors(self) -> tuple[int, ...]:
    """The mesh factors of all the plan's devices (`group_factors`)."""
    return group_factors(self.counts)

  def members(self, submodel: SubmodelPlan) -> tuple[int, ...]:
    """The workers running ``submodel`` (an empty group is all of them)."""
    return submodel.group or tuple(range(self.workers))

  def group_factors(self, submodel: SubmodelPlan) -> tuple[int, ...]:
    """The mesh factors of ``submodel``'s device group."""
    return group_factors(tuple(self.counts[w] for w in self.members(submodel)))

  @property
  def whole_model(self) -> bool:
    """Whether the plan's one part is the whole model (`WHOLE_MODEL`: a model without
    ``submodels()``); it then trains as one SPMD step, or as one stage on its group."""
    return len(self.submodels) == 1 and self.submodels[0].name == WHOLE_MODEL

  @property
  def grouped(self) -> bool:
    """Whether some sub-model runs on a subset of the workers (then it trains as stages)."""
    return any(set(self.members(s)) != set(range(self.workers)) for s in self.submodels)

  def layout(self, submodel: str) -> Layout:
    for s in self.submodels:
      if s.name == submodel:
        return s.layout
    raise ConfigError(f'plan {self.name!r} has no sub-model {submodel!r}; it has '
                      f'{", ".join(s.name for s in self.submodels)}')

  def group_devices(self, submodel: SubmodelPlan) -> int:
    """Devices of the workers running ``submodel`` (all, for an empty or full group)."""
    return sum(self.counts[w] for w in self.members(submodel))

  def mesh(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The plan's mesh over ``devices`` (default: all devices, in process order)."""
    devices = list(devices if devices is not None else jax.devices())
    if len(devices) != self.devices:
      raise ConfigError(self.count_error(devices))
    grid = np.array(devices, dtype=object).reshape(self.factors)
    return Mesh(grid, axis_names(self.factors), axis_types=(AxisType.Auto,) * grid.ndim)

  def count_error(self, devices: Sequence[jax.Device]) -> str:
    """Why the plan cannot run on ``devices`` (not its device count), and, on one process's
    CPU devices, the flag that gives it its count: ``plan 'planner' is for 4 devices, 1 are
    available (on CPU: --jax_num_cpu_devices=4)``."""
    every = len(devices) == jax.device_count() and jax.process_count() == 1
    hint = (f' (on CPU: --jax_num_cpu_devices={self.devices})'
            if every and devices and devices[0].platform == 'cpu' else '')
    return f'plan {self.name!r} is for {self.devices} devices, {len(devices)} are available{hint}'

  def rules(self, submodels: Sequence[SubmodelPlan] | None = None,
            factors: tuple[int, ...] | None = None) -> ShardingRules:
    """Scoped rules: each sub-model's layout inside its scope; the input batch over all axes.
    The whole model's layout (`whole_model`) is the top-level table, and its scope's: it lays
    out every parameter and activation, wherever it sits (a stage scopes its one link).

    Args:
      submodels: the sub-models to give rules (default: all; a stage's, for its own mesh).
      factors: the mesh the rules are for (default: the whole plan's).
    """
    factors = self.factors if factors is None else factors
    parts = self.submodels if submodels is None else submodels
    every = axis_names(factors)
    if self.whole_model and len(parts) == 1:
      layout = parts[0].layout
      params, compute = layout.params_rules(factors), layout.compute_rules(factors)
      return ShardingRules(
          params=dataclasses.replace(params, scopes=((WHOLE_MODEL, params),)),
          compute=dataclasses.replace(compute, scopes=((WHOLE_MODEL, compute),)))
    params = LogicalRules(scopes=tuple((s.name, s.layout.params_rules(factors)) for s in parts))
    compute = LogicalRules((('batch', every),), scopes=tuple(
        (s.name, s.layout.compute_rules(factors)) for s in parts))
    return ShardingRules(params=params, compute=compute)

  def to_json(self) -> dict:
    return {'name': self.name, 'devices': self.devices, 'workers': self.workers,
            **({'worker_devices': list(self.worker_devices)} if self.worker_devices else {}),
            'predicted_step_s': self.predicted_step_s,
            'submodels': {s.name: {'data': self.group_devices(s) // s.layout.tensor,
                                   'tensor': s.layout.tensor, 'fsdp': s.layout.fsdp,
                                   'group': list(s.group), 'predicted_s': s.predicted_s,
                                   'comm_bytes': s.comm_bytes, 'memory_bytes': s.memory_bytes}
                          for s in self.submodels}}

  @classmethod
  def from_json(cls, data: Mapping, submodels: Sequence[str] | None = None) -> Plan:
    """Reads a plan; ``submodels`` (the model's, in forward order) expands ``"*"`` and checks
    every name. Empty ``submodels`` (a model without ``submodels()``,
    `hetjax.sharding.submodel_names`) means one part, the whole model (`WHOLE_MODEL`).

    Raises:
      ConfigError: a missing field, an unknown sub-model, degrees that do not multiply to the
        device count, or a degree the mesh cannot form.
    """
    name = str(data.get('name', 'plan'))
    try:
      devices, entries = int(data['devices']), dict(data['submodels'])
      workers = int(data.get('workers', 1))
      counts = tuple(int(c) for c in data.get('worker_devices', ()))
    except (KeyError, TypeError, ValueError) as e:
      raise ConfigError(f'plan {name!r}: needs "devices" (an integer) and "submodels" (a '
                        f'mapping); {type(e).__name__}: {e}') from None
    counts = worker_counts(devices, workers, counts, name)
    default = entries.pop('*', None)
    order = list(entries) if submodels is None else list(submodels) or [WHOLE_MODEL]
    unknown = sorted(set(entries) - set(order))
    if unknown:
      has = (f'the model has {", ".join(order)}' if submodels else
             f'the model lists no submodels(), so its one part is {WHOLE_MODEL!r}')
      raise ConfigError(f'plan {name!r}: no sub-model named {", ".join(map(repr, unknown))}; '
                        + has)
    parts = []
    for sub in order:
      entry = entries.get(sub, default)
      if entry is None:
        raise ConfigError(f'plan {name!r}: sub-model {sub!r} has no layout (and no "*")')
      parts.append(_submodel(name, sub, entry, counts))
    step = data.get('predicted_step_s')
    return cls(name, devices, tuple(parts), workers, None if step is None else float(step),
               counts)

  @classmethod
  def load(cls, path: str | os.PathLike, submodels: Sequence[str] | None = None) -> Plan:
    path = pathlib.Path(path)
    try:
      data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise ConfigError(f'cannot read plan {path}: {e}') from None
    return cls.from_json(data, submodels)

  def save(self, path: str | os.PathLike) -> None:
    pathlib.Path(path).write_text(json.dumps(self.to_json(), indent=2) + '\n')


def worker_counts(devices: int, workers: int, counts: Sequence[int] = (),
                  plan: str = 'plan') -> tuple[int, ...]:
  """Each worker's device count: ``counts`` checked, or ``devices / workers`` each.

  Raises:
    ConfigError: counts that are not positive, not one per worker or not summing to
      ``devices``; equal counts that do not divide ``devices``.
  """
  if workers < 1 or devices < 1:
    raise ConfigError(f'plan {plan!r}: needs at least one worker and device, got {workers} '
                      f'workers and {devices} devices')
  if not counts:
    if devices % workers:
      raise ConfigError(f'plan {plan!r}: {devices} devices cannot be split evenly over '
                        f'{workers} workers (give "worker_devices")')
    return (devices // workers,) * workers
  counts = tuple(counts)
  if len(counts) != workers or any(c < 1 for c in counts) or sum(counts) != devices:
    raise ConfigError(f'plan {plan!r}: worker_devices {list(counts)} must be {workers} '
                      f'positive counts summing to {devices} devices')
  return counts


def _submodel(plan: str, sub: str, entry: Mapping, counts: tuple[int, ...]) -> SubmodelPlan:
  workers, devices = len(counts), sum(counts)
  try:
    group = tuple(int(w) for w in entry.get('group', ()))
    tensor = int(entry.get('tensor', 1))
  except (TypeError, ValueError, AttributeError):
    raise ConfigError(f'plan {plan!r}: sub-model {sub!r}: "tensor" and "group" must be '
                      f'integers, got {entry!r}') from None
  if any(not 0 <= w < workers for w in group) or len(set(group)) != len(group):
    raise ConfigError(f'plan {plan!r}: sub-model {sub!r} has group {list(group)}, not distinct '
                      f'workers among {workers}')
  group = tuple(sorted(group))
  on = sum(counts[w] for w in group) if group else devices
  try:
    data = int(entry.get('data', on // max(tensor, 1)))
  except (TypeError, ValueError):
    raise ConfigError(f'plan {plan!r}: sub-model {sub!r}: "data" must be an integer, '
                      f'got {entry!r}') from None
  if data < 1 or tensor < 1 or data * tensor != on:
    raise ConfigError(f'plan {plan!r}: sub-model {sub!r} has data {data} × tensor {tensor} = '
                      f'{data * tensor}, not the {on} devices' + (
                          f' of its group {list(group)}' if on != devices else ''))
  layout = Layout(tensor, bool(entry.get('fsdp', False)))
  # a degree the group's mesh cannot form fails here, with the reason
  layout.split_axes(group_factors(tuple(counts[w] for w in (group or range(workers)))))
  return SubmodelPlan(sub, layout, group, float(entry.get('predicted_s', 0.0)),
                      float(entry.get('comm_bytes', 0.0)), float(entry.get('memory_bytes', 0.0)))
