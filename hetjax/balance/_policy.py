"""`BalancePolicy`: what chooses next step's shares, and the helpers every policy shares.

A balance policy is a `hetjax.core.Policy` whose decision is `Shares`: ``init()`` gives a fresh
state, ``update(state, stats)`` learns from one finished step and returns the shares of the
next one. Real runs and the virtual clock feed it the same `StepStats`, so a policy cannot tell
which one feeds it. What a policy measures is speed, vᵢ = xᵢ / tᵢ (rows per second of busy
time), and what it hands back is a split of the global batch that makes the predicted slowest
worker finish as early as possible: ``rules.from_weights(speeds)`` (proportional, with leftover
buckets rounded for the makespan).

Example::

  >>> rules = ShareRules(global_batch=4096, workers=4, bucket=64)
  >>> shares = rules.from_weights([1, 1, 1, 1 / 3])
  >>> shares.values  # a 3x straggler gets 6 buckets: 7 would make it the slowest (7 × 3 > 20)
  (1280, 1216, 1216, 384)
  >>> makespan(shares, np.array([1, 1, 1, 1 / 3]))  # worker 0's 1280 rows at speed 1
  1280.0
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hetjax._errors import ConfigError
from hetjax.core import Policy, ShareRules, Shares, StepStats

logger = logging.getLogger('hetjax.balance')


@runtime_checkable
class BalancePolicy(Policy[Shares], Protocol):
  """A `hetjax.core.Policy` deciding each step's `Shares`.

  ``init()`` is a fresh state (its shares are the first step's, usually uniform);
  ``update(state, None)`` returns the shares in force without learning; ``update(state,
  stats)`` learns from the finished step ``stats`` and returns the next step's shares.
  """

  @property
  def name(self) -> str: ...

  def init(self) -> Any: ...

  def update(self, state: Any, stats: StepStats | None) -> tuple[Shares, Any]: ...


def observed_speeds(stats: StepStats, previous: np.ndarray | None) -> np.ndarray:
  """Rows per second of each worker at one step, keeping ``previous[i]`` where it is unknowable.

  A compute time that is zero, negative, NaN or inf (a lost or corrupt measurement), a share
  of 0 (nothing was measured), or a step marked as not a sample (`StepStats.sampled`) says
  nothing about a worker's speed. Raising would stop training
  for one bad clock reading, so the worker keeps its previous speed and one warning names it.
  With no previous estimate the median of the good workers stands in (1.0 if none is good).

  Example::

    >>> stats = StepStats(3, rows=(100, 100), compute_s=(0.1, float('nan')), iter_s=0.1)
    >>> observed_speeds(stats, np.array([900.0, 500.0]))  # logs: worker 1 at step 3
    array([1000.,  500.])

  Args:
    stats: one finished step.
    previous: the last speeds (one per worker), or None before any.

  Returns:
    float64[workers], every entry finite and > 0.
  """
  rows = np.asarray(stats.rows, dtype=np.float64)
  compute = np.asarray(stats.compute_s, dtype=np.float64)
  with np.errstate(divide='ignore', invalid='ignore'):
    speeds = rows / compute
  valid = np.isfinite(compute) & (compute > 0) & np.isfinite(speeds) & (speeds > 0)
  sampled = np.asarray(stats.sampled, dtype=bool) if stats.sampled else np.ones(len(speeds), bool)
  good = valid & (rows > 0) & sampled
  if good.all():
    return speeds
  if previous is not None and len(previous) == len(speeds):
    fill = np.asarray(previous, dtype=np.float64)
  else:
    fill = np.full(len(speeds), float(np.median(speeds[good])) if good.any() else 1.0)
  bad = np.flatnonzero(~good & sampled)
  if not len(bad):  # only steps marked as not samples: nothing to report
    return np.where(good, speeds, fill)
  shown = ', '.join(str(i) for i in bad[:8]) + (', …' if len(bad) > 8 else '')
  logger.warning('step %d: no usable compute time for worker(s) %s (got %s); keeping their '
                 'previous speed', stats.step, shown, [stats.compute_s[i] for i in bad[:8]])
  return np.where(good, speeds, fill)


def makespan(shares: Sequence[int], speeds: np.ndarray, transfer_s: Sequence[float] = ()) -> float:
  """The slowest worker's predicted time, max xᵢ / vᵢ + tᵢ: what a BSP step waits for, with
  ``transfer_s`` each worker's own transfer tᵢ (empty: compute only)."""
  time = np.asarray(shares, dtype=np.float64) / speeds
  return float(np.max(time + np.asarray(transfer_s, dtype=np.float64) if len(transfer_s) else time))


def transfer_of(transfer_s: Sequence[float], workers: int) -> tuple[float, ...]:
  """Per-worker transfer seconds a policy prices (``LBBSP.transfer_s``), checked: empty (compute
  only) or ``workers`` finite values >= 0.

  Raises:
    ConfigError: one line, e.g. 3 transfers for 4 workers.
  """
  values = tuple(float(t) for t in transfer_s)
  if values and (len(values) != workers or not all(np.isfinite(values)) or min(values) < 0):
    raise ConfigError(f'transfer_s {values} must be one finite value >= 0 per worker '
                      f'({workers}), or none')
  return values


def load_of(stats: StepStats) -> np.ndarray | None:
  """The step's exogenous load as an array, or None when the run did not record one."""
  return np.asarray(stats.load, dtype=np.float64) if len(stats.load) else None


def shares_array(shares: Sequence[int]) -> np.ndarray:
  """Shares as the int64[workers] array a policy state keeps."""
  return np.asarray(tuple(shares), dtype=np.int64)


def shares_of(values: np.ndarray, rules: ShareRules) -> Shares:
  """The `Shares` a state's int64[workers] array holds (checked against ``rules``)."""
  return Shares(tuple(int(v) for v in values), rules)
