"""The cluster description and the analytic cost model: formulas, feasibility, and the plans they
lead the search to on small made-up models (no devices)."""

import dataclasses
import json
import math

import pytest

from hetjax import ConfigError
from hetjax.core import LinkCost
from hetjax.planner._cluster import ClusterSpec, WorkerSpec
from hetjax.planner._cost import AnalyticCost, Cost, CostModel, feasible, infeasibility
from hetjax.planner._layout import Layout
from hetjax.planner._plan import Plan
from hetjax.planner._profile_types import SubmodelProfile
from hetjax.planner._search import candidate_groups, evaluate, search

COST = AnalyticCost()


def _cluster_json(**worker):
  good = {'devices': 4, 'speed': 1e11, 'memory': 8e9}
  return {'workers': [good, {**good, **worker}], 'alpha_s': 1e-5, 'beta_gbit_s': 10}


def test_cluster_reads_json_and_converts_gbit():
  cluster = ClusterSpec.from_json(_cluster_json())
  assert cluster.devices == 8 and len(cluster.workers) == 2
  assert cluster.workers[1] == WorkerSpec(4, 1e11, 8e9)
  assert cluster.beta_bytes_per_s == 1.25e9
  assert cluster.link(inside_worker=True) == cluster.link(inside_worker=False) == LinkCost(
      1e-5, 1.25e9)
  fast = ClusterSpec.from_json({**_cluster_json(), 'intra_beta_gbit_s': 800, 'intra_alpha_s': 0})
  assert fast.link(inside_worker=True) == LinkCost(0.0, 1e11)
  assert ClusterSpec.from_json(fast.to_json()) == fast


def test_cluster_load_and_uniform(tmp_path):
  path = tmp_path / 'cluster.json'
  path.write_text(json.dumps(_cluster_json()))
  assert ClusterSpec.load(path) == ClusterSpec.from_json(_cluster_json())
  uniform = ClusterSpec.uniform(128, 8, 1e12, 16e9, alpha_s=2e-5, beta_bytes_per_s=1e9)
  assert uniform.devices == 1024 and uniform.uniform_speed
  with pytest.raises(ConfigError, match='cannot read cluster'):
    ClusterSpec.load(tmp_path / 'missing.json')


@pytest.mark.parametrize('worker, message', [
    ({'speed': None}, r'worker 1: "speed" must be a positive finite number, got None'),
    ({'speed': -1.0}, r'worker 1: "speed" must be a positive'),
    ({'speed': 0}, r'worker 1: "speed" must be a positive'),
    ({'speed': math.nan}, r'worker 1: "speed" must be a positive finite number, got nan'),
    ({'memory': -8e9}, r'worker 1: "memory" must be a positive'),
    ({'memory': 'lots'}, r'worker 1: "memory" must be a positive'),
    ({'devices': 0}, r'worker 1: "devices" must be an integer >= 1, got 0'),
])
def test_cluster_bad_worker_names_worker_and_field(worker, message):
  with pytest.raises(ConfigError, match=message) as info:
    ClusterSpec.from_json(_cluster_json(**worker))
  assert '\n' not in str(info.value)


def test_cluster_missing_fields_and_no_workers():
  data = _cluster_json()
  del data['workers'][1]['memory']
  with pytest.raises(ConfigError, match='worker 1: missing "memory"'):
    ClusterSpec.from_json(data)
  with pytest.raises(ConfigError, match=r'at least one worker|non-empty list'):
    ClusterSpec.from_json({'workers': []})
  with pytest.raises(ConfigError, match='non-empty list'):
    ClusterSpec.from_json({'alpha_s': 1e-5})
  with pytest.raises(ConfigError, match='beta_gbit_s must be a positive'):
    ClusterSpec.from_json({**_cluster_json(), 'beta_gbit_s': 0})
  with pytest.raises(ConfigError, match='worker 0: flops_per_s'):
    ClusterSpec((WorkerSpec(1, float('inf'), 1e9),))


def test_analytic_cost_is_a_cost_model():
  assert isinstance(COST, CostModel)


