"""`CompiledCost`: FSDP priced from the program XLA compiles and an update timed on the mesh.

Why: `AnalyticCost` prices FSDP from ring formulas (a reduction and one all-gather per
parameter array) and its sharded optimizer update from a memory-traffic formula. On the small
LM (bench_fela's ``lm_small``, 8 virtual CPU devices) both were wrong in the direction that
mattered: it predicted FSDP blocks faster than data parallelism, and they measured slower. The
compiled FSDP step has 13 all-gathers per block, not 2, and sharding Adam's update saves well
under what the formula said (how much depends on what else runs on the cores the devices
share). This model keeps the analytic model for everything the formulas get right and
replaces the two terms they got wrong with evidence.

An FSDP option, ``Layout(t, fsdp=True)``, of a sub-model on a group of n devices, d = n / t:

* **collectives, from the compiled program**: the sub-model's own training step (forward,
  backward and optimizer update, `hetjax.planner._submodel_step`) compiled under the layout on
  a mesh of n of this job's devices; its collectives read by `collective_bytes` and priced with
  the link `AnalyticCost` uses for the data-parallel sync: ``steps · α + bytes / β`` (steps:
  the ring steps of each op, 2(m−1) for an all-reduce over m devices, m−1 for an all-gather;
  α is per step, as `measure_cluster` fits it). With t > 1 the program also holds the
  tensor-parallel activation collectives, which stay the analytic model's: the same step
  compiled on the t tensor devices alone with B/d rows (one data-parallel replica, nothing to
  synchronise) is subtracted, kind by kind, clamped at zero.
* **the update, measured**: optax's update of the sub-model's parameters timed replicated
  (``Layout(t)``) and sharded (the layout) on the same mesh, interleaved
  (`hetjax.planner._update_timing`); sharded − replicated is added to the compute of
  ``Layout(t)``, whose roofline counts the replicated update (``AnalyticCost.terms``),
  instead of the traffic formula's saving. The forward and backward of an FSDP step run on
  gathered, whole parameters, so their traffic is that of ``Layout(t)``.
* compute, tensor-parallel activations, memory and edges: `AnalyticCost`, composed.

Every other option (no FSDP, or FSDP that shards nothing) is `AnalyticCost`'s. An FSDP option
falls back to `AnalyticCost` when this job cannot build its program: the profile names no
sub-model of the task, the group needs more devices than this process has, the job has several
processes and the group is not this process's worker alone, or the batch does not split d ways.
Nothing falls back silently: `pricings` lists every option priced and how, `fallbacks` the
FSDP options that fell back and why.

What is measured is this job's devices: the model prices a cluster that is them
(`measure_cluster`, or one regrouped from it), and would be wrong for a cluster file that
describes other hardware (use `AnalyticCost` there); a slowdown applied to the cluster
(`ClusterSpec.with_slowdowns`) reaches the analytic terms, not the timed update. What it still
misses here: on XLA:CPU an all-gather's bytes move markedly slower than the β fitted from an
all-reduce, which the α–β link model cannot express, so FSDP is still priced somewhat low.

Compiled analyses and update timings are cached per (sub-model structure, layout, mesh,
batch): identical transformer blocks are compiled and timed once, and re-pricing under another
β (bench_fela's @β columns) costs nothing.

Example, the small LM's block (bench_fela's ``lm_small``) on this machine's 8 devices as
`measure_cluster` found them (α and β its fit)::

  cost = CompiledCost(task, optax.adam(1e-3))
  cost.node(block, Layout(1, fsdp=True), 64, cluster, (0,))
  # collectives: 1 all-reduce (14 steps) + 13 all-gathers (7 steps each) = 105 steps and
  #   2.08 MB: 105 · α + 2.08 MB / β (data parallel: 14 steps and 1.38 MB);
  # update: sharded − replicated, both timed on these devices (not the formula's saving);
  # where FSDP's extra collectives cost more than its update saves, the search keeps dp8.
  [p.describe() for p in cost.pricings]   # how every option was priced, and on what evidence
"""

from __future__ import annotations

import dataclasses
import enum
import math

import jax
import optax
from flax import nnx

from hetjax.planner._cluster import ClusterSpec
from hetjax.planner._cost import (
  AnalyticCost,
  Cost,
  Group,
  fsdp_axes,
  group_devices,
  infeasibility,
  members,
)
from hetjax.planner._hlo import KINDS, CollectiveBytes
from hetjax.planner._layout import Layout, group_factors
from hetjax.planner._profile import SubmodelCall, submodel_calls
from hetjax.planner._profile_types import SubmodelProfile
from hetjax.planner._submodel_step import layout_mesh, step_collectives
from hetjax.planner._update_timing import update_seconds
from hetjax.train import Task


class PricedBy(enum.Enum):
  """How an option was priced."""

  COMPILED = 'compiled'  # FSDP: collectives from the compiled program, the update timed
  ANALYTIC = 'analytic'  # not FSDP (or FSDP that shards nothing): AnalyticCost, by design
  FALLBACK = 'fallback'  # FSDP this job cannot compile or time: AnalyticCost (see reason)


