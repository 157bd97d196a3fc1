"""`BalancePolicy`: what chooses next step's shares, and the helpers every policy shares.

A policy is asked for step t's shares with the `StepStats` of steps 0 … t−1. Real runs and the
virtual clock call it the same way, so a policy cannot tell which one feeds it. What a policy
measures is speed, vᵢ = xᵢ / tᵢ (rows per second of busy time), and what it hands back is a split
of the global batch that makes the predicted slowest worker finish as early as possible:
``rules.from_weights(speeds)`` (proportional, with leftover buckets rounded for the makespan).

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
from typing import Protocol, runtime_checkable

import numpy as np

from hetjax.balance._shares import Shares
from hetjax.runtime._virtual_clock import StepStats

logger = logging.getLogger('hetjax.balance')


@runtime_checkable
class BalancePolicy(Protocol):
  """Chooses step ``step``'s `Shares` from the finished steps (``history[k]`` is step k).

  Policies may keep state between calls (predictors), but each call gets the whole history, so
  a policy must hand each finished step to its state once (see `HistoryCursor`).
  """

  @property
  def name(self) -> str: ...

  def shares(self, step: int, history: Sequence[StepStats]) -> Shares: ...


def observed_speeds(stats: StepStats, previous: np.ndarray | None) -> np.ndarray:
  """Rows per second of each worker at one step, keeping ``previous[i]`` where it is unknowable.

  A compute time that is zero, negative, NaN or inf (a lost or corrupt measurement), a share
  of 0 (nothing was measured), or a step marked as not a sample (`StepStats.sampled`) says
  nothing about a worker's speed. Raising would stop training
  for one bad clock reading, so the worker keeps its previous speed and one warning names it.
  With no previous estimate the median of the good workers stands in (1.0 if none is good).

  Example::

    >>> stats = StepStats(3, (100, 100), (0.1, float('nan')), 0.0, 0.1)
    >>> observed_speeds(stats, np.array([900.0, 500.0]))  # logs: worker 1 at step 3
    array([1000.,  500.])

  Args:
    stats: one finished step.
    previous: the last speeds (one per worker), or None before any.

  Returns:
    float64[workers], every entry finite and > 0.
  """
  shares = np.asarray(stats.shares, dtype=np.float64)
  compute = np.asarray(stats.compute_s, dtype=np.float64)
  with np.errstate(divide='ignore', invalid='ignore'):
    speeds = shares / compute
  valid = np.isfinite(compute) & (compute > 0) & np.isfinite(speeds) & (speeds > 0)
  sampled = np.asarray(stats.sampled, dtype=bool) if stats.sampled else np.ones(len(speeds), bool)
  good = valid & (shares > 0) & sampled
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


def makespan(shares: Sequence[int], speeds: np.ndarray) -> float:
  """The slowest worker's predicted compute time, max xᵢ / vᵢ: what a BSP step waits for."""
  return float(np.max(np.asarray(shares, dtype=np.float64) / speeds))


class HistoryCursor:
  """Hands a policy each finished step once, as speeds, though every call passes the history.

  Example::

    cursor = HistoryCursor()
    restarted, new = cursor.advance(history)  # [(StepStats, speeds), …] since the last call

  A history shorter than the one seen before is a new run: ``restarted`` is True and the
  cursor starts over, so a policy can reset its predictor.
  """

  def __init__(self):
    self._seen = 0
    self.speeds: np.ndarray | None = None

  def advance(self, history: Sequence[StepStats]
              ) -> tuple[bool, list[tuple[StepStats, np.ndarray]]]:
    restarted = len(history) < self._seen
    if restarted:
      self._seen, self.speeds = 0, None
    new = []
    for stats in history[self._seen:]:
      self.speeds = observed_speeds(stats, self.speeds)
      new.append((stats, self.speeds))
    self._seen = len(history)
    return restarted, new


def load_of(stats: StepStats) -> np.ndarray | None:
  """The step's exogenous load as an array, or None when the run did not record one."""
  return np.asarray(stats.load, dtype=np.float64) if len(stats.load) else None
