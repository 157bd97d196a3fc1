"""The planner's search against brute force, driven by made-up cost tables (no devices).

Like Alpa's ``test_dynamic_programming.py``: a tiny `TableCost` looks node and edge costs up in
random arrays, and the plan the search returns must take exactly the least time any feasible
combination of options takes, with and without memory caps.
"""

import itertools
import time

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.planner._cluster import ClusterSpec, WorkerSpec
from hetjax.planner._cost import Cost
from hetjax.planner._layout import Layout
from hetjax.planner._profile_types import SubmodelProfile
from hetjax.planner._search import candidate_groups, evaluate, search
from hetjax.planner._solver import Tables, solve_chain

LAYOUTS = tuple(Layout(t) for t in (1, 2, 4, 8, 16, 32))  # all formable on 32 devices


class TableCost:
  """A `CostModel` that looks costs up: option o = group index × len(layouts) + layout index."""

  def __init__(self, rng, submodels, layouts, groups=((0,),), edge_memory=True, comm=False):
    self.layouts, self.groups = list(layouts), [tuple(g) for g in groups]
    options = len(self.layouts) * len(self.groups)
    self.node_time = rng.uniform(0.1, 1.0, (submodels, options))
    self.node_memory = rng.uniform(1.0, 10.0, (submodels, options))
    self.edge_time = rng.uniform(0.0, 0.5, (submodels, options, options))
    self.edge_memory = (rng.uniform(0.0, 1.0, (submodels, options, options)) if edge_memory
                        else np.zeros((submodels, options, options)))
    # Bytes drawn last, so the other tables are the same with and without them.
    self.node_bytes = (rng.uniform(0.0, 10.0, (submodels, options)) if comm
                       else np.zeros((submodels, options)))
    self.edge_bytes = (rng.uniform(0.0, 2.0, (submodels, options, options)) if comm
                       else np.zeros((submodels, options, options)))

  def option(self, layout, group):
    return self.groups.index(tuple(group)) * len(self.layouts) + self.layouts.index(layout)

  def node(self, profile, layout, batch, cluster, group):
    i, o = int(profile.name[1:]), self.option(layout, group)
    return Cost(self.node_time[i, o], self.node_bytes[i, o], self.node_memory[i, o])

  def edge(self, prev_profile, prev_layout, layout, batch, cluster, prev_group, group):
    i = int(prev_profile.name[1:]) + 1
    a, b = self.option(prev_layout, prev_group), self.option(layout, group)
    return Cost(self.edge_time[i, a, b], self.edge_bytes[i, a, b], self.edge_memory[i, a, b])

  def total(self, choice, holds=None):
    """(time, memory) of options ``choice``, added in chain order as the search adds them:
    ``((n₀ + e₁) + n₁) + e₂ …``. ``holds(i)`` says whether sub-model i counts (default: all)."""
    t = self.node_time[0, choice[0]]
    m = self.node_memory[0, choice[0]] if holds is None or holds(0) else 0.0
    for i in range(1, len(choice)):
      a, b = choice[i - 1], choice[i]
      t = (t + self.edge_time[i, a, b]) + self.node_time[i, b]
      if holds is None or holds(i):
        m = (m + self.edge_memory[i, a, b]) + self.node_memory[i, b]
    return t, m


  def bytes_(self, choice):
    return self.node_bytes[0, choice[0]] + sum(
        self.edge_bytes[i, choice[i - 1], choice[i]] + self.node_bytes[i, choice[i]]
        for i in range(1, len(choice)))


def _profiles(n):
  return [SubmodelProfile(f's{i}', 0, 0.0, 0.0) for i in range(n)]


def _brute_force(cost, n, fits):
  """The least time of any combination of options that ``fits``, or None."""
  options = len(cost.layouts) * len(cost.groups)
  best = None
  for choice in itertools.product(range(options), repeat=n):
    t, _ = cost.total(choice)
    if fits(choice) and (best is None or t < best):
      best = t
  return best


@pytest.mark.parametrize('seed', range(12))
@pytest.mark.parametrize('capped', [False, True])
def test_search_matches_brute_force(seed, capped):
  rng = np.random.default_rng(seed)
  n, width = int(rng.integers(3, 6)), int(rng.integers(3, 7))
  cost = TableCost(rng, n, LAYOUTS[:width])
  cluster = ClusterSpec.uniform(1, 32, 1e12, 1e30)
  caps = [None]
  if capped:  # a cap right at a random plan's memory, one between, one below every plan
    plan = [int(o) for o in rng.integers(0, width, n)]
    caps = [float(cost.total(plan)[1]), float(rng.uniform(n * 3.0, n * 7.0)), n * 0.5]
  for cap in caps:
    expected = _brute_force(cost, n, lambda c, cap=cap: cap is None or cost.total(c)[1] <= cap)
    if expected is None:
      with pytest.raises(ConfigError, match='no plan fits'):
        search(_profiles(n), cluster, 8, cost, memory_cap=cap, layouts=LAYOUTS[:width])
      continue
    plan = search(_profiles(n), cluster, 8, cost, memory_cap=cap, layouts=LAYOUTS[:width])
    assert plan.predicted_step_s == expected
    choice = [cost.option(s.layout, s.group) for s in plan.submodels]
    assert cost.total(choice)[0] == expected
    assert cap is None or cost.total(choice)[1] <= cap
    # A hand-written plan is costed the same way: the searched plan re-evaluated agrees.
    again = evaluate(plan, _profiles(n), cluster, 8, cost)
    assert again.predicted_step_s == plan.predicted_step_s
    assert [s.predicted_s for s in again.submodels] == [s.predicted_s for s in plan.submodels]