def test_node_formulas_on_one_worker():
  # 8 devices in one worker, α = 1e-5, β = 1e9; P = 8e6 bytes, batch 256.
  cluster = ClusterSpec.uniform(1, 8, 1e12, 16e9, alpha_s=1e-5, beta_bytes_per_s=1e9)
  p = SubmodelProfile('tower', 2_000_000, 8e6, 1e6, output_bytes_per_example=1024,
                      activation_bytes_per_example=4096, split_sizes={'mlp': 512},
                      shard_sizes={'embed': 64})
  dp = COST.node(p, Layout(1), 256, cluster, (0,))
  compute = 1e6 * 256 / (8 * 1e12)
  assert dp.comm_bytes == pytest.approx(2 * 7 / 8 * 8e6)
  assert dp.time_s == pytest.approx(compute + 2 * 7 * 1e-5 + 2 * 7 / 8 * 8e6 / 1e9)
  assert dp.memory_bytes == pytest.approx(8e6 * 3 + 4096 * 256 / 8)
  fsdp = COST.node(p, Layout(1, fsdp=True), 256, cluster, (0,))
  assert fsdp.comm_bytes == pytest.approx(3 * 7 / 8 * 8e6)
  assert fsdp.time_s == pytest.approx(compute + 3 * 7 * 1e-5 + 3 * 7 / 8 * 8e6 / 1e9)
  assert fsdp.memory_bytes == pytest.approx(8e6 / 8 * 3 + 4096 * 256 / 8)
  hybrid = COST.node(p, Layout(4), 256, cluster, (0,))  # d = 2, t = 4
  grads, acts = 2 * 1 / 2 * 8e6 / 4, 2 * 2 * 3 / 4 * 1024 * 256 / 2
  assert hybrid.comm_bytes == pytest.approx(grads + acts)
  assert hybrid.time_s == pytest.approx(compute + 2 * 1e-5 + 2 * 2 * 3 * 1e-5
                                        + (grads + acts) / 1e9)
  assert hybrid.memory_bytes == pytest.approx(8e6 / 4 * 3 + 4096 * 256 / 2)
  tp = COST.node(p, Layout(8), 256, cluster, (0,))
  assert tp.comm_bytes == pytest.approx(2 * 2 * 7 / 8 * 1024 * 256)
  # A transformer block: two row-parallel matmuls, two all-reduces per pass.
  block = dataclasses.replace(p, tensor_reductions=2)
  assert COST.node(block, Layout(8), 256, cluster, (0,)).comm_bytes == pytest.approx(
      2 * tp.comm_bytes)
  # FSDP: one all-gather message per sharded array, the same bytes.
  many = COST.node(dataclasses.replace(p, fsdp_arrays=11), Layout(1, fsdp=True), 256, cluster,
                   (0,))
  assert many.comm_bytes == pytest.approx(fsdp.comm_bytes)
  assert many.time_s == pytest.approx(fsdp.time_s + 10 * 7 * 1e-5)
  sgd = AnalyticCost(optimizer_slots=0).node(p, Layout(8), 256, cluster, (0,))
  assert sgd.memory_bytes == pytest.approx(8e6 / 8 + 4096 * 256)


def test_node_adds_up_its_terms():
  """`terms` names the parts `node` sums: a model replacing one part (the FSDP sync) keeps the
  others exactly."""
  cluster = ClusterSpec.uniform(1, 8, 1e12, 16e9, alpha_s=1e-5, beta_bytes_per_s=1e9)
  p = SubmodelProfile('tower', 2_000_000, 8e6, 1e6, output_bytes_per_example=1024,
                      activation_bytes_per_example=4096, split_sizes={'mlp': 512},
                      shard_sizes={'embed': 64})
  for layout in (Layout(1), Layout(1, fsdp=True), Layout(4), Layout(4, fsdp=True), Layout(8)):
    node = COST.node(p, layout, 256, cluster, (0,))
    terms = COST.terms(p, layout, 256, cluster, (0,))
    assert node.time_s == terms.compute_s + terms.data_sync.time_s + terms.tensor.time_s
    assert node.comm_bytes == terms.data_sync.comm_bytes + terms.tensor.comm_bytes
    assert node.memory_bytes == terms.memory_bytes
  hybrid = COST.terms(p, Layout(4), 256, cluster, (0,))  # d = 2, t = 4
  assert hybrid.compute_s == pytest.approx(1e6 * 256 / (8 * 1e12))
  assert hybrid.data_sync.comm_bytes == pytest.approx(2 * 1 / 2 * 8e6 / 4)
  assert hybrid.tensor.comm_bytes == pytest.approx(2 * 2 * 3 / 4 * 1024 * 256 / 2)
  assert COST.terms(p, Layout(8), 256, cluster, (0,)).data_sync == Cost()


