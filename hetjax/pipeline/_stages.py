"""`StageLayout`: where one pipeline stage runs and how its links are laid out there.

A pipeline is a chain of links cut into stages. Each stage runs its links on its own mesh, under
its own sharding rules:

* ``rules.params`` says where the stage's parameters and optimizer state live, with one table
  per link in ``scopes`` (a plan lays out each sub-model differently);
* ``rules.compute`` says how a micro-batch's rows are split (``'batch'``) — the stage's inputs,
  the carry it receives and the one it sends are split that way — and what the links'
  activation constraints mean inside the stage.

Two ways to get layouts. `equal_stages` is the classic pipeline: the devices cut into equal
contiguous groups, a 1-D mesh ``('batch',)`` per stage, parameters replicated on it (data
parallel inside a stage). A `hetjax.planner.Plan` whose sub-models sit on different device
groups gives one layout per run of consecutive sub-models on the same group, each on a mesh of
that group's devices with the plan's per-sub-model rules (`hetjax.planner.plan_stages`).
Meshes may span processes and different stages may share devices (their programs then run one
after the other on those devices).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
from jax.sharding import Mesh

from hetjax._errors import ConfigError
from hetjax.sharding import LogicalRules, ShardingRules, make_mesh

AXIS = 'batch'
#: A classic stage's rules: parameters replicated, rows split over the stage's one axis.
REPLICATED = ShardingRules(params=LogicalRules(), compute=LogicalRules.of({'batch': AXIS}))


@dataclasses.dataclass(frozen=True, eq=False)
class StageLayout:
  """One stage: links ``[start, stop)`` of the chain on ``mesh`` under ``rules``.

  Attributes:
    links: the ``(start, stop)`` range of links the stage runs.
    mesh: its devices (any processes; may overlap another stage's).
    rules: parameter rules (scoped by link name) and compute rules (module docstring).
  """

  links: tuple[int, int]
  mesh: Mesh
  rules: ShardingRules = REPLICATED

  @property
  def processes(self) -> tuple[int, ...]:
    """The processes owning the stage's devices, in increasing order."""
    return tuple(sorted({d.process_index for d in self.mesh.devices.flat}))

  @property
  def row_ways(self) -> int:
    """How many ways a micro-batch's rows are split on this stage."""
    axes = self.rules.compute.mesh_axes(('batch',))[0]
    return math.prod(self.mesh.shape[a] for a in axes)


def equal_stages(ranges: Sequence[tuple[int, int]], devices: Sequence[jax.Device]
                 ) -> tuple[StageLayout, ...]:
  """Classic stages: per link range, a 1-D mesh ``('batch',)`` on the next equal contiguous
  group of ``devices``, parameters replicated on it.

  Raises:
    ConfigError: if the devices do not split evenly, or a group would span processes (a
      replica's stages must all be its own: `hetjax.replicas.ReplicaDriver`).
  """
  devices, stages = list(devices), len(ranges)
  if not devices or len(devices) % stages:
    raise ConfigError(f'{len(devices)} devices do not split evenly over {stages} stages')
  per = len(devices) // stages
  layouts = []
  for s, links in enumerate(ranges):
    group = devices[s * per:(s + 1) * per]
    processes = sorted({d.process_index for d in group})
    if len(processes) != 1:
      raise ConfigError(f'stage {s} would span processes {processes}; a stage\'s devices must '
                        'belong to one process')
    layouts.append(StageLayout(tuple(links), make_mesh((per,), (AXIS,), group)))
  return tuple(layouts)


def check_layouts(layouts: Sequence[StageLayout], links: int) -> tuple[StageLayout, ...]:
  """``layouts`` if their link ranges are contiguous, non-empty and cover ``links`` links.

  Raises:
    ConfigError: naming the first range that does not follow.
  """
  layouts, edge = tuple(layouts), 0
  for s, layout in enumerate(layouts):
    if not isinstance(layout, StageLayout):
      raise ConfigError(f'stage {s} is a {type(layout).__name__}, not a StageLayout')
    start, stop = layout.links
    if start != edge or stop <= start:
      raise ConfigError(f'stage {s} runs links {layout.links}; the stages must cover links '
                        f'0…{links - 1} in order, each a non-empty range (next start: {edge})')
    edge = stop
  if not layouts or edge != links:
    raise ConfigError(f'the stages cover links 0…{edge - 1}, the chain has {links}')
  return layouts