@dataclasses.dataclass(frozen=True)
class Pricing:
  """How one option (sub-model, layout, group) was priced, with the evidence used.

  Attributes:
    submodel, layout, group: the option; ``devices`` is the group's device count.
    source: `PricedBy`; ``reason`` says why an FSDP option fell back.
    time_s: the node's time as priced; ``analytic_s``: `AnalyticCost`'s for the same option.
    collectives: the FSDP data-parallel collectives read from the compiled program (tensor
      replica's subtracted), or None.
    update_replicated_s, update_sharded_s: the measured update, or None.
  """

  submodel: str
  layout: Layout
  group: Group
  devices: int
  source: PricedBy
  time_s: float
  analytic_s: float
  reason: str = ''
  collectives: CollectiveBytes | None = None
  update_replicated_s: float | None = None
  update_sharded_s: float | None = None

  def describe(self) -> str:
    """One line, e.g. ``block_0 dp8+fsdp: compiled 92.07 ms (analytic 93.82 ms): 1 all-reduce,
    13 all-gather, 105 steps, 2.076 MB; update 3.41 -> 1.21 ms`` (the update replicated, then
    sharded)."""
    head = (f'{self.submodel} {self.layout.name(self.devices)}: {self.source.value} '
            f'{1e3 * self.time_s:.2f} ms (analytic {1e3 * self.analytic_s:.2f} ms)')
    if self.source is PricedBy.FALLBACK:
      return f'{head}: {self.reason}'
    if self.collectives is None:
      return head
    ops = ', '.join(f'{n} {k.replace("_", "-")}' for k, n in self.collectives.counts.items() if n)
    return (f'{head}: {ops or "no collectives"}, {self.collectives.total_steps} steps, '
            f'{self.collectives.total / 1e6:.3f} MB; update {1e3 * self.update_replicated_s:.2f}'
            f' -> {1e3 * self.update_sharded_s:.2f} ms')


@dataclasses.dataclass(frozen=True)
class _Evidence:
  collectives: CollectiveBytes
  update_replicated_s: float
  update_sharded_s: float