def test_slowest_device_sets_the_pace_and_links_follow_the_mesh():
  p = SubmodelProfile('tower', 10, 4e6, 1e9, output_bytes_per_example=4096,
                      split_sizes={'mlp': 64})
  compute_only = SubmodelProfile('c', 0, 0.0, 1e9, split_sizes={'mlp': 64})
  mixed = ClusterSpec((WorkerSpec(4, 2e12, 1e10), WorkerSpec(4, 1e12, 1e10)), alpha_s=0.0)
  # 8 devices at the slow worker's 1e12 take as long as the fast worker's 4 at 2e12.
  assert COST.node(compute_only, Layout(4), 64, mixed, (0, 1)).time_s == pytest.approx(
      1e9 * 64 / (8 * 1e12))
  assert COST.node(compute_only, Layout(4), 64, mixed, (0,)).time_s == pytest.approx(
      1e9 * 64 / (4 * 2e12))
  # Tensor groups inside a worker use the fast intra-worker link; across workers the slow one.
  cluster = ClusterSpec.uniform(2, 4, 1e12, 1e10, beta_bytes_per_s=1e9,
                                intra_beta_bytes_per_s=1e11)
  inside = COST.node(p, Layout(4), 64, cluster, (0, 1))
  across = COST.node(p, Layout(8), 64, cluster, (0, 1))
  assert inside.time_s < across.time_s


def test_no_split_axes_means_tensor_parallel_replicates():
  cluster = ClusterSpec.uniform(1, 8, 1e12, 16e9)
  p = SubmodelProfile('pool', 0, 0.0, 1e6, output_bytes_per_example=64)
  replicated = COST.node(p, Layout(8), 256, cluster, (0,))
  assert replicated.time_s == pytest.approx(1e6 * 256 / 1e12)  # every device does all rows
  assert replicated.comm_bytes == 0.0
  # FSDP with nothing to shard is plain data parallelism.
  q = SubmodelProfile('mlp', 0, 8e6, 1e6)
  assert COST.node(q, Layout(1, True), 256, cluster, (0,)) == COST.node(
      q, Layout(1), 256, cluster, (0,))


def test_resharding_is_free_between_equal_layouts_and_grows_with_the_ratio():
  cluster = ClusterSpec.uniform(2, 4, 1e12, 1e10)
  prev = SubmodelProfile('emb', 0, 0.0, 0.0, output_bytes_per_example=1024)
  every = (0, 1)
  assert COST.edge(prev, Layout(4), Layout(4, fsdp=True), 64, cluster, every, every) == Cost()
  assert COST.edge(prev, Layout(2), Layout(2), 64, cluster, every, every) == Cost()
  costs = [COST.edge(prev, Layout(1), Layout(t), 64, cluster, every, every)
           for t in (2, 4, 8)]
  assert [c.comm_bytes for c in costs] == [1024 * 64 * (t - 1) / 8 for t in (2, 4, 8)]
  assert costs[0].time_s < costs[1].time_s < costs[2].time_s
  # Symmetric: the forward gathers one way, the backward the other.
  assert COST.edge(prev, Layout(8), Layout(1), 64, cluster, every, every) == costs[2]
  # Moving between groups ships the rows and their gradients across workers.
  moved = COST.edge(prev, Layout(1), Layout(1), 64, cluster, every, (0,))
  assert moved.comm_bytes == pytest.approx(1024 * 64 / 8 + 1024 * 64 / 4)
  assert moved.time_s > 0