@pytest.mark.parametrize('seed', range(8))
@pytest.mark.parametrize('tolerance', [0.0, 0.05, 0.3])
def test_tie_rule_saves_bytes_within_the_tolerance(seed, tolerance):
  """With ``tie_tolerance``, the plan fits, takes at most (1 + tolerance) × the least time, moves
  no more bytes than the fastest plan, and no single sub-model's change saves bytes within those
  limits (a local optimum); at 0 it is the fastest plan."""
  rng = np.random.default_rng(200 + seed)
  n, width = int(rng.integers(3, 5)), int(rng.integers(3, 6))
  cost = TableCost(rng, n, LAYOUTS[:width], comm=True)
  cluster = ClusterSpec.uniform(1, 32, 1e12, 1e30)
  cap = float(rng.uniform(n * 6.0, n * 8.0))  # most plans fit, some do not
  plans = [c for c in itertools.product(range(width), repeat=n) if cost.total(c)[1] <= cap]
  fastest = min(cost.total(c)[0] for c in plans)
  plan = search(_profiles(n), cluster, 8, cost, memory_cap=cap, layouts=LAYOUTS[:width],
                tie_tolerance=0.0)
  first = [cost.option(s.layout, s.group) for s in plan.submodels]
  plan = search(_profiles(n), cluster, 8, cost, memory_cap=cap, layouts=LAYOUTS[:width],
                tie_tolerance=tolerance)
  choice = [cost.option(s.layout, s.group) for s in plan.submodels]
  limit = fastest * (1 + tolerance) * (1 + 1e-12)
  assert plan.predicted_step_s == cost.total(choice)[0] <= limit
  assert cost.total(choice)[1] <= cap
  assert cost.bytes_(choice) <= cost.bytes_(first)
  assert sum(s.comm_bytes for s in plan.submodels) == pytest.approx(cost.bytes_(choice))
  if tolerance == 0:
    assert plan.predicted_step_s == fastest
    return
  for i in range(n):
    for o in range(width):
      other = [*choice[:i], o, *choice[i + 1:]]
      if cost.total(other)[0] <= limit and cost.total(other)[1] <= cap:
        assert cost.bytes_(other) >= cost.bytes_(choice) * (1 - 1e-9)


def test_tie_tolerance_must_be_finite_and_non_negative():
  cluster = ClusterSpec.uniform(1, 32, 1e12, 1e30)
  cost = TableCost(np.random.default_rng(0), 2, LAYOUTS[:2])
  for bad in (-0.1, float('nan'), float('inf')):
    with pytest.raises(ConfigError, match='tie_tolerance'):
      search(_profiles(2), cluster, 8, cost, layouts=LAYOUTS[:2], tie_tolerance=bad)


@pytest.mark.parametrize('seed', range(6))
def test_search_matches_brute_force_with_groups_and_per_worker_memory(seed):
  """Unequal workers: options are (group, layout); each worker must hold the memory of the
  sub-models whose group contains it, within its own memory."""
  rng = np.random.default_rng(100 + seed)
  speeds = (3e12, 2e12, 1e12, 1e12)
  memory = tuple(float(x) for x in rng.uniform(8.0, 30.0, 4))
  cluster = ClusterSpec(tuple(WorkerSpec(4, s, m) for s, m in zip(speeds, memory, strict=True)))
  groups = candidate_groups(cluster)
  assert groups == ((0, 1, 2, 3), (0,), (0, 1))
  layouts = LAYOUTS[:3]
  n = 4
  cost = TableCost(rng, n, layouts, groups)
  g_of = [g for g in groups for _ in layouts]

  def fits(choice):
    return all(cost.total(choice, lambda i, w=w: w in g_of[choice[i]])[1] <= memory[w]
               for w in range(4))

  expected = _brute_force(cost, n, fits)
  if expected is None:
    with pytest.raises(ConfigError, match='no plan fits'):
      search(_profiles(n), cluster, 8, cost, layouts=layouts)
    return
  plan = search(_profiles(n), cluster, 8, cost, layouts=layouts)
  assert plan.predicted_step_s == pytest.approx(expected, rel=1e-12)
  assert {s.group for s in plan.submodels} <= set(groups)


