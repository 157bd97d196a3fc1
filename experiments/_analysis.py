"""The benchmarks' analysis as pure functions: settling, reversals, limits, tiling, ranks, blocks.

Every number a benchmark table prints past the raw telemetry comes from here, so each can be
checked by hand on made-up inputs (`tests/test_bench_analysis.py`) without launching a worker.

Example::

  >>> settle(np.array([[4, 4], [6, 2], [6, 2], [6, 2], [6, 2]]), bucket=1)
  (1, 0)
  >>> round(rank_correlation([1, 2, 2, 3], [10, 20, 30, 40]), 6)  # ties: average ranks
  0.948683
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from hetjax import ConfigError, emulation, simulation


def settle(shares: np.ndarray, bucket: int, after: int = 0,
           tail: int = 3) -> tuple[int | None, int]:
  """(steps from ``after`` until the shares stop moving by more than a bucket, reversals after).

  A move is a step-to-step change of any worker's share by more than ``bucket`` rows. The
  shares have settled at the step after the last move at or after ``after``; a move within the
  last ``tail`` changes means they never settled (``None``: still moving when the run ended),
  and so does an ``after`` past the run. Reversals are counted from the settled step on
  (`reversals`): wobbles of one bucket that the settling rule lets pass.

  Args:
    shares: int[steps, workers], the shares of each step.
    bucket: rows of one bucket.
    after: the step from which to look (e.g. when a step-change trace changes).
    tail: how many of the last changes must be still.
  """
  shares = np.asarray(shares)
  if after >= len(shares):
    return None, 0
  moves = np.abs(np.diff(shares, axis=0)).max(axis=1, initial=0) > bucket  # moves[t]: t → t+1
  moving = np.nonzero(moves[after:])[0] + after
  if moving.size and moving[-1] >= len(moves) - tail:
    return None, 0
  settled = int(moving[-1]) + 1 if moving.size else after
  return settled - after, reversals(shares[settled:])


def reversals(shares: np.ndarray) -> int:
  """Direction reversals of the shares: per worker, how often a move goes the other way from
  that worker's previous move (steps without a move in between do not break a reversal).

  Example::

    >>> reversals(np.array([[2, 2], [3, 1], [3, 1], [2, 2], [3, 1]]))   # up, hold, down, up
    4
  """
  shares = np.asarray(shares)
  count = 0
  for column in np.diff(shares, axis=0).T if len(shares) > 1 else ():
    signs = np.sign(column[column != 0])
    count += int((signs[1:] != signs[:-1]).sum())
  return count


def balanced_time_s(global_batch: int, slowdown: Sequence[float], row_s: float | Sequence[float],
                    fixed_s: float = 0.0, transfer_s: Sequence[float] = ()) -> float:
  """The balanced iteration time without sync: the T at which each worker, given the rows it
  finishes by T at ``slowdown × (fixed_s + rows × row_s)``, covers the global batch together.

  Fixed costs count: a worker slowed by f pays f × fixed_s before its first row, so the limit
  is not X / Σ vᵢ (which ignores them) but (X + fixed_s Σ 1/row_sⱼ) / Σ 1/(fⱼ row_sⱼ) over the
  workers fast enough to take rows (`hetjax.simulation.ClockCosts.balanced_limit_s`). With
  ``transfer_s`` (each worker's own transfer) every worker's compute plus transfer is T.

  Example::

    >>> balanced_time_s(400, [1, 1, 1, 3], 1e-3, fixed_s=0.03)   # (0.4 + 0.12) / (3 + 1/3)
    0.156
  """
  costs = simulation.ClockCosts(per_sample_s=row_s if np.ndim(row_s) == 0 else tuple(row_s),
                                fixed_s=fixed_s, transfer_s=tuple(transfer_s))
  return costs.balanced_limit_s(global_batch, np.asarray(slowdown, dtype=np.float64))


def effective_slowdown(busy_s: np.ndarray, share: np.ndarray, row_s: float,
                       fixed_s: float) -> np.ndarray:
  """What a host of known cost was slowed by, measured: busy / (fixed_s + share × row_s).

  On a host of known speed that held (no overrun) this is the trace's factor plus delay; an
  overrun shows as more.
  """
  return np.asarray(busy_s) / (fixed_s + np.asarray(share) * row_s)


def tile_trace(trace: emulation.SlowdownTrace, workers: int) -> emulation.SlowdownTrace:
  """``trace``'s pattern repeated over ``workers`` (a multiple of its workers): static and
  step-change factors tiled, Markov and transient traces with a chain or draws of their own for
  every worker (slow workers' ids tiled), products tiled part by part.

  Example::

    >>> tile_trace(emulation.StaticTrace((1, 3)), 4).factors(0)
    array([1., 3., 1., 3.])

  Raises:
    ConfigError: ``workers`` is not a multiple, or the trace cannot be tiled (csv).
  """
  n = trace.workers
  if workers < n or workers % n:
    raise ConfigError(f'cannot tile {trace.describe()!r} ({n} workers) over {workers} workers')
  k = workers // n
  if isinstance(trace, emulation.StaticTrace):
    return emulation.StaticTrace(tuple(trace.values) * k)
  if isinstance(trace, emulation.StepChangeTrace):
    return emulation.StepChangeTrace(trace.at, tuple(trace.before) * k, tuple(trace.after) * k)
  if isinstance(trace, emulation.MarkovTrace):
    ids = None if trace.slow_workers is None else tuple(
        w + n * i for i in range(k) for w in trace.slow_workers)
    return dataclasses.replace(trace, workers=workers, slow_workers=ids)
  if isinstance(trace, emulation.TransientTrace):
    return dataclasses.replace(trace, workers=workers)
  if isinstance(trace, emulation.ComposedTrace):
    return emulation.ComposedTrace(tuple(tile_trace(p, workers) for p in trace.parts))
  raise ConfigError(f'cannot tile {trace.describe()!r}: not a static, step, markov, transient '
                    'or composed trace')


def average_ranks(values: Sequence[float]) -> np.ndarray:
  """Ranks 1…n, ties sharing the mean of the ranks they span: [10, 20, 20, 30] → [1, 2.5, 2.5, 4]."""
  values = np.asarray(values, dtype=np.float64)
  order = np.argsort(values, kind='stable')
  ranks = np.empty(len(values))
  i = 0
  while i < len(values):
    j = i
    while j + 1 < len(values) and values[order[j + 1]] == values[order[i]]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2 + 1
    i = j + 1
  return ranks


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float:
  """Spearman's rho: Pearson's correlation of the average ranks (`average_ranks`); NaN with
  fewer than 2 values or when either side is all ties."""
  if len(a) != len(b):
    raise ConfigError(f'rank correlation of {len(a)} against {len(b)} values')
  ra, rb = average_ranks(a), average_ranks(b)
  if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
    return float('nan')
  return float(np.corrcoef(ra, rb)[0, 1])


def merge_duplicates(rows: Iterable[Mapping], key: Callable[[Mapping], Hashable],
                     mean_of: Sequence[str]) -> list[dict]:
  """Rows of the same program (same ``key``) as one: the first row, ``mean_of`` fields averaged
  over the copies, ``copies`` their count. Two plans compiling to one program are one point of
  a correlation, not two."""
  groups: dict[Hashable, list[Mapping]] = {}
  for row in rows:
    groups.setdefault(key(row), []).append(row)
  return [dict(group[0], copies=len(group),
               **{f: float(np.mean([r[f] for r in group])) for f in mean_of})
          for group in groups.values()]


def layouts_key(row: Mapping) -> str:
  """A plan row's program identity: its model and every sub-model's layout."""
  return json.dumps([row['model'], row['layouts']], sort_keys=True)


def rank_correlation_of_programs(rows: Sequence[Mapping], x: str, y: str,
                                 key: Callable[[Mapping], Hashable] = layouts_key
                                 ) -> tuple[float, int]:
  """(Spearman's rho of fields ``x`` and ``y``, n) over distinct programs (`merge_duplicates`)."""
  distinct = merge_duplicates(rows, key, (x, y))
  return rank_correlation([r[x] for r in distinct], [r[y] for r in distinct]), len(distinct)


def block_rows(schedule: Sequence[Mapping], steps: Sequence[int], name: str, key: str = 'policy',
               skip: int = 0, after_step: int = 0) -> np.ndarray:
  """Telemetry row indices of the steps of ``name``'s blocks, in order.

  Args:
    schedule: blocks ``{key: name, 'first_step': s, 'last_step': e}`` (``schedule.json``).
    steps: the global step of each telemetry row (`hetjax.report.Telemetry.steps`).
    name: whose blocks.
    key: the schedule field naming them ('policy', 'scenario').
    skip: steps left out at the start of every block (the first after a switch).
    after_step: global steps up to this one left out (compile steps).

  Raises:
    ConfigError: a block's step is missing from the telemetry.
  """
  index = {s: i for i, s in enumerate(steps)}
  wanted = [s for b in schedule if b[key] == name
            for s in range(b['first_step'] + skip, b['last_step'] + 1) if s > after_step]
  missing = [s for s in wanted if s not in index]
  if missing:
    raise ConfigError(f'{name}: steps {missing[:3]} of its blocks are not in the telemetry')
  return np.array([index[s] for s in wanted], dtype=np.int64)


def round_order(names: Sequence[str], round_index: int, rotate: bool = True) -> list[str]:
  """The order of one interleaved round: rotated by one each round (so no name always runs
  after the same other), or fixed."""
  k = round_index % len(names) if rotate and names else 0
  return list(names[k:]) + list(names[:k])


def two_point_cost(rows_a: float, seconds_a: float, rows_b: float,
                   seconds_b: float) -> tuple[float, float]:
  """(per-row s, fixed s) of the line through two (rows, seconds) points; the slope is kept at
  least 1e-3 of the larger point's seconds per row and the intercept at least 0."""
  (small_rows, small_s), (big_rows, big_s) = sorted([(rows_a, seconds_a), (rows_b, seconds_b)])
  if big_rows == small_rows:
    raise ConfigError(f'two calls of {big_rows} rows cannot separate per-row and fixed cost')
  per_row = max((big_s - small_s) / (big_rows - small_rows), 1e-3 * big_s / big_rows)
  return per_row, max(small_s - per_row * small_rows, 0.0)


def with_speedups(rows: list[dict], time_key: str = 'iter_s', ideal: bool = False) -> list[dict]:
  """Each row with ``speedup_vs_uniform`` (the uniform row's time over its own) and, if
  ``ideal``, ``ratio_to_limit`` (time / ``limit_s``) and ``fraction_of_ideal_speedup`` (the
  speedup over the ideal one, uniform / limit: that is limit / time, 1.0 is perfect balance).

  Example::

    >>> rows = [{'policy': 'uniform', 'iter_s': 0.4, 'limit_s': 0.2},
    ...         {'policy': 'lbbsp', 'iter_s': 0.25, 'limit_s': 0.2}]
    >>> [r['speedup_vs_uniform'] for r in with_speedups(rows)]
    [1.0, 1.6]
  """
  uniform = next(r[time_key] for r in rows if r['policy'] == 'uniform')
  out = []
  for r in rows:
    r = r | {'speedup_vs_uniform': uniform / r[time_key]}
    if ideal:
      r |= {'ratio_to_limit': r[time_key] / r['limit_s'],
            'fraction_of_ideal_speedup': r['limit_s'] / r[time_key]}
    out.append(r)
  return out