def test_feasibility_needs_every_split_to_divide():
  p = SubmodelProfile('tower', 0, 0.0, 0.0, split_sizes={'mlp': 512, 'heads': 16},
                      shard_sizes={'embed': 96, 'table': 1000})
  assert feasible(p, Layout(16), 1024)
  assert infeasibility(p, Layout(1024), 1024) == "'mlp' of size 512 cannot be split 1024 ways"
  assert not feasible(p, Layout(32), 1024)  # heads 16
  assert infeasibility(p, Layout(3), 1024) == 'tensor degree 3 does not divide 1024 devices'
  # FSDP over d = 64: 'embed' 96 does not divide; with t > 1 'table' goes to the tensor axes.
  assert infeasibility(p, Layout(16, fsdp=True), 1024) == (
      "'embed' of size 96 cannot be FSDP-sharded 64 ways")
  assert feasible(p, Layout(16, fsdp=True), 16 * 32)  # d = 32 divides 96
  assert not feasible(p, Layout(1, fsdp=True), 16)  # d = 16: table 1000 does not divide


def test_search_skips_infeasible_degrees():
  cluster = ClusterSpec.uniform(1, 8, 1e12, 16e9, beta_bytes_per_s=1e6)
  # Parameter-heavy: tensor parallelism would win, but 'mlp' 12 cannot be split 8 ways.
  p = SubmodelProfile('tower', 0, 4e9, 1e3, split_sizes={'mlp': 12})
  plan = search([p], cluster, 64)
  assert plan.submodels[0].layout.tensor == 4
  with pytest.raises(ConfigError, match=r"sub-model 'tower' has no feasible layout \(tp8: "
                     r"'mlp' of size 12 cannot be split 8 ways\)"):
    search([p], cluster, 64, layouts=[Layout(8)])
  with pytest.raises(ConfigError, match="sub-model 'tower' as tp8: 'mlp' of size 12"):
    evaluate(_plan('pure_mp', 8, ['tower']), [p], cluster, 64)


def _plan(name, tensor, names):
  return Plan.from_json({'name': name, 'devices': 8, 'submodels': {'*': {'tensor': tensor}}},
                        names)


def test_data_parallel_beats_tensor_parallel_for_compute_heavy_light_submodels():
  # A convolutional-style block: many FLOPs, few parameters, big activations; slow network.
  block = SubmodelProfile('conv', 10**5, 4e5, 5e8, output_bytes_per_example=2e5,
                          activation_bytes_per_example=1e6, split_sizes={'mlp': 256})
  cluster = ClusterSpec.uniform(2, 4, 1e12, 16e9, beta_bytes_per_s=1.25e9)
  dp = evaluate(_plan('pure_dp', 1, ['conv']), [block], cluster, 512)
  tp = evaluate(_plan('pure_mp', 8, ['conv']), [block], cluster, 512)
  assert dp.predicted_step_s < tp.predicted_step_s / 5
  plan = search([block], cluster, 512)
  assert plan.submodels[0].layout == Layout(1)
  assert plan.predicted_step_s == dp.predicted_step_s