class CompiledCost:
  """A `CostModel` pricing FSDP options from compiled programs and timed updates (module
  docstring); everything else is ``analytic``'s.

  Args:
    task: the model whose sub-models the profiles describe (by name).
    optimizer: the optimizer the plan trains with (default: ``optax.adam(1e-3)``); keep
      ``analytic.optimizer_slots`` in step with it.
    analytic: the model for everything else (default: ``AnalyticCost()``).
    devices: where to compile and time (default: this process's devices).
    repeats, calls: update timing rounds and back-to-back calls per sample.
    seed: for the task's abstract model and batch.
  """

  def __init__(self, task: Task, optimizer: optax.GradientTransformation | None = None,
               analytic: AnalyticCost | None = None, devices=None, repeats: int = 7,
               calls: int = 5, seed: int = 0):
    self.task, self.seed = task, seed
    self.optimizer = optax.adam(1e-3) if optimizer is None else optimizer
    self.analytic = AnalyticCost() if analytic is None else analytic
    self.devices = list(jax.local_devices() if devices is None else devices)
    self.repeats, self.calls = repeats, calls
    self._calls: dict[int, dict[str, SubmodelCall]] = {}
    self._collectives: dict[tuple, CollectiveBytes] = {}
    self._updates: dict[tuple, tuple[float, float]] = {}
    self._pricings: dict[tuple, Pricing] = {}

  @property
  def pricings(self) -> tuple[Pricing, ...]:
    """Every option (and batch) priced so far, in the order first priced; re-pricing one (under
    another cluster) replaces its entry."""
    return tuple(self._pricings.values())

  def fallbacks(self) -> tuple[Pricing, ...]:
    """The FSDP options priced by `AnalyticCost` because this job could not compile them."""
    return tuple(p for p in self._pricings.values() if p.source is PricedBy.FALLBACK)

  def edge(self, prev_profile: SubmodelProfile, prev_layout: Layout, layout: Layout, batch: int,
           cluster: ClusterSpec, prev_group: Group, group: Group) -> Cost:
    return self.analytic.edge(prev_profile, prev_layout, layout, batch, cluster, prev_group,
                              group)

  def node(self, profile: SubmodelProfile, layout: Layout, batch: int, cluster: ClusterSpec,
           group: Group) -> Cost:
    group = members(cluster, group)
    n = group_devices(cluster, group)
    analytic = self.analytic.node(profile, layout, batch, cluster, group)
    option = Pricing(profile.name, layout, group, n, PricedBy.ANALYTIC, analytic.time_s,
                     analytic.time_s)
    if not layout.fsdp or not fsdp_axes(profile, layout) or n // layout.tensor < 2:
      return self._record(option, batch, analytic)
    reason = self._why_not(profile, layout, batch, group, n)
    if reason:
      return self._record(
          dataclasses.replace(option, source=PricedBy.FALLBACK, reason=reason), batch, analytic)
    factors = group_factors(tuple(cluster.workers[w].devices for w in group))
    evidence = self._evidence(profile.name, layout, factors, batch)
    base = self.analytic.terms(profile, Layout(layout.tensor), batch, cluster, group)
    link = cluster.link(len(group) == 1)  # the data-parallel link, as AnalyticCost's
    moved = evidence.collectives
    update = evidence.update_sharded_s - evidence.update_replicated_s
    time = (max(base.compute_s + update, 0.0) + link.time_s(moved.total_steps, moved.total)
            + base.tensor.time_s)
    cost = Cost(time, moved.total + base.tensor.comm_bytes, analytic.memory_bytes)
    return self._record(dataclasses.replace(
        option, source=PricedBy.COMPILED, time_s=time, collectives=moved,
        update_replicated_s=evidence.update_replicated_s,
        update_sharded_s=evidence.update_sharded_s), batch, cost)

  def _record(self, pricing: Pricing, batch: int, cost: Cost) -> Cost:
    self._pricings[(pricing.submodel, pricing.layout, pricing.group, batch)] = pricing
    return cost

  def _why_not(self, profile: SubmodelProfile, layout: Layout, batch: int, group: Group,
               n: int) -> str:
    """Why this job cannot compile the option, or ``''`` if it can."""
    data = n // layout.tensor
    if profile.name not in self._submodels(batch):
      return f'{profile.name!r} is not a sub-model of {self.task.name!r}'
    if batch % data:
      return f'the batch of {batch} does not split {data} ways'
    if n > len(self.devices):
      every = len(self.devices) == jax.device_count()  # all of this one-process job's
      hint = (f' (--jax_num_cpu_devices={n} gives it {n})'
              if every and self.devices[0].platform == 'cpu' else '')
      return f'needs {n} devices, this process has {len(self.devices)}{hint}'
    if jax.process_count() > 1 and group != (jax.process_index(),):
      return f'workers {list(group)} include other processes than this one'
    return infeasibility(profile, layout, n) or ''

  def _submodels(self, batch: int) -> dict[str, SubmodelCall]:
    if batch not in self._calls:
      self._calls[batch] = submodel_calls(self.task, batch, self.seed)
    return self._calls[batch]

  def _evidence(self, name: str, layout: Layout, factors: tuple[int, ...],
                batch: int) -> _Evidence:
    call = self._submodels(batch)[name]
    t = layout.tensor
    moved = self._step(call, layout, factors, batch)
    if t > 1:  # one data-parallel replica's tensor-parallel collectives are not FSDP's
      tensor_factors = _tensor_factors(factors, t)
      rows = batch // (math.prod(factors) // t)
      replica = self._step(self._submodels(rows)[name], Layout(t), tensor_factors, rows)
      moved = _minus(moved, replica)
    key = (_structure(call.module), t, factors)
    if key not in self._updates:
      mesh = layout_mesh(self.devices, factors)
      self._updates[key] = update_seconds(call.module, (Layout(t), Layout(t, fsdp=True)), mesh,
                                          self.optimizer, self.repeats, self.calls)
    replicated, sharded = self._updates[key]
    return _Evidence(moved, replicated, sharded)

  def _step(self, call: SubmodelCall, layout: Layout, factors: tuple[int, ...],
            batch: int) -> CollectiveBytes:
    key = (_structure(call.module, call), layout, factors, batch)
    if key not in self._collectives:
      mesh = layout_mesh(self.devices, factors)
      self._collectives[key] = step_collectives(call, layout, mesh, self.optimizer, batch)
    return self._collectives[key]


def _tensor_factors(factors: tuple[int, ...], t: int) -> tuple[int, ...]:
  """The trailing factors (the tensor axes) whose product is ``t``."""
  for k in range(len(factors) + 1):
    if math.prod(factors[len(factors) - k:]) == t:
      return factors[len(factors) - k:]
  raise ValueError(f'tensor degree {t} is no product of trailing factors of {factors}')


def _minus(a: CollectiveBytes, b: CollectiveBytes) -> CollectiveBytes:
  """``a − b`` per kind (bytes, counts, steps), clamped at zero."""
  return CollectiveBytes(
      **{k: max(getattr(a, k) - getattr(b, k), 0.0) for k in KINDS},
      counts={k: max(a.counts[k] - b.counts[k], 0) for k in KINDS},
      steps={k: max(a.steps[k] - b.steps[k], 0) for k in KINDS},
      unknown_trip_counts=a.unknown_trip_counts or b.unknown_trip_counts)


def _structure(module: nnx.Module, call: SubmodelCall | None = None) -> tuple:
  """A hashable key equal for sub-models of the same structure and shapes (and calls of the
  same shapes): identical transformer blocks share it."""
  from flax import nnx
  graphdef, state = nnx.split(module)
  tree = (state, () if call is None else (call.args, call.kwargs))
  leaves = jax.tree.leaves(tree)
  return (graphdef, jax.tree.structure(tree),
          tuple((tuple(x.shape), str(x.dtype)) for x in leaves))
