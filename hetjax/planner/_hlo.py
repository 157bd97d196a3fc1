"""Bytes each device sends over the wire per step, read from a compiled program's HLO text.

`collective_bytes` walks the optimised HLO module from its entry computation and charges every
collective with the bandwidth-optimal (ring) factor, for ``S`` bytes and a group of ``n``:

* all-reduce of ``S``: ``2(n−1)/n · S`` (a reduce-scatter followed by an all-gather);
* all-gather whose *output* is ``S``: ``(n−1)/n · S``;
* reduce-scatter whose *input* is ``S``: ``(n−1)/n · S`` (HLO text prints only the output, so
  ``S`` is the output times ``n``);
* all-to-all of ``S``: ``(n−1)/n · S`` (the block a device keeps does not move);
* collective-permute of ``S``: ``S`` once per op if some pair sends to another device (a device
  is the source of at most one pair; pairs ``{i,i}`` move nothing).

Latency: each op also counts its ring *steps*, the messages a device sends one after another
(what a per-message latency α multiplies): an all-reduce over ``n`` devices ``2(n−1)``, an
all-gather, reduce-scatter or all-to-all ``n−1``, a collective-permute that moves data 1, an op
over one device 0. Priced with the cluster's α and β, one execution's collectives take
``steps · α + total / β``, the ring formulas' time for the ops XLA actually emits.

``S`` comes from the result shape (element count × element size: ``bf16`` 2 bytes, ``pred`` 1,
``s4`` ½ …); a tuple result, such as the combined all-reduce ``(f32[10], f32[20])`` XLA makes of
several operands, sums its elements. A group of one device moves nothing.

Group size ``n``: ``replica_groups`` is read in the explicit form ``{{0,1,2,3},{4,5,6,7}}``, the
iota form ``[2,4]<=[8]`` (also transposed, ``[4,2]<=[2,4]T(1,0)``: the last dimension of the
leading shape is the group size) and the mesh-axes form that GSPMD prints,
``mesh['x'=2,'y'=4] {'y'}`` (the product of the listed axes' sizes; a sub-axis ``'y':(1)2`` has
size 2). A form not listed here raises rather than being guessed. An empty ``{}`` means every participant of the op's group mode,
counted from the module header's ``replica_count`` and ``num_partitions`` (each 1 when absent),
with XLA's modes: without ``channel_id`` groups hold replicas (all = replicas); with
``use_global_device_ids=true`` flattened device ids (all = replicas × partitions); with a
``channel_id`` but no global ids, an all-to-all groups partitions (all = partitions), and an
all-reduce, all-gather or reduce-scatter groups replicas each spanning every partition
(n = group size × partitions). When groups differ in size the largest is charged: the busiest
device bounds the step.

Async pairs count once, at the start: ``all-reduce-start`` (result shaped as an all-reduce's),
``all-gather-start`` (the result is the last element of its tuple),
``collective-permute-start`` (the result is element 1 of ``(operand, result, contexts…)``); a
generic ``async-start`` is followed into its ``calls=`` computation, where the wrapped collective
is an ordinary op; ``async-update`` and ``async-done`` are not followed.

Repetition: a ``while`` body counts ``n`` times for ``backend_config``'s
``"known_trip_count":{"n":"5"}`` (its condition ``n + 1`` times); nested loops multiply. A loop
holding a collective without a known trip count is counted once and sets
``unknown_trip_counts``. Of a ``conditional``'s branches, the one moving the most bytes is
charged. Other called computations (``calls=`` of fusions and ``async-start``, ``to_apply=`` of
``call``, ``called_computations=`` of custom calls) count once per call; reducers (``to_apply=``
of collectives, reduces, sorts …) are not followed. Send/recv, collective-broadcast and
ragged-all-to-all (whose sizes are only known at run time) are not counted.

Example::

  f = jax.jit(jax.shard_map(lambda a: lax.psum(a, 'd'), mesh=mesh, in_specs=P('d'),
                            out_specs=P()))
  collective_bytes(f.lower(x).compile()).all_reduce
  # 3584.0 for f32[16, 32] per device over 8 devices: 2·7/8 · 2048
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping

import jax

from hetjax.core import ring_bytes, ring_steps

KINDS = ('all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all', 'collective_permute')


@dataclasses.dataclass(frozen=True)
class CollectiveBytes:
  """Bytes one device sends per step, by collective kind (see the module docstring).

  Attributes:
    all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute: bytes per device.
    counts: ops of each kind executed per step (loop bodies times their trip counts).
    steps: ring steps of each kind per step (module docstring): the α terms.
    unknown_trip_counts: some loop holding a collective has no known trip count; its body was
      counted once, so the totals are a lower bound.
  """

  all_reduce: float = 0.0
  all_gather: float = 0.0
  reduce_scatter: float = 0.0
  all_to_all: float = 0.0
  collective_permute: float = 0.0
  counts: Mapping[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))
  unknown_trip_counts: bool = False
  steps: Mapping[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))

  @property
  def total(self) -> float:
    return sum(getattr(self, kind) for kind in KINDS)

  @property
  def total_steps(self) -> int:
    return sum(self.steps.values())

  def to_json(self) -> dict:
    return {**{kind: getattr(self, kind) for kind in KINDS}, 'total': self.total,
            'counts': dict(self.counts), 'steps': dict(self.steps),
            'unknown_trip_counts': self.unknown_trip_counts}


def collective_bytes(compiled_or_hlo_text: jax.stages.Compiled | str) -> CollectiveBytes:
  """Counts the collective traffic of one execution of a compiled program, per device.

  Args:
    compiled_or_hlo_text: a `jax.stages.Compiled` (its ``as_text()`` is read) or the text of an
      HLO module.

  Returns:
    Bytes per kind, op counts, ring steps, and whether a loop's trip count was unknown.

  Raises:
    ValueError: if the text defines no computation, or a shape or call cannot be read.
  """
  hlo = compiled_or_hlo_text
  if not isinstance(hlo, str):
    hlo = hlo.as_text()
  module = _Module.parse(hlo)
  tally = _Counter(module).computation(module.entry)
  return CollectiveBytes(**tally.bytes, counts=tally.counts, unknown_trip_counts=tally.unknown,
                         steps=tally.steps)


# --- Reading HLO text. -------------------------------------------------------------------------

_ELEMENT_BYTES = {
    'pred': 1, 's1': 0.125, 'u1': 0.125, 's2': 0.25, 'u2': 0.25, 's4': 0.5, 'u4': 0.5, 's8': 1, 'u8': 1, 's16': 2,
    'u16': 2, 's32': 4, 'u32': 4, 's64': 8, 'u64': 8, 'f4e2m1fn': 0.5, 'f16': 2, 'bf16': 2,
    'f32': 4, 'f64': 8, 'c64': 8, 'c128': 16, 'token': 0, 'opaque': 0,
}
_COMPUTATION = re.compile(r'^(ENTRY\s+)?%?([^\s(]+)\s*\(.*\)\s*->\s*.*\{\s*$')
_INSTRUCTION = re.compile(r'^\s+(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$')
_ARRAY = re.compile(r'\s*([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?')
_COMMENT = re.compile(r'/\*.*?\*/')
_QUOTED_ATTR = re.compile(r'\b(metadata|frontend_attributes)=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')


def _element_bytes(dtype: str) -> float:
  if dtype.startswith('f8'):
    return 1
  if dtype.startswith('f6'):
    return 0.75
  if dtype not in _ELEMENT_BYTES:
    raise ValueError(f'unknown HLO element type {dtype!r}')
  return _ELEMENT_BYTES[dtype]


def _parse_shape(s: str, i: int = 0) -> tuple[tuple[str, str] | list, int]:
  """``(shape, index after it)``: an array is ``(element type, dims text)``, a tuple a list."""
  if s.startswith('(', i):
    elements, i = [], i + 1
    while not s.startswith(')', i):
      if i >= len(s):
        raise ValueError(f'unclosed HLO tuple shape in {s[:80]!r}')
      element, i = _parse_shape(s, i)
      elements.append(element)
      while s.startswith((',', ' '), i):
        i += 1
    return elements, i + 1
  found = _ARRAY.match(s, i)
  if found is None:
    raise ValueError(f'cannot read an HLO shape at {s[i:i + 40]!r}')
  return (found.group(1), found.group(2)), found.end()


def _shape_bytes(shape: tuple[str, str] | list) -> float:
  """Bytes of a shape from `_parse_shape`; tuples sum their elements."""
  if isinstance(shape, list):
    return sum(_shape_bytes(e) for e in shape)
  dtype, dims_text = shape
  dims = [d.strip().removeprefix('<=') for d in dims_text.split(',') if d.strip()]
  if any(not d.isdigit() for d in dims):
    raise ValueError(f'cannot size the dynamic HLO shape {dtype}[{dims_text}]')
  return _element_bytes(dtype) * math.prod(int(d) for d in dims)


@dataclasses.dataclass(frozen=True)
class _Instruction:
  """One HLO instruction: its result shape (see `_parse_shape`), opcode and attribute text."""

  shape: tuple[str, str] | list
  opcode: str
  attrs: str

  @staticmethod
  def parse(rhs: str) -> _Instruction:
    rhs = _QUOTED_ATTR.sub('', _COMMENT.sub('', rhs)).strip()
    shape, end = _parse_shape(rhs)
    found = re.compile(r'\s*([\w\-]+)\(').match(rhs, end)
    if found is None:
      raise ValueError(f'cannot read an HLO opcode in {rhs[:80]!r}')
    return _Instruction(shape, found.group(1), rhs[found.end():])

  def called(self, *attributes: str) -> list[str]:
    """Names of the computations given by ``attributes`` (``body=%b``, ``calls={%a, %b}``)."""
    names = []
    for attribute in attributes:
      for found in re.finditer(rf'\b{attribute}=(\{{[^}}]*\}}|%?[^\s,}})]+)', self.attrs):
        names += [n.strip().lstrip('%') for n in found.group(1).strip('{}').split(',')
                  if n.strip()]
    return names

  def replica_group_sizes(self) -> list[int] | None:
    """Sizes of the replica groups, or None for every participant (``{}`` or no groups).

    Reads ``{{0,1},{2,3}}``, ``[2,2]<=[4]``, ``[2,2]<=[2,2]T(1,0)`` and the mesh-axes form
    ``mesh['x'=2,'y'=4] {'y'}``, also with ``device_ids=([2,4]T(1,0))`` after the mesh (a
    group spans the listed axes; a sub-axis ``'y':(1)2`` has size 2; device ids only reorder).
    """
    start = re.search(r'\breplica_groups=', self.attrs)
    if start is None:
      return None
    rest = self.attrs[start.end():]
    if (explicit := re.match(r'\{((?:\s*\{[\d,\s]*\}\s*,?)*)\s*\}', rest)) is not None:
      groups = re.findall(r'\{([^}]*)\}', explicit.group(1))
      return [len(re.findall(r'\d+', g)) for g in groups] or None
    if (iota := re.match(r'\[([\d,\s]+)\]<=\[', rest)) is not None:
      return [int(iota.group(1).split(',')[-1])]
    if re.match(r'maximal_mesh\[', rest):
      return [1]
    mesh = re.match(r"mesh\[([^\]]*)\](?:,\s*device_ids=\((?:[^()]|\([^()]*\))*\))?\s*\{([^}]*)\}",
                    rest)
    if mesh is None:
      raise ValueError(f'cannot read replica_groups={rest[:80]!r}')
    sizes = {n: int(v) for n, v in re.findall(r"'?([^',=\s]+)'?\s*=\s*(\d+)", mesh.group(1))}
    size = 1
    for name, sub in re.findall(r"'?([^',:\s]+)'?(?::\(\d+\)(\d+))?", mesh.group(2)):
      if name not in sizes:
        raise ValueError(f'replica group axis {name!r} is not in mesh[{mesh.group(1)}]')
      size *= int(sub) if sub else sizes[name]
    return [size]

  def source_target_pairs(self) -> list[tuple[int, int]]:
    found = re.search(r'\bsource_target_pairs=\{((?:\{[^}]*\}\s*,?\s*)*)\}', self.attrs)
    if found is None:
      return []
    return [(int(a), int(b)) for a, b in re.findall(r'\{\s*(\d+)\s*,\s*(\d+)\s*\}',
                                                     found.group(1))]


@dataclasses.dataclass(frozen=True)
class _Module:
  computations: dict[str, list[_Instruction]]
  entry: str
  replica_count: int
  num_partitions: int

  @staticmethod
  def parse(hlo: str) -> _Module:
    computations: dict[str, list[_Instruction]] = {}
    entry, current = None, None
    for line in hlo.splitlines():
      header = _COMPUTATION.match(line)
      if header is not None:
        current = header.group(2)
        computations[current] = []
        entry = current if header.group(1) else entry
      elif line.startswith('}'):
        current = None
      elif current is not None and (found := _INSTRUCTION.match(line)):
        computations[current].append(_Instruction.parse(found.group(2)))
    if not computations:
      raise ValueError('no HLO computation found in the text')
    if entry is None:  # a snippet without ENTRY: XLA prints the entry computation last
      entry = next(reversed(computations))

    def header_int(key: str) -> int:
      found = re.search(rf'^HloModule\b.*\b{key}=(\d+)', hlo, re.MULTILINE)
      return int(found.group(1)) if found else 1

    return _Module(computations, entry, header_int('replica_count'), header_int('num_partitions'))


# --- Counting. ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Tally:
  bytes: dict[str, float]
  counts: dict[str, int]
  steps: dict[str, int]
  unknown: bool = False

  @staticmethod
  def of(kind: str | None = None, nbytes: float = 0.0, steps: int = 0) -> _Tally:
    tally = _Tally(dict.fromkeys(KINDS, 0.0), dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0))
    if kind is not None:
      tally.bytes[kind], tally.counts[kind], tally.steps[kind] = nbytes, 1, steps
    return tally

  def plus(self, other: _Tally, times: int = 1) -> _Tally:
    return _Tally({k: v + times * other.bytes[k] for k, v in self.bytes.items()},
                  {k: v + times * other.counts[k] for k, v in self.counts.items()},
                  {k: v + times * other.steps[k] for k, v in self.steps.items()},
                  self.unknown or other.unknown)

  def flagged(self) -> _Tally:
    return dataclasses.replace(self, unknown=True)


_OPS = {
    'all-reduce': 'all_reduce', 'all-reduce-start': 'all_reduce',
    'all-gather': 'all_gather', 'all-gather-start': 'all_gather',
    'reduce-scatter': 'reduce_scatter', 'all-to-all': 'all_to_all',
    'collective-permute': 'collective_permute', 'collective-permute-start': 'collective_permute',
}
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


class _Counter:
  """Tallies of a module's computations, each computed once."""

  def __init__(self, module: _Module):
    self.module = module
    self.computation = functools.cache(self._computation)

  def _computation(self, name: str) -> _Tally:
    if name not in self.module.computations:
      raise ValueError(f'HLO calls computation {name!r}, which the text does not define')
    tally = _Tally.of()
    for op in self.module.computations[name]:
      tally = tally.plus(self._instruction(op))
    return tally

  def _instruction(self, op: _Instruction) -> _Tally:
    if op.opcode in _OPS:
      return _Tally.of(_OPS[op.opcode], *self._charge(op, _OPS[op.opcode]))
    if op.opcode == 'while':
      body = self.computation(op.called('body')[0])
      condition = self.computation(op.called('condition')[0])
      found = _TRIP_COUNT.search(op.attrs)
      if found is not None:
        trips = int(found.group(1))
        return _Tally.of().plus(body, trips).plus(condition, trips + 1)
      once = _Tally.of().plus(body).plus(condition)
      return once.flagged() if any(once.counts.values()) else once
    if op.opcode == 'conditional':
      branches = [self.computation(c) for c in op.called(
          'branch_computations', 'true_computation', 'false_computation')]
      busiest = max(branches, key=lambda b: sum(b.bytes.values()), default=_Tally.of())
      return busiest.flagged() if any(b.unknown for b in branches) else busiest
    if op.opcode in ('async-update', 'async-done'):
      return _Tally.of()
    called = op.called('calls', 'called_computations')
    if op.opcode == 'call':
      called += op.called('to_apply')
    tally = _Tally.of()
    for name in called:
      tally = tally.plus(self.computation(name))
    return tally

  def _charge(self, op: _Instruction, kind: str) -> tuple[float, int]:
    """(bytes a device sends, ring steps) of one collective op."""
    shape = op.shape
    if op.opcode == 'all-gather-start' and isinstance(shape, list):
      shape = shape[-1]
    elif op.opcode == 'collective-permute-start' and isinstance(shape, list):
      shape = shape[1]
    size = _shape_bytes(shape)
    if kind == 'collective_permute':
      moves = any(a != b for a, b in op.source_target_pairs())
      return (float(size), 1) if moves else (0.0, 0)
    n = self._group_size(op, kind)
    if n <= 1:
      return 0.0, 0
    if kind == 'all_reduce':
      return ring_bytes(size, n), ring_steps(n)
    if kind == 'reduce_scatter':  # one pass over the input, which is n times the output
      return float(ring_steps(n, 1) * size), ring_steps(n, 1)
    return ring_bytes(size, n, 1), ring_steps(n, 1)

  def _group_size(self, op: _Instruction, kind: str) -> int:
    replicas, partitions = self.module.replica_count, self.module.num_partitions
    if re.search(r'\bchannel_id=', op.attrs) is None:
      everyone, per_member = replicas, 1                         # cross-replica
    elif re.search(r'\buse_global_device_ids=true\b', op.attrs):
      everyone, per_member = replicas * partitions, 1            # flattened device ids
    elif kind == 'all_to_all':
      everyone, per_member = partitions, 1                       # cross-partition
    else:
      everyone, per_member = replicas * partitions, partitions   # cross-replica-and-partition
    sizes = op.replica_group_sizes()
    return everyone if sizes is None else max(sizes) * per_member
