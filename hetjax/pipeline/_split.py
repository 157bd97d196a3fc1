"""`split_stages`: cut a chain of sub-models into pipeline stages of the least bottleneck.

A pipeline runs at the pace of its slowest stage, so the split minimises the largest stage's
total cost. Many splits often share that optimum (always, when costs are equal); among them it
takes the most even one (the least sum of squared stage costs), then the one whose cuts come
earliest. Earlier stages hold more micro-batches' activations under 1F1B, so a tie leaves them
the smaller share. Costs are compared exactly (as the binary fractions the floats are), so the
answer does not depend on rounding. `tests/test_pipeline_schedule.py` checks it against brute
force over all cut positions. `hetjax.planner.profile_split` splits on the planner's measured
costs (the planner uses the pipeline, never the other way round).
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence

from hetjax._checks import positive_int
from hetjax._errors import ConfigError


def split_stages(costs: Sequence[float], stages: int) -> tuple[tuple[int, int], ...]:
  """Contiguous, non-empty ranges of sub-models, one per stage, of the least bottleneck.

  Args:
    costs: cost of each sub-model in forward order (e.g. seconds of its forward and backward),
      each positive and finite.
    stages: number of stages, 1 … len(costs).

  Returns:
    ``stages`` ranges ``(start, stop)`` that cover ``range(len(costs))`` in order: stage k runs
    sub-models ``start … stop − 1``. Exact: no split has a smaller largest stage cost; among
    those that tie, the one with the least sum of squared stage costs, then the earliest cuts.
    Takes O(stages · n²) time for n sub-models.

  Example::

    >>> split_stages([5, 1, 1, 1, 1, 1], 2)
    ((0, 1), (1, 6))
    >>> split_stages([1, 1, 1, 1, 1, 1, 1], 3)
    ((0, 2), (2, 4), (4, 7))
  """
  stages = positive_int(stages, 'stages')
  weights = _exact_weights(costs)
  n = len(weights)
  if stages > n:
    raise ConfigError(f'cannot split {n} sub-models into {stages} stages')
  prefix = list(itertools.accumulate(weights, initial=0))
  bound = _least_bottleneck(prefix, stages)
  cuts = _most_even(prefix, stages, bound)
  edges = (0, *cuts, n)
  return tuple(itertools.pairwise(edges))


def _exact_weights(costs: Sequence[float]) -> list[int]:
  """The costs as ints in one common scale (floats are binary fractions), so that sums and
  squares are exact; `ConfigError` for an empty chain or a cost that is not positive and finite."""
  costs = list(costs)
  if not costs:
    raise ConfigError('cannot split an empty chain of sub-model costs into stages')
  ratios = []
  for i, cost in enumerate(costs):
    if isinstance(cost, bool) or not isinstance(cost, numbers.Real):
      raise ConfigError(f'sub-model cost {i} must be a number, got {cost!r}')
    if not 0 < cost < math.inf:
      raise ConfigError(f'sub-model cost {i} is {cost!r}; costs must be positive and finite')
    ratios.append(float(cost).as_integer_ratio())  # denominators are powers of two
  scale = max(den for _, den in ratios)
  return [num * (scale // den) for num, den in ratios]


def _least_bottleneck(prefix: list[int], stages: int) -> int:
  """The least largest stage sum over all splits of the chain into ``stages`` ranges.

  ``best[i]`` is the least bottleneck of the first i sub-models in the current number of stages.
  """
  n = len(prefix) - 1
  best: list[int | None] = list(prefix)
  for j in range(2, stages + 1):
    new: list[int | None] = [None] * (n + 1)
    for i in range(j, n - (stages - j) + 1):
      new[i] = min(max(best[p], prefix[i] - prefix[p]) for p in range(j - 1, i))
    best = new
  return best[n]


def _most_even(prefix: list[int], stages: int, bound: int) -> tuple[int, ...]:
  """The cuts of the split with no stage above ``bound`` and the least sum of squared stage sums,
  ties to the lexicographically smallest cuts.

  ``table[i]`` is the best (sum of squares, cuts) of the first i sub-models in the current number
  of stages; sums are exact ints, so comparing a prefix's pair orders its extensions the same way.
  """
  n = len(prefix) - 1
  last = n - (stages - 1)  # the first stage must leave a sub-model for each later one
  table = {i: (prefix[i] ** 2, ()) for i in range(1, last + 1) if prefix[i] <= bound}
  for j in range(2, stages + 1):
    new: dict[int, tuple[int, tuple[int, ...]]] = {}
    for i in range(j, n - (stages - j) + 1):
      options = [(squares + (prefix[i] - prefix[p]) ** 2, (*cuts, p))
                 for p, (squares, cuts) in table.items()
                 if p < i and prefix[i] - prefix[p] <= bound]
      if options:
        new[i] = min(options)
    table = new
  return table[n][1]
