"""A sub-model's layout (tensor-parallel degree, FSDP) and the logical rules that realise it.

Every layout of a plan runs on one mesh whose axes are the prime factors of the device count,
workers' factors first: 8 local devices are ``('p0', 'p1', 'p2')`` of size 2 each; 2 workers × 4
devices are ``('p0'=2 | 'p1'=2, 'p2'=2)``. A sub-model with tensor-parallel degree t splits its
``'mlp'``/``'heads'``/``'vocab'``/``'table'`` dimensions over the *last* axes whose sizes
multiply to t (inside a worker, where links are fastest) and its batch over the others, so
different sub-models use different degrees inside one SPMD program; XLA moves the activations
where neighbouring sub-models disagree (the resharding the cost model charges for).
"""

from __future__ import annotations

import dataclasses
import math

from hetjax._errors import ConfigError
from hetjax.sharding import LogicalRules

TENSOR_AXES = ('mlp', 'heads', 'vocab', 'table')
FSDP_AXES = ('embed', 'table')


def mesh_factors(devices: int, workers: int = 1) -> tuple[int, ...]:
  """The plan mesh's axis sizes: prime factors of the worker count, then of devices per worker.

  Example: ``mesh_factors(8)`` is ``(2, 2, 2)``; ``mesh_factors(12, workers=3)`` is
  ``(3, 2, 2)``.
  """
  if devices < 1 or workers < 1 or devices % workers:
    raise ConfigError(f'{devices} devices cannot be split evenly over {workers} workers')
  return _primes(workers) + _primes(devices // workers)


def group_factors(counts: tuple[int, ...]) -> tuple[int, ...]:
  """The mesh factors of a device group whose workers hold ``counts`` devices each: workers'
  factors first when the counts are equal (`mesh_factors`), else the prime factors of the total,
  largest first (a worker's devices then need not line up with an axis; the small factors last
  give the tensor degrees the most choice).

  Example: ``group_factors((2, 2))`` is ``(2, 2)``; ``group_factors((2, 1, 1))`` is ``(2, 2)``;
  ``group_factors((4, 2))`` is ``(3, 2)``.
  """
  if not counts or any(c < 1 for c in counts):
    raise ConfigError(f'a device group needs workers with at least one device, got {counts}')
  if len(set(counts)) == 1:
    return mesh_factors(sum(counts), len(counts))
  return tuple(sorted(_primes(sum(counts)), reverse=True))


def _primes(n: int) -> tuple[int, ...]:
  out, p = [], 2
  while n > 1:
    while n % p == 0:
      out.append(p)
      n //= p
    p += 1
  return tuple(out)


def axis_names(factors: tuple[int, ...]) -> tuple[str, ...]:
  return tuple(f'p{i}' for i in range(len(factors)))


def tensor_degrees(factors: tuple[int, ...]) -> tuple[int, ...]:
  """The tensor-parallel degrees a layout can have: products of a suffix of ``factors``."""
  return tuple(math.prod(factors[len(factors) - k:]) for k in range(len(factors) + 1))


@dataclasses.dataclass(frozen=True, order=True)
class Layout:
  """How one sub-model is split over the plan's devices.

  Attributes:
    tensor: tensor-parallel degree t (1 = none): ``'mlp'``, ``'heads'``, ``'vocab'`` and
      ``'table'`` dimensions split t ways, the batch split devices / t ways. With t = devices
      an embedding table is fully row-sharded; with t = 1 it is replicated.
    fsdp: also split ``'embed'`` (and an unsplit ``'table'``) over the data-parallel axes;
      parameters are gathered for compute and gradients reduce-scattered.
  """

  tensor: int = 1
  fsdp: bool = False

  def name(self, devices: int) -> str:
    """``'dp8'``, ``'dp2×tp4'``, ``'tp8'``, with ``'+fsdp'`` when sharded."""
    data = devices // self.tensor
    parts = ([f'dp{data}'] if data > 1 or self.tensor == 1 else []) + (
        [f'tp{self.tensor}'] if self.tensor > 1 else [])
    return '×'.join(parts) + ('+fsdp' if self.fsdp else '')

  def split_axes(self, factors: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(data-parallel mesh axes, tensor-parallel mesh axes) of this layout on ``factors``."""
    names = axis_names(factors)
    for k in range(len(factors) + 1):
      if math.prod(factors[len(factors) - k:]) == self.tensor:
        return names[:len(factors) - k], names[len(factors) - k:]
    raise ConfigError(f'tensor-parallel degree {self.tensor} is not one of '
                      f'{tensor_degrees(factors)} (products of the mesh factors {factors})')

  def params_rules(self, factors: tuple[int, ...]) -> LogicalRules:
    data, model = self.split_axes(factors)
    rules = [(name, model) for name in TENSOR_AXES if model]
    if self.fsdp and data:
      rules += [(name, data) for name in FSDP_AXES]
    return LogicalRules(tuple(rules))

  def compute_rules(self, factors: tuple[int, ...]) -> LogicalRules:
    data, model = self.split_axes(factors)
    rules = [('batch', data)] if data else []
    return LogicalRules(tuple(rules + [(name, model) for name in TENSOR_AXES if model]))