def _reference(tables, cap):
  """A plain Pareto dynamic program with no bounds: the least time within ``cap``."""
  fronts = [[(t, m[0])] for t, m in zip(tables.node_time[0], tables.node_memory[0], strict=True)]
  for i in range(1, len(tables.node_time)):
    new = []
    for b in range(len(tables.node_time[i])):
      labels = sorted(((t + tables.edge_time[i - 1][a, b]) + tables.node_time[i][b],
                       (m + tables.edge_memory[i - 1][a, b, 0]) + tables.node_memory[i][b, 0])
                      for a, front in enumerate(fronts) for t, m in front)
      kept, least = [], np.inf
      for t, m in labels:
        if m < least and m <= cap * (1 + 1e-9):
          kept.append((t, m))
          least = m
      new.append(kept)
    fronts = new
  times = [t for front in fronts for t, m in front if m <= cap]
  return min(times) if times else None


@pytest.mark.parametrize('seed', range(4))
def test_solver_matches_a_plain_pareto_program_on_longer_chains(seed):
  """Long enough for the bounds, the threshold doubling and the meet-in-the-middle join to
  matter; caps from loose to impossible."""
  rng = np.random.default_rng(200 + seed)
  n, width = 14, 6
  tables = Tables([rng.uniform(0.1, 1.0, width) for _ in range(n)],
                  [rng.uniform(1.0, 10.0, (width, 1)) for _ in range(n)],
                  [rng.uniform(0.0, 0.3, (width, width)) for _ in range(n - 1)],
                  [rng.uniform(0.0, 0.5, (width, width, 1)) for _ in range(n - 1)])
  for cap in (1e9, 110.0, 80.0, 60.0, 40.0, 20.0):
    expected = _reference(tables, cap)
    found = solve_chain(tables, np.array([cap]))
    if expected is None:
      assert found is None
      continue
    choice, total = found
    assert total == expected
    t, m = tables.total(choice)
    assert t == total and m[0] <= cap


def test_homogeneous_cluster_plans_64_submodels_on_1024_devices_quickly():
  rng = np.random.default_rng(0)
  profiles = [SubmodelProfile(
      f'block{i}', 0, float(rng.uniform(1e6, 1e9)), float(rng.uniform(1e6, 1e10)),
      output_bytes_per_example=float(rng.uniform(1e3, 1e5)),
      activation_bytes_per_example=float(rng.uniform(1e4, 1e6)),
      split_sizes={'mlp': int(rng.choice([512, 1024, 4096, 8192]))},
      shard_sizes={'embed': int(rng.choice([512, 1024, 4096]))}) for i in range(64)]
  cluster = ClusterSpec.uniform(128, 8, 1e12, 16e9, intra_beta_bytes_per_s=1e11)
  assert cluster.devices == 1024
  for cap in (None, 7.2e9, 2e9):
    # A guard against a blow-up in scale, in CPU seconds of this process (not wall time: a
    # loaded machine must not fail it).
    start = time.process_time()
    plan = search(profiles, cluster, 8192, memory_cap=cap)
    elapsed = time.process_time() - start
    print(f'64 sub-models × 1024 devices, cap {cap}: {elapsed:.2f} s, '
          f'predicted step {plan.predicted_step_s:.3f} s')
    assert elapsed < 10.0
    assert len(plan.submodels) == 64 and plan.devices == 1024 and plan.workers == 128
    used = sum(s.memory_bytes for s in plan.submodels)
    assert used <= (cap or 16e9) * (1 + 1e-12)


def test_no_plan_fits_names_the_biggest_submodel():
  profiles = [SubmodelProfile('embedding', 10**9, 4e9, 1e3, split_sizes={'table': 7}),
              SubmodelProfile('tower', 10**3, 4e3, 1e6, split_sizes={'mlp': 64})]
  cluster = ClusterSpec.uniform(1, 8, 1e12, 1e9)
  with pytest.raises(ConfigError, match=r"no plan fits 1e\+09 bytes per device: the smallest "
                     r"needs 1\.2e\+10 \(sub-model 'embedding' alone needs 1\.2e\+10\)"):
    search(profiles, cluster, 32)


def test_bad_arguments_are_config_errors():
  cluster = ClusterSpec.uniform(1, 8, 1e12, 1e9)
  profile = SubmodelProfile('a', 1, 4.0, 1.0)
  with pytest.raises(ConfigError, match='no sub-models'):
    search([], cluster, 8)
  with pytest.raises(ConfigError, match='positive integer'):
    search([profile], cluster, 0)
  with pytest.raises(ConfigError, match='repeat'):
    search([profile, profile], cluster, 8)
  with pytest.raises(ConfigError, match='distinct workers'):
    search([profile], cluster, 8, groups=[(0, 3)])
  with pytest.raises(ConfigError, match='memory_cap must be positive'):
    search([profile], cluster, 8, memory_cap=-1.0)
