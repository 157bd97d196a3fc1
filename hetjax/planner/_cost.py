"""`CostModel`: what a sub-model costs under a layout, and what moving between layouts costs.

The search only adds up `Cost` values, so any model of time and memory can drive it: the
analytic α–β model below (the default, priced by `hetjax.core.LinkCost`), measured tables, or made-up numbers in tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from hetjax.core import ring_bytes, ring_steps
from hetjax.planner._cluster import ClusterSpec
from hetjax.planner._layout import TENSOR_AXES, Layout
from hetjax.planner._profile_types import SubmodelProfile

Group = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Cost:
  """Modelled cost of one sub-model (a node) or of the move between two (an edge), per step.

  Attributes:
    time_s: seconds per step.
    comm_bytes: bytes each device sends or receives per step.
    memory_bytes: bytes each device holds.
  """

  time_s: float = 0.0
  comm_bytes: float = 0.0
  memory_bytes: float = 0.0

  def __add__(self, other: Cost) -> Cost:
    return Cost(self.time_s + other.time_s, self.comm_bytes + other.comm_bytes,
                self.memory_bytes + other.memory_bytes)


@dataclasses.dataclass(frozen=True)
class NodeTerms:
  """`AnalyticCost.node`'s parts: its time is ``compute_s + data_sync.time_s +
  tensor.time_s``, its bytes ``data_sync.comm_bytes + tensor.comm_bytes``.

  Attributes:
    compute_s: compute, or the memory-traffic roofline when bandwidth is known (including the
      optimizer update's traffic); for a timed profile, its timed forward + backward plus the
      update's traffic time.
    data_sync: the data-parallel gradient sync (and FSDP's all-gathers): time and bytes.
    tensor: the tensor-parallel activation all-reduces: time and bytes.
    memory_bytes: bytes each device holds.
  """

  compute_s: float
  data_sync: Cost
  tensor: Cost
  memory_bytes: float


@runtime_checkable
class CostModel(Protocol):
  """Costs of sub-models under layouts on device groups; `search` sums them along the chain.

  ``group`` is the workers (indices into ``cluster.workers``) whose devices run a sub-model;
  a layout's degrees are relative to that group's device count.
  """

  def node(self, profile: SubmodelProfile, layout: Layout, batch: int, cluster: ClusterSpec,
           group: Group) -> Cost: ...

  def edge(self, prev_profile: SubmodelProfile, prev_layout: Layout, layout: Layout, batch: int,
           cluster: ClusterSpec, prev_group: Group, group: Group) -> Cost: ...


def members(cluster: ClusterSpec, group: Sequence[int]) -> Group:
  """The group's workers; ``()`` means every worker."""
  return tuple(group) if group else tuple(range(len(cluster.workers)))


def group_devices(cluster: ClusterSpec, group: Sequence[int]) -> int:
  """Devices of the group's workers (``()``: every worker)."""
  if not group or len(group) == len(cluster.workers):
    return cluster.devices
  if cluster.devices_per_worker is not None:
    return len(group) * cluster.devices_per_worker
  return sum(cluster.workers[w].devices for w in group)


def fsdp_axes(profile: SubmodelProfile, layout: Layout) -> dict[str, int]:
  """The axes FSDP splits over the data-parallel axes: ``shard_sizes`` minus any axis the
  tensor-parallel rules take first (``'table'`` when t > 1). Empty: FSDP changes nothing."""
  if not layout.fsdp:
    return {}
  taken = set(TENSOR_AXES) if layout.tensor > 1 else set()
  return {k: v for k, v in profile.shard_sizes.items() if k not in taken}


def infeasibility(profile: SubmodelProfile, layout: Layout, devices: int) -> str | None:
  """Why ``layout`` cannot run ``profile`` on ``devices`` devices, or None if it can.

  Example: a sub-model whose ``'mlp'`` is 512 wide cannot be split 1,024 ways::

    >>> infeasibility(SubmodelProfile('tower', 0, 0.0, 0.0, split_sizes={'mlp': 512}),
    ...               Layout(1024), 1024)
    "'mlp' of size 512 cannot be split 1024 ways"
  """
  t = layout.tensor
  if t < 1 or devices % t:
    return f'tensor degree {t} does not divide {devices} devices'
  for name, size in profile.split_sizes.items():
    if size % t:
      return f'{name!r} of size {size} cannot be split {t} ways'
  data = devices // t
  for name, size in fsdp_axes(profile, layout).items():
    if size % data:
      return f'{name!r} of size {size} cannot be FSDP-sharded {data} ways'
  return None


def feasible(profile: SubmodelProfile, layout: Layout, devices: int) -> bool:
  """Whether every split the layout makes divides the dimension it splits (see
  `infeasibility`)."""
  return infeasibility(profile, layout, devices) is None


def _inside_one_worker(cluster: ClusterSpec, group: Group, span: int) -> bool:
  """Whether collectives over ``span`` consecutive (tensor-axis) devices stay in one worker."""
  if len(group) == 1:
    return True
  if cluster.devices_per_worker is not None:
    return cluster.devices_per_worker % span == 0
  return all(cluster.workers[w].devices % span == 0 for w in group)


@dataclasses.dataclass(frozen=True)
class AnalyticCost:
  """An α–β model of one synchronous SPMD step (no overlap of compute and communication).

  Notation: n devices in the group, t the tensor degree, d = n / t the data-parallel degree,
  B the global batch, P the sub-model's parameter bytes, s the slowest device's FLOP/s in the
  group. A ring collective over m devices of x bytes per device takes α per step and moves
  2(m−1)/m·x (all-reduce, 2(m−1) steps) or (m−1)/m·x (all-gather, reduce-scatter, m−1 steps).
  Collectives inside one worker use the intra-worker α, β; any that cross workers the
  inter-worker ones (the ring is as slow as its slowest link).

  Node (a sub-model under a layout):

  * compute = flops_per_example · B / (n · s): devices run in lockstep, the slowest sets the pace;
    when every device's memory bandwidth is known, max(compute, `traffic` / bandwidth), the
    roofline (small models on CPU devices that share cores are memory-bound). A timed profile
    (``profile_submodels(..., timed=True)``) replaces the counts with its times: its forward +
    backward on B/d rows (``seconds_per_step + seconds_per_example · B/d``), divided by t when
    tensor parallelism splits it, times s_max / s (the profile is taken to be timed on a device
    as fast as the cluster's fastest, s_max: a measured cluster is this machine's devices,
    slowed where ``--slowdown`` says), plus `update_traffic` / bandwidth (the update, which the
    timed program does not run). Timed profiles suit devices that do not share compute (one
    process's GPUs); virtual CPU devices sharing cores run slower than the one timed alone.
  * data-parallel gradient sync of the P/t bytes each device holds (none when d = 1):
    all-reduce: 2(d−1)·α + 2(d−1)/d·(P/t)/β;
    FSDP: the gradient reduction as above plus one all-gather per sharded parameter array (g =
    ``fsdp_arrays``; XLA:CPU gathers each array separately, once, the backward reusing the
    forward's): (2 + g)(d−1)·α + 3(d−1)/d·(P/t)/β. Crosses workers unless the group is one
    worker.
  * tensor parallel (t > 1): r = ``tensor_reductions`` output-sized activations are all-reduced
    over t in the forward and r gradients in the backward: 2r·2(t−1)·α +
    2r·2(t−1)/t·(output_bytes_per_example·B/d)/β (``tensor_bytes_per_example`` instead where
    the profile gives it: the whole model's row-parallel layers); inside a worker when t
    divides its device count (tensor axes are the mesh's last axes).
  * memory per device = P/t (P/(t·d) with FSDP) · (1 + optimizer_slots) +
    activation_bytes_per_example · B/d. Gathered FSDP parameters are transient (layer by layer)
    and not counted; set ``optimizer_slots`` one higher to count a full gradient buffer.

  A profile with no ``split_sizes`` has nothing tensor parallelism can split: its t devices
  compute the same rows (compute /(d·s) instead of /(n·s)), hold all of P, and need no
  activation all-reduce. FSDP with no axis to shard (`fsdp_axes` empty) is plain data parallel.

  Edge (resharding the boundary activation A = prev output_bytes_per_example · B):

  * same group, same t: 0 (FSDP does not change where activations live).
  * same group, t_a ≠ t_b: a device holds A·t/n of the activation (its batch rows, replicated
    over t). Towards the larger degree the rows are all-gathered over r = max/min devices; the
    other way is a local slice. One direction gathers in the forward, the other the gradient in
    the backward: (r−1)·α + A·(max(t_a, t_b) − min(t_a, t_b))/n / β. Intra-worker when the
    larger degree fits in a worker.
  * different groups: every row goes from group a to group b and its gradient back, over the
    inter-worker links: 2α + (A/d_a + A/d_b)/β (the busiest device sends or receives its rows
    in one direction and their gradient in the other).

  Example: 8 devices in one worker, an embedding of 6.4 MB parameters (f32), batch 256::

    >>> cost = AnalyticCost()
    >>> emb = SubmodelProfile('embedding', 1_600_000, 6.4e6, 1e3, output_bytes_per_example=256,
    ...                       split_sizes={'table': 100_000})
    >>> one = ClusterSpec.uniform(1, 8, 1e12, 16e9, beta_bytes_per_s=1e9)
    >>> round(cost.node(emb, Layout(1), 256, one, (0,)).comm_bytes / 1e6, 3)  # 2·7/8·6.4 MB
    11.2
    >>> round(cost.node(emb, Layout(8), 256, one, (0,)).comm_bytes / 1e6, 3)  # 2·2·7/8·65.5 kB
    0.229

  Attributes:
    optimizer_slots: optimizer state per parameter, in parameter sizes (Adam: 2, SGD: 0).
  """

  optimizer_slots: int = 2

  def node(self, profile: SubmodelProfile, layout: Layout, batch: int, cluster: ClusterSpec,
           group: Group) -> Cost:
    terms = self.terms(profile, layout, batch, cluster, group)
    time = terms.compute_s + terms.data_sync.time_s + terms.tensor.time_s
    comm = 0.0 + terms.data_sync.comm_bytes + terms.tensor.comm_bytes
    return Cost(time, comm, terms.memory_bytes)

  def terms(self, profile: SubmodelProfile, layout: Layout, batch: int, cluster: ClusterSpec,
            group: Group) -> NodeTerms:
    """The parts `node` adds up (class docstring), for a model that replaces some of them
    (`hetjax.planner.CompiledCost` prices FSDP's data-parallel sync and sharded update from
    the compiled program and keeps the rest)."""
    group = members(cluster, group)
    n = group_devices(cluster, group)
    t = layout.tensor
    d = n // t
    split = t if profile.split_sizes else 1
    speed = min(cluster.workers[w].flops_per_s for w in group)
    held = profile.param_bytes / split
    sharded = bool(fsdp_axes(profile, layout))
    bandwidths = [cluster.workers[w].memory_bytes_per_s for w in group]
    if profile.timed:
      # Measured: its forward + backward on B/d rows, split t ways, on a device as fast as the
      # slowest of the group; plus the optimizer update, which the timed program does not run.
      fastest = max(w.flops_per_s for w in cluster.workers)
      time = profile.timed_seconds(batch / d) / split * fastest / speed
      if all(bandwidths):
        time += self.update_traffic(profile, d, split, sharded) / min(bandwidths)
    else:
      time = profile.flops_per_example * batch / (d * split * speed)
      if all(bandwidths):
        time = max(time, self.traffic(profile, batch, d, split, sharded) / min(bandwidths))
    data_sync = tensor = Cost()
    if d > 1:
      link = cluster.link(len(group) == 1)
      rounds = 3 if sharded else 2  # bytes: the reduction (2) plus all-gathering P (1)
      messages = 2 + profile.fsdp_arrays if sharded else 2  # one all-gather per array
      moved = ring_bytes(held, d, rounds)
      data_sync = Cost(link.time_s(ring_steps(d, messages), moved), moved)
    if split > 1:
      link = cluster.link(_inside_one_worker(cluster, group, t))
      passes = 2 * profile.tensor_reductions  # forward and backward, each an all-reduce
      activation = (profile.output_bytes_per_example if profile.tensor_bytes_per_example is None
                    else profile.tensor_bytes_per_example)
      moved = ring_bytes(activation, t, passes * 2) * batch / d
      tensor = Cost(link.time_s(ring_steps(t, passes * 2), moved), moved)
    state = (held / d if sharded else held) * (1 + self.optimizer_slots)
    memory = state + profile.activation_bytes_per_example * batch / d
    return NodeTerms(time, data_sync, tensor, memory)

  def traffic(self, profile: SubmodelProfile, batch: int, d: int, split: int,
              sharded: bool) -> float:
    """Bytes one device reads and writes per step (roofline: time = max(compute, traffic/bw)).

    Per-example traffic follows the device's rows, B/d: under tensor parallelism each device
    reads the whole activations of its rows for every split matmul and repeats the unsplit
    elementwise work (an upper bound: split matmuls' own reads shrink with t). Per-step traffic
    (parameters read, gradients written) and the optimizer update (read the gradient, read and
    write parameters and each slot) follow the parameters the device holds; FSDP adds the
    gathered parameters written twice and the full gradient read once.
    """
    per_step = profile.bytes_accessed_per_step / (split * (d if sharded else 1))
    return (profile.bytes_accessed_per_example * batch / d + per_step
            + self.update_traffic(profile, d, split, sharded))

  def update_traffic(self, profile: SubmodelProfile, d: int, split: int, sharded: bool) -> float:
    """Bytes one device reads and writes per step for the optimizer update (read the
    gradient, read and write the parameters and each slot, of the parameters it holds), plus
    FSDP's gathered parameters, written twice (forward, backward), and its full gradient, read
    once to reduce-scatter it."""
    update = profile.param_bytes / (split * (d if sharded else 1)) * (3 + 2 * self.optimizer_slots)
    gathered = 3 * profile.param_bytes / split if sharded and d > 1 else 0.0
    return update + gathered

  def edge(self, prev_profile: SubmodelProfile, prev_layout: Layout, layout: Layout, batch: int,
           cluster: ClusterSpec, prev_group: Group, group: Group) -> Cost:
    prev_group, group = members(cluster, prev_group), members(cluster, group)
    boundary = prev_profile.output_bytes_per_example * batch
    if prev_group != group:
      d_a = group_devices(cluster, prev_group) // prev_layout.tensor
      d_b = group_devices(cluster, group) // layout.tensor
      moved = boundary / d_a + boundary / d_b
      return Cost(cluster.link(False).time_s(2, moved), moved)
    if prev_layout.tensor == layout.tensor:
      return Cost()
    n = group_devices(cluster, group)
    lo, hi = sorted((prev_layout.tensor, layout.tensor))
    link = cluster.link(_inside_one_worker(cluster, group, hi))
    moved = boundary * (hi - lo) / n
    return Cost(link.time_s(hi // lo - 1, moved), moved)
