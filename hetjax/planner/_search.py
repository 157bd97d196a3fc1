"""`search`: the fastest layout and device group per sub-model that fits in memory, exactly.

The model is a chain of sub-models in forward order. Choosing an option (device group, layout)
for each costs Σ node times + Σ edge times (resharding between neighbours), and every device
must hold the memory of all the sub-models its group runs. Time is the objective and memory a
constraint, so a plain shortest path is not enough: `solve_chain` (`_chain.py`), a pure function
of cost tables, keeps Pareto fronts of (time, memory) partial plans (`tests/test_planner_search.py`
checks it against brute force on random tables).

Example: a 4 GB embedding table and a compute-heavy tower on 2 workers × 4 devices of 4 GB,
with fast links inside a worker::

  >>> emb = SubmodelProfile('embedding', 10**9, 4e9, 2e3, output_bytes_per_example=256,
  ...                       split_sizes={'table': 10**6}, shard_sizes={'embed': 64})
  >>> tower = SubmodelProfile('tower', 10**6, 4e6, 2e9, output_bytes_per_example=4096,
  ...                         activation_bytes_per_example=4e4, split_sizes={'mlp': 1024})
  >>> cluster = ClusterSpec.uniform(2, 4, 1e12, 4e9, beta_bytes_per_s=1.25e9,
  ...                               intra_beta_bytes_per_s=1e11)
  >>> plan = search([emb, tower], cluster, batch=4096, tie_tolerance=0)
  >>> [s.layout.name(8) for s in plan.submodels]  # row-sharded table; tower TP inside workers
  ['tp8', 'dp2×tp4']
  >>> round(plan.predicted_step_s, 3)   # pure data parallel would not fit (12 GB per device)
  1.029
  >>> plan = search([emb, tower], cluster, batch=4096)   # ties within 3%: fewest bytes
  >>> [s.layout.name(8) for s in plan.submodels], round(plan.predicted_step_s, 3)
  (['tp8', 'dp8'], 1.034)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from hetjax._checks import number
from hetjax._errors import ConfigError
from hetjax.planner._cluster import ClusterSpec
from hetjax.planner._cost import (
  AnalyticCost,
  Cost,
  CostModel,
  Group,
  fsdp_axes,
  group_devices,
  infeasibility,
  members,
)
from hetjax.planner._layout import Layout, group_factors, tensor_degrees
from hetjax.planner._plan import Plan, SubmodelPlan
from hetjax.planner._profile_types import SubmodelProfile
from hetjax.planner._solver import Tables, least_memory, solve_chain

ANALYTIC = AnalyticCost()
TIE_TOLERANCE = 0.03


def candidate_groups(cluster: ClusterSpec) -> tuple[Group, ...]:
  """Every worker, then (if speeds differ) the k fastest for each k < workers dividing it.

  Speeds are sorted fastest first, ties by worker index; groups list workers in index order.
  Example: speeds (1, 3, 2, 3) give ``((0, 1, 2, 3), (1,), (1, 3))``.
  """
  count = len(cluster.workers)
  every = tuple(range(count))
  if cluster.uniform_speed:
    return (every,)
  order = sorted(every, key=lambda w: (-cluster.workers[w].flops_per_s, w))
  return (every, *(tuple(sorted(order[:k])) for k in range(1, count) if count % k == 0))


def group_layouts(cluster: ClusterSpec, group: Group) -> tuple[Layout, ...]:
  """Every tensor degree the group's mesh can form (suffix products of its factors: workers'
  factors first when their device counts are equal, `group_factors`), each without and (when
  the data-parallel degree exceeds 1) with FSDP."""
  members_ = members(cluster, group)
  n = group_devices(cluster, members_)
  degrees = tensor_degrees(group_factors(tuple(cluster.workers[w].devices for w in members_)))
  return tuple(Layout(t, fsdp) for t in degrees for fsdp in (False, True)
               if not fsdp or n // t > 1)


def search(profiles: Sequence[SubmodelProfile], cluster: ClusterSpec, batch: int,
           cost: CostModel = ANALYTIC, memory_cap: float | None = None,
           layouts: Sequence[Layout] | None = None,
           groups: Sequence[Sequence[int]] | None = None,
           tie_tolerance: float = TIE_TOLERANCE, micro_batches: int | None = None) -> Plan:
  """The plan of least modelled step time whose memory fits every device; among plans within
  ``tie_tolerance`` of that time, the one that communicates the fewest bytes.

  Why a tie rule: the model's times are estimates and its bytes exact, and of two plans it
  cannot tell apart, the one that moves less degrades less on a slower or busier network. The
  time is exact (`solve_chain`); the fewest bytes among ties is a local search from the
  fastest plan (`_fewest_bytes`), so with a tolerance the result is a plan no single
  sub-model's change improves, not always the global fewest.

  Args:
    profiles: the sub-models in forward order.
    cluster: the workers and links.
    batch: the global batch per step.
    cost: prices nodes and edges.
    memory_cap: bytes per device (default: each worker's ``memory_bytes``).
    layouts: the layouts to try (default: `group_layouts`); a layout whose tensor degree the
      group's mesh cannot form, or that does not divide a sub-model's dimensions
      (`infeasibility`), is skipped for that group or sub-model.
    groups: the device groups to try, as worker indices (default: `candidate_groups`).
    tie_tolerance: relative slack on the least time within which plans count as ties (0: the
      fastest plan, whatever its bytes). The default, 3%, is below the model's resolution: the
      same compiled step measured twice in one run can differ by a few percent on shared cores.
    micro_batches: micro-batches per step as the plan will be trained (1 for one SPMD step):
      a group is then a candidate only if a micro-batch's rows split evenly over its devices,
      as the trainer splits them, so the plan returned can be trained. None (pure cost
      searches, e.g. over made-up clusters) skips that check.

  Returns:
    ``Plan(name='planner', …)`` with each sub-model's predicted seconds (its node plus the
    resharding into it), bytes communicated and memory per device, and the step's total.

  Raises:
    ConfigError: bad arguments, a sub-model with no feasible layout, or no plan that fits (the
      message gives the smallest plan's memory and the sub-model that needs the most).
  """
  _check_profiles(profiles, batch)
  number(tie_tolerance, 'tie_tolerance')
  groups = _check_groups(cluster, groups) if groups is not None else candidate_groups(cluster)
  if micro_batches is not None:
    groups = _trainable_groups(cluster, groups, batch, micro_batches)
  options = [_options(p, cluster, groups, layouts) for p in profiles]
  costs = [[cost.node(p, o.layout, batch, cluster, o.group) for o in opts]
           for p, opts in zip(profiles, options, strict=True)]
  edges = [[[cost.edge(profiles[i - 1], a.layout, b.layout, batch, cluster, a.group, b.group)
             for b in options[i]] for a in options[i - 1]] for i in range(1, len(profiles))]
  classes, caps = _memory_classes(cluster, groups, memory_cap)
  masks = [np.array([[o.group in c for c in classes] for o in opts], np.float64)
           for opts in options]
  tables = Tables(
      node_time=[np.array([c.time_s for c in row]) for row in costs],
      node_memory=[np.array([c.memory_bytes for c in row])[:, None] * m
                   for row, m in zip(costs, masks, strict=True)],
      edge_time=[np.array([[c.time_s for c in r] for r in e]) for e in edges],
      edge_memory=[np.array([[c.memory_bytes for c in r] for r in e])[:, :, None] * m[None]
                   for e, m in zip(edges, masks[1:], strict=True)])
  _check_finite(tables, profiles)
  solution = solve_chain(tables, caps)
  if solution is None:
    raise ConfigError(_no_fit_message(tables, caps, profiles))
  choice, total = solution
  if tie_tolerance:
    bytes_ = [np.array([c.comm_bytes for c in row]) for row in costs]
    edge_bytes = [np.array([[c.comm_bytes for c in r] for r in e]) for e in edges]
    choice = _fewest_bytes(tables, caps, bytes_, edge_bytes, choice, tie_tolerance)
    total = tables.total(choice)[0]
  parts = []
  for i, (profile, o) in enumerate(zip(profiles, choice, strict=True)):
    c = costs[i][o] + (edges[i - 1][choice[i - 1]][o] if i else Cost())
    opt = options[i][o]
    parts.append(SubmodelPlan(profile.name, opt.layout, opt.group, c.time_s, c.comm_bytes,
                              c.memory_bytes))
  return Plan('planner', cluster.devices, tuple(parts), len(cluster.workers), total,
              cluster.counts)


def _trainable_groups(cluster: ClusterSpec, groups: Sequence[Group], batch: int,
                      micro_batches: int) -> tuple[Group, ...]:
  """The groups a micro-batch's rows split evenly over (the trainer needs that), or one line."""
  if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1 \
      or batch % micro_batches:
    raise ConfigError(f'micro_batches must be a positive divisor of the batch {batch}, got '
                      f'{micro_batches!r}')
  rows = batch // micro_batches
  kept = tuple(g for g in groups if rows % group_devices(cluster, g) == 0)
  if not kept:
    raise ConfigError(f'no device group splits a micro-batch of {rows} rows evenly: groups of '
                      f'{sorted({group_devices(cluster, g) for g in groups})} devices')
  return kept


def evaluate(plan: Plan, profiles: Sequence[SubmodelProfile], cluster: ClusterSpec, batch: int,
             cost: CostModel = ANALYTIC) -> Plan:
  """``plan`` with every predicted number filled in by ``cost``, summed as `search` sums them,
  so baselines and searched plans are priced alike. A sub-model's empty group means every
  worker; the plan is costed on ``cluster``'s workers (and returned with its worker count).

  Raises:
    ConfigError: the plan is for another device count, names a sub-model without a profile
      (or misses one), has a bad group, or a layout the group cannot run.
  """
  _check_profiles(profiles, batch)
  if plan.devices != cluster.devices:
    raise ConfigError(f'plan {plan.name!r} is for {plan.devices} devices, the cluster has '
                      f'{cluster.devices}')
  by_name = {p.name: p for p in profiles}
  names = [s.name for s in plan.submodels]
  if sorted(names) != sorted(by_name):
    raise ConfigError(f'plan {plan.name!r} covers sub-models {", ".join(names)}; the profiles '
                      f'are {", ".join(by_name)}')
  parts, total, prev = [], 0.0, None
  for s in plan.submodels:
    profile = by_name[s.name]
    group = _check_groups(cluster, [s.group])[0] if s.group else members(cluster, ())
    n = group_devices(cluster, group)
    if s.layout.tensor not in {x.tensor for x in group_layouts(cluster, group)}:
      raise ConfigError(f'plan {plan.name!r}: sub-model {s.name!r}: tensor degree '
                        f'{s.layout.tensor} cannot be formed on {n} devices')
    reason = infeasibility(profile, s.layout, n)
    if reason:
      raise ConfigError(f'plan {plan.name!r}: sub-model {s.name!r} as '
                        f'{s.layout.name(n)}: {reason}')
    c = cost.node(profile, s.layout, batch, cluster, group)
    if prev is None:
      total = c.time_s
    else:
      e = cost.edge(prev[0], prev[1], s.layout, batch, cluster, prev[2], group)
      total, c = (total + e.time_s) + c.time_s, e + c
    parts.append(dataclasses.replace(s, predicted_s=c.time_s, comm_bytes=c.comm_bytes,
                                     memory_bytes=c.memory_bytes))
    prev = (profile, s.layout, group)
  return dataclasses.replace(plan, submodels=tuple(parts), workers=len(cluster.workers),
                             predicted_step_s=total, worker_devices=cluster.counts)


def _fewest_bytes(tables: Tables, caps: np.ndarray, node_bytes: list[np.ndarray],
                  edge_bytes: list[np.ndarray], choice: Sequence[int],
                  tolerance: float) -> list[int]:
  """From the fastest plan ``choice``, moves that save bytes while the time stays within
  (1 + tolerance) of the fastest's and memory fits: each move changes one sub-model's option to
  the one saving the most bytes (its node and both edges), until no move saves any.

  A local search, not exact: minimising bytes under a time cap is a second constrained chain
  problem, and the exact labeller with time as one more capped sum was orders of magnitude
  slower than the time search on 64 sub-models × 1024 devices. Bytes strictly
  fall with every move, so it ends; it returns a plan no single change improves.
  """
  choice = list(choice)
  limit = tables.total(choice)[0] * (1 + tolerance)
  caps = caps * (1 + 1e-9)

  def totals():
    t, m = tables.total(choice)
    b = node_bytes[0][choice[0]] + sum(edge_bytes[i - 1][choice[i - 1], choice[i]]
                                       + node_bytes[i][choice[i]] for i in range(1, len(choice)))
    return t, m, float(b)

  t, m, b = totals()
  moved = True
  while moved:
    moved = False
    for i, cur in enumerate(choice):
      dt = tables.node_time[i] - tables.node_time[i][cur]
      dm = tables.node_memory[i] - tables.node_memory[i][cur]
      db = node_bytes[i] - node_bytes[i][cur]
      if i:
        a = choice[i - 1]
        dt = dt + tables.edge_time[i - 1][a] - tables.edge_time[i - 1][a, cur]
        dm = dm + tables.edge_memory[i - 1][a] - tables.edge_memory[i - 1][a, cur]
        db = db + edge_bytes[i - 1][a] - edge_bytes[i - 1][a, cur]
      if i + 1 < len(choice):
        c = choice[i + 1]
        dt = dt + tables.edge_time[i][:, c] - tables.edge_time[i][cur, c]
        dm = dm + tables.edge_memory[i][:, c] - tables.edge_memory[i][cur, c]
        db = db + edge_bytes[i][:, c] - edge_bytes[i][cur, c]
      ok = (t + dt <= limit) & np.all(m + dm <= caps, axis=1) & (db < -1e-9 * max(b, 1.0))
      if ok.any():
        best = int(np.flatnonzero(ok)[np.lexsort((dt[ok], db[ok]))[0]])
        choice[i] = best
        t, m, b = totals()  # exact sums again: no drift from adding deltas
        moved = True
  return choice


@dataclasses.dataclass(frozen=True)
class _Option:
  group: Group
  layout: Layout


def _options(profile: SubmodelProfile, cluster: ClusterSpec, groups: Sequence[Group],
             layouts: Sequence[Layout] | None) -> list[_Option]:
  out, reasons = [], []
  for group in groups:
    n = group_devices(cluster, group)
    formable = group_layouts(cluster, group)
    degrees = {layout.tensor for layout in formable}
    for layout in (formable if layouts is None else layouts):
      if layout.tensor not in degrees:
        continue
      if layouts is None and layout.fsdp and not fsdp_axes(profile, layout):
        continue  # the same as without FSDP
      reason = infeasibility(profile, layout, n)
      if reason:
        reasons.append(f'{layout.name(n)}: {reason}')
      else:
        out.append(_Option(group, layout))
  if not out:
    why = '; '.join(reasons[:3]) or 'no layout given fits the groups\' meshes'
    raise ConfigError(f'sub-model {profile.name!r} has no feasible layout ({why})')
  return out


def _memory_classes(cluster: ClusterSpec, groups: Sequence[Group],
                    memory_cap: float | None) -> tuple[list[frozenset], np.ndarray]:
  """One memory constraint per set of groups a worker belongs to, at that worker's cap (the
  smallest among workers with the same set), dropping the constraints another implies (a
  superset of groups with a cap no larger)."""
  if memory_cap is not None and not memory_cap > 0:
    raise ConfigError(f'memory_cap must be positive, got {memory_cap!r}')
  caps: dict[frozenset, float] = {}
  for w, spec in enumerate(cluster.workers):
    member_of = frozenset(g for g in groups if w in g)
    cap = spec.memory_bytes if memory_cap is None else float(memory_cap)
    if member_of:
      caps[member_of] = min(cap, caps.get(member_of, cap))
  kept = [s for s in caps if not any(s < t and caps[t] <= caps[s] for t in caps)]
  return kept, np.array([caps[s] for s in kept])


def _check_profiles(profiles: Sequence[SubmodelProfile], batch: int) -> None:
  if not profiles:
    raise ConfigError('no sub-models to plan')
  names = [p.name for p in profiles]
  if len(set(names)) != len(names):
    raise ConfigError(f'sub-model names repeat: {", ".join(names)}')
  if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch < 1:
    raise ConfigError(f'the global batch must be a positive integer, got {batch!r}')


def _check_groups(cluster: ClusterSpec, groups: Sequence[Sequence[int]]) -> tuple[Group, ...]:
  out = []
  count = len(cluster.workers)
  for g in groups:
    group = tuple(sorted(int(w) for w in g))
    if not group or len(set(group)) != len(group) or not all(0 <= w < count for w in group):
      raise ConfigError(f'group {tuple(g)!r} must list distinct workers among 0..{count - 1}')
    out.append(group)
  return tuple(out)


def _check_finite(tables: Tables, profiles: Sequence[SubmodelProfile]) -> None:
  for i, arrays in enumerate(zip(tables.node_time, tables.node_memory, strict=True)):
    extra = (tables.edge_time[i - 1], tables.edge_memory[i - 1]) if i else ()
    if not all(np.isfinite(a).all() for a in itertools.chain(arrays, extra)):
      raise ConfigError(f'the cost model gave a non-finite cost for sub-model '
                        f'{profiles[i].name!r}')


def _no_fit_message(tables: Tables, caps: np.ndarray, profiles: Sequence[SubmodelProfile]) -> str:
  """Names the constraint furthest out of reach, its smallest plan and its biggest sub-model."""
  smallest = np.array([least_memory(tables, k) for k in range(len(caps))])
  k = int(np.argmax(smallest / caps))
  alone = [float(m[:, k].min()) for m in tables.node_memory]
  worst = int(np.argmax(alone))
  return (f'no plan fits {caps[k]:.3g} bytes per device: the smallest needs '
          f'{smallest[k]:.3g} (sub-model {profiles[worst].name!r} alone needs '
          f'{alone[worst]:.3g})')