def test_row_sharding_wins_for_a_huge_embedding_under_a_memory_cap():
  emb = SubmodelProfile('embedding', 10**9, 4e9, 2e3, output_bytes_per_example=256,
                        split_sizes={'table': 10**6}, shard_sizes={'embed': 64})
  tower = SubmodelProfile('tower', 10**6, 4e6, 2e9, output_bytes_per_example=4096,
                          activation_bytes_per_example=4e4, split_sizes={'mlp': 1024})
  cluster = ClusterSpec.uniform(2, 4, 1e12, 4e9, beta_bytes_per_s=1.25e9,
                                intra_beta_bytes_per_s=1e11)
  names = ['embedding', 'tower']
  plan = search([emb, tower], cluster, 4096, tie_tolerance=0)
  assert [s.layout.name(8) for s in plan.submodels] == ['tp8', 'dp2×tp4']
  assert all(s.memory_bytes <= 4e9 for s in plan.submodels)
  assert sum(s.memory_bytes for s in plan.submodels) <= 4e9
  assert round(plan.predicted_step_s, 3) == 1.029  # the example in _search's docstring
  # The tie rule: a data-parallel tower is 0.5% slower (within 3%) and moves fewer bytes.
  tied = search([emb, tower], cluster, 4096)
  assert [s.layout.name(8) for s in tied.submodels] == ['tp8', 'dp8']
  assert plan.predicted_step_s < tied.predicted_step_s <= 1.03 * plan.predicted_step_s
  assert sum(s.comm_bytes for s in tied.submodels) < sum(s.comm_bytes for s in plan.submodels)
  dp = evaluate(_plan('pure_dp', 1, names), [emb, tower], cluster, 4096)
  assert dp.submodels[0].memory_bytes == pytest.approx(3 * 4e9)  # does not fit
  mp = evaluate(_plan('pure_mp', 8, names), [emb, tower], cluster, 4096)
  assert plan.predicted_step_s < mp.predicted_step_s < dp.predicted_step_s
  # Without the cap the replicated table would still lose to the row-sharded one here, but
  # with a small enough cap FSDP alone would not help either: the search raises.
  with pytest.raises(ConfigError, match=r"no plan fits 1e\+09 .* 'embedding' alone needs"):
    search([emb, tower], cluster, 4096, memory_cap=1e9)


def test_heterogeneous_workers_give_fast_groups_to_compute():
  speeds = (1e12, 3e12, 2e12, 3e12)
  cluster = ClusterSpec(tuple(WorkerSpec(2, s, 1e10) for s in speeds))
  assert candidate_groups(cluster) == ((0, 1, 2, 3), (1,), (1, 3))
  assert candidate_groups(ClusterSpec.uniform(4, 2, 1e12, 1e10)) == ((0, 1, 2, 3),)
  # Compute-bound and tiny: 4 devices at 3e12 beat 8 at 1e12.
  block = SubmodelProfile('block', 10, 40.0, 1e9, split_sizes={'mlp': 8})
  plan = search([block], cluster, 64)
  assert plan.submodels[0].group == (1, 3)
  assert plan.predicted_step_s == pytest.approx(1e9 * 64 / (4 * 3e12), rel=0.05)
  assert evaluate(plan, [block], cluster, 64).predicted_step_s == plan.predicted_step_s


def test_evaluate_checks_the_plan_against_cluster_and_profiles():
  cluster = ClusterSpec.uniform(1, 8, 1e12, 16e9)
  p = SubmodelProfile('a', 1, 4.0, 1.0)
  with pytest.raises(ConfigError, match='is for 4 devices, the cluster has 8'):
    evaluate(Plan.from_json({'name': 'x', 'devices': 4, 'submodels': {'a': {}}}), [p],
             cluster, 8)
  with pytest.raises(ConfigError, match='covers sub-models a; the profiles are b'):
    evaluate(_plan('x', 1, ['a']), [SubmodelProfile('b', 1, 4.0, 1.0)], cluster, 8)
  costed = evaluate(_plan('x', 2, ['a']), [p], ClusterSpec.uniform(2, 4, 1e12, 16e9), 8)
  assert costed.workers == 2 and costed.predicted_step_s > 0


def test_memory_traffic_roofline_when_bandwidth_is_known():
  # 8 devices, 1 GB/s each; compute is negligible, so memory traffic sets the time.
  fast = WorkerSpec(8, 1e15, 16e9, memory_bytes_per_s=1e9)
  cluster = ClusterSpec((fast,), alpha_s=0.0, beta_bytes_per_s=1e15)
  p = SubmodelProfile('block', 1000, 4e6, 1.0, bytes_accessed_per_example=1e5,
                      bytes_accessed_per_step=8e6, split_sizes={'mlp': 64})
  cost = AnalyticCost(optimizer_slots=2)
  for tensor in (1, 8):
    d = 8 // tensor
    expected = (1e5 * 256 / d + 8e6 / tensor + 4e6 / tensor * 7) / 1e9
    assert cost.node(p, Layout(tensor), 256, cluster, (0,)).time_s == pytest.approx(expected)
  # Tensor parallelism replicates per-example traffic over t (rows split only d = n/t ways).
  rows_only = SubmodelProfile('block', 0, 0.0, 1.0, bytes_accessed_per_example=1e5)
  assert cost.traffic(rows_only, 256, 1, 8, False) == 8 * cost.traffic(rows_only, 256, 8, 1, False)
  without = ClusterSpec((WorkerSpec(8, 1e15, 16e9),), alpha_s=0.0, beta_bytes_per_s=1e15)
  assert cost.node(p, Layout(1), 256, without, (0,)).time_s < 1e-6  # compute only


