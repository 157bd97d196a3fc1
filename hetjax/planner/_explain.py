"""Why the planner put each sub-model where it did: the step time had it gone elsewhere.

For every sub-model of a plan, and every other candidate group of workers, the best layout
there (the others left as planned) is priced by the same cost model as the search, and the
memory checked per worker. The lines say what the choice won over each alternative, and what
the alternative's group is like (devices, slowest device), so that "tower on workers 0, 1" reads
as "on all four workers it would wait for the two 3x slower ones".

Example::

  for line in explain(plan, profiles, cluster, batch=512):
    print(line)
  # tower: workers 0,1 (4 devices, slowest 14.7 GFLOP/s) dp4: step 31.2 ms. Elsewhere:
  #   all (8 devices, slowest 4.9 GFLOP/s) dp8: 39.8 ms (+28%); 0 (2 devices, …) dp2: 35.1 ms (+13%)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hetjax._errors import ConfigError
from hetjax.planner._cluster import ClusterSpec
from hetjax.planner._cost import CostModel, group_devices, infeasibility, members
from hetjax.planner._plan import Plan
from hetjax.planner._profile_types import SubmodelProfile
from hetjax.planner._search import ANALYTIC, candidate_groups, evaluate, group_layouts


@dataclasses.dataclass(frozen=True)
class Alternative:
  """One sub-model moved to another group (the rest of the plan unchanged).

  Attributes:
    group: the workers.
    layout: its best layout there (or the chosen one, for ``chosen``).
    step_s: the plan's predicted step with the sub-model there.
    fits: whether every worker's devices still hold what they run.
    chosen: whether this is where the plan put it.
  """

  group: tuple[int, ...]
  layout: str
  step_s: float
  fits: bool
  chosen: bool = False


def alternatives(plan: Plan, profiles: Sequence[SubmodelProfile], cluster: ClusterSpec,
                 batch: int, cost: CostModel = ANALYTIC, memory_cap: float | None = None
                 ) -> dict[str, list[Alternative]]:
  """Per sub-model, the chosen placement first, then each other candidate group's best."""
  by_name = {p.name: p for p in profiles}
  out: dict[str, list[Alternative]] = {}
  for i, chosen in enumerate(plan.submodels):
    here = members(cluster, chosen.group)
    options = [Alternative(here, chosen.layout.name(group_devices(cluster, here)),
                           plan.predicted_step_s or 0.0, True, chosen=True)]
    for group in candidate_groups(cluster):
      if group == here:
        continue
      n, best = group_devices(cluster, group), None
      for layout in group_layouts(cluster, group):
        if infeasibility(by_name[chosen.name], layout, n):
          continue
        moved = dataclasses.replace(chosen, layout=layout,
                                    group=() if len(group) == len(cluster.workers) else group)
        try:
          priced = evaluate(dataclasses.replace(
              plan, submodels=(*plan.submodels[:i], moved, *plan.submodels[i + 1:])),
              profiles, cluster, batch, cost)
        except ConfigError:
          continue
        option = Alternative(group, layout.name(n), priced.predicted_step_s,
                             _fits(priced, cluster, memory_cap))
        if best is None or (option.fits, -option.step_s) > (best.fits, -best.step_s):
          best = option
      if best is not None:
        options.append(best)
    out[chosen.name] = options
  return out


def explain(plan: Plan, profiles: Sequence[SubmodelProfile], cluster: ClusterSpec, batch: int,
            cost: CostModel = ANALYTIC, memory_cap: float | None = None) -> list[str]:
  """One line per sub-model: where it went, and what each other group would have cost."""
  lines = []
  for name, (chosen, *others) in alternatives(plan, profiles, cluster, batch, cost,
                                              memory_cap).items():
    head = (f'{name}: {_describe(chosen.group, cluster)} {chosen.layout}: step '
            f'{1e3 * chosen.step_s:.1f} ms.')
    if not others:
      lines.append(f'{head} No other group to run on.')
      continue
    parts = []
    for o in sorted(others, key=lambda o: o.step_s):
      change = o.step_s / chosen.step_s - 1 if chosen.step_s else 0.0
      note = '' if o.fits else ', does not fit in memory'
      parts.append(f'{_describe(o.group, cluster)} {o.layout}: {1e3 * o.step_s:.1f} ms '
                   f'({change:+.0%}{note})')
    lines.append(f'{head} Elsewhere: ' + '; '.join(parts))
  return lines


def _describe(group: tuple[int, ...], cluster: ClusterSpec) -> str:
  who = 'all workers' if len(group) == len(cluster.workers) else (
      'worker ' if len(group) == 1 else 'workers ') + ','.join(map(str, group))
  slowest = min(cluster.workers[w].flops_per_s for w in group)
  return (f'{who} ({group_devices(cluster, group)} devices, slowest '
          f'{slowest / 1e9:.1f} GFLOP/s)')


def _fits(plan: Plan, cluster: ClusterSpec, memory_cap: float | None) -> bool:
  """Whether every worker's devices hold the modelled memory of the sub-models they run."""
  for w, spec in enumerate(cluster.workers):
    cap = spec.memory_bytes if memory_cap is None else memory_cap
    used = sum(s.memory_bytes for s in plan.submodels if w in members(cluster, s.group))
    if used > cap:
      return False
  return True