def test_cluster_bandwidth_is_optional_and_round_trips():
  data = {'workers': [{'devices': 2, 'speed': 1e12, 'memory': 8e9, 'bandwidth': 5e10},
                      {'devices': 2, 'speed': 1e12, 'memory': 8e9}], 'beta_gbit_s': 10}
  cluster = ClusterSpec.from_json(data)
  assert [w.memory_bytes_per_s for w in cluster.workers] == [5e10, None]
  assert ClusterSpec.from_json(cluster.to_json()) == cluster
  with pytest.raises(ConfigError, match='worker 0: "bandwidth" must be a positive finite'):
    ClusterSpec.from_json({'workers': [{'devices': 1, 'speed': 1, 'memory': 1, 'bandwidth': 0}]})


def test_measure_cluster_measures_this_jobs_devices():
  from hetjax.planner import measure_cluster
  from tests.conftest import require_devices

  cluster = measure_cluster(require_devices(8), repeats=2)
  assert cluster.devices == 8 and len(cluster.workers) == 1
  worker = cluster.workers[0]
  assert worker.flops_per_s > 1e8 and worker.memory_bytes > 0 and worker.memory_bytes_per_s > 1e7
  assert cluster.alpha_s > 0 and cluster.beta_bytes_per_s > 0


def test_a_timed_profile_prices_compute_from_its_times():
  """A timed sub-model's compute is its forward + backward over B/d rows, split t ways, scaled
  from the cluster's fastest device (the one it is taken to be timed on) to the group's slowest,
  plus the update's traffic: not the roofline of its counts."""
  timed = SubmodelProfile('block', 1000, 4e6, 1e9, bytes_accessed_per_example=1e5,
                          bytes_accessed_per_step=8e6, split_sizes={'mlp': 64},
                          seconds_per_example=1e-4, seconds_per_step=2e-3)
  assert timed.timed and timed.timed_seconds(10) == pytest.approx(3e-3)
  fast, slow = WorkerSpec(4, 2e12, 16e9, 1e9), WorkerSpec(4, 1e12, 16e9, 1e9)
  cluster = ClusterSpec((fast, slow), alpha_s=0.0, beta_bytes_per_s=1e15)
  cost = AnalyticCost(optimizer_slots=2)
  update = 4e6 * 7  # read the gradient; read and write the parameters and both slots
  for group, tensor, scale in [((0,), 1, 1.0), ((0,), 4, 1.0), ((0, 1), 2, 2.0)]:
    devices = 4 * len(group)
    d = devices // tensor
    compute = (2e-3 + 1e-4 * 256 / d) / tensor * scale + update / tensor / 1e9
    terms = cost.terms(timed, Layout(tensor), 256, cluster, group)
    assert terms.compute_s == pytest.approx(compute), (group, tensor)
  # Without bandwidth, the timed forward + backward alone; the counts are not used.
  no_bandwidth = ClusterSpec((WorkerSpec(4, 2e12, 16e9),), alpha_s=0.0, beta_bytes_per_s=1e15)
  assert cost.terms(timed, Layout(1), 256, no_bandwidth, (0,)).compute_s == pytest.approx(
      2e-3 + 1e-4 * 64)
  assert SubmodelProfile.from_json(json.loads(json.dumps(timed.to_json()))) == timed
  untimed = dataclasses.replace(timed, seconds_per_example=None)
  assert not untimed.timed
  with pytest.raises(ValueError, match="'block' was not timed"):
    untimed.timed_seconds(1)
