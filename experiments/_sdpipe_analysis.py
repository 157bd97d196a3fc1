"""`bench_sdpipe.py`'s analysis as pure functions: pooled loss curves, time to a target, a
run's measures, per-round ratios to all-reduce and their medians over rounds.

Decentralised sync has no global step, so its analysis is its own (the share policies' is
`experiments/_analysis.py`): every replica records its steps (`STEP_FIELDS`), and a run is
compared with all-reduce's run of the same round, side by side, before taking medians.
Checked on made-up runs in `tests/test_bench_analysis.py` and `tests/test_bench_sdpipe.py`.

Example::

  >>> replicas = [{'steps': [[1.0, 4.0], [3.0, 2.0]]}, {'steps': [[2.0, 3.0], [4.0, 1.0]]}]
  >>> ends, loss = pooled_loss_curve(replicas, window=2)   # pooled: losses 4, 3, 2, 1
  >>> ends.tolist(), loss.tolist()
  ([2.0, 3.0, 4.0], [3.5, 2.5, 1.5])
  >>> time_to((ends, loss), 2.5)
  3.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hetjax import ConfigError
from hetjax.core import ring_fraction

#: The columns of a replica's step record (``_sdpipe_worker.py`` writes them in this order).
STEP_FIELDS = ('end_s', 'loss', 'compute_s', 'pause_s', 'wait_s', 'sync_s', 'group_size')
_END, _LOSS, _COMPUTE, _PAUSE, _SYNC, _GROUP = 0, 1, 2, 3, 5, 6

Curve = tuple[np.ndarray, np.ndarray]


def pooled_loss_curve(replicas: Sequence[Mapping], window: int = 16) -> Curve:
  """(end times, rolling mean loss over the last ``window`` steps of any replica), time order.

  Every replica's training loss (on its own batch, before its update) is pooled in order of
  its step's end; a point exists from the ``window``-th step on. Fewer steps: empty arrays.
  """
  steps = sorted((s[_END], s[_LOSS]) for r in replicas for s in r['steps'])
  ends = np.array([s[0] for s in steps], dtype=np.float64)
  losses = np.array([s[1] for s in steps], dtype=np.float64)
  if len(steps) < window:
    return ends[:0], losses[:0]
  return ends[window - 1:], np.convolve(losses, np.ones(window) / window, mode='valid')


def time_to(curve: Curve, target: float) -> float | None:
  """The first end time at which the curve's loss is at most ``target``; None if never."""
  ends, loss = curve
  hit = np.nonzero(loss <= target)[0]
  return float(ends[hit[0]]) if hit.size else None


def loss_before(curve: Curve, t: float) -> float:
  """The curve's loss at its last point ending before ``t`` (all-reduce's target: its smoothed
  loss at a fraction of the budget).

  Example::

    >>> loss_before((np.array([1.0, 2.0, 3.0]), np.array([5.0, 4.0, 3.0])), 2.5)
    4.0

  Raises:
    ConfigError: no point ends before ``t`` (the budget is too short for the smoothing).
  """
  ends, loss = curve
  i = int(np.searchsorted(ends, t)) - 1
  if i < 0:
    raise ConfigError(f'no smoothed loss before {t:g} s: too few steps by then (raise '
                      '--budget_s or lower --step_ms)')
  return float(loss[i])


def ring_base_s(allreduce_s: float, k: int) -> float:
  """The ring model's base: an all-reduce of ``k`` takes 2(k−1)/k × base (of 4: 1.5 × base), the
  α–β model's bandwidth term (`hetjax.core.ring_fraction`) with α taken as 0.

  Example::

    >>> ring_base_s(0.003, 4)
    0.002
  """
  return allreduce_s / ring_fraction(k)


def run_measures(run: Mapping, budget_s: float, workers: int, window: int = 16) -> dict:
  """One run's raw measures, from every replica's steps, the scheduler's report and the
  distances at the snapshots.

  ``throughput``: steps (all replicas) ending within the budget, per second; ``no_wait_limit``:
  Σᵢ 1 / (replica i's mean compute + pause per step), the speed if nobody waited and syncs were
  free; ``full_sync_s``: mean sync time of the steps that averaged all ``workers`` (None if
  none did); ``consensus_distance``: the mean of the replicas' distances; ``curve``:
  `pooled_loss_curve`.
  """
  steps = [np.array(r['steps'], dtype=np.float64).reshape(-1, len(STEP_FIELDS))
           for r in run['replicas']]
  done = sum(int(np.sum(s[:, _END] <= budget_s)) for s in steps)
  limit = sum(1.0 / float(np.mean(s[:, _COMPUTE] + s[:, _PAUSE])) for s in steps)
  syncs = np.concatenate([s[s[:, _GROUP] == workers, _SYNC] for s in steps])
  return {'throughput': done / budget_s, 'no_wait_limit': limit,
          'mean_group_size': run['report']['mean_group'],
          'consensus_distance': float(np.mean([r['distances'] for r in run['replicas']])),
          'full_sync_s': float(np.mean(syncs)) if syncs.size else None,
          'curve': pooled_loss_curve(run['replicas'], window)}


def vs_allreduce(m: Mapping, ar: Mapping, target_s: float) -> dict:
  """A run's ratios to all-reduce's run of the same round (both `run_measures`).

  The target loss is all-reduce's smoothed loss before ``target_s`` (`loss_before`);
  ``time_to_target_vs_allreduce`` is None if the run never reaches it.
  """
  target = loss_before(ar['curve'], target_s)
  t_run, t_ar = time_to(m['curve'], target), time_to(ar['curve'], target)
  return {'throughput_vs_allreduce': m['throughput'] / ar['throughput'],
          'of_no_wait_limit': m['throughput'] / m['no_wait_limit'],
          'time_to_target_vs_allreduce': None if t_run is None else t_run / t_ar,
          'mean_group_size': m['mean_group_size'],
          'consensus_distance': m['consensus_distance'], 'throughput': m['throughput'],
          'no_wait_limit': m['no_wait_limit'], 'target_loss': target}


def median_over_rounds(per_round: Sequence[Mapping]) -> dict:
  """Each field's median over the rounds; None if any round's is None (a policy that missed
  the target once has no time to target).

  Example::

    >>> median_over_rounds([{'a': 1.0, 'b': 2.0}, {'a': 3.0, 'b': None}, {'a': 8.0, 'b': 1.0}])
    {'a': 3.0, 'b': None}
  """
  return {key: None if any(p[key] is None for p in per_round)
          else float(np.median([p[key] for p in per_round])) for key in per_round[0]}


def measured_rows(info: Mapping, budget_s: float, workers: int, target_at: float = 0.6,
                  window: int = 16) -> tuple[list[dict], float]:
  """Rows per scenario × policy (medians over rounds of `vs_allreduce`) and the ring base of
  all-reduce's full syncs (`ring_base_s` of their median over rounds and scenarios).

  Args:
    info: the chief's ``run.json``: ``config`` (scenarios, policies: all-reduce among them)
      and ``runs`` ({round, scenario, policy, report, replicas}).
    budget_s: seconds per run.
    workers: replicas per run.
    target_at: the target is all-reduce's loss at this fraction of the budget.
    window: steps of the loss smoothing (`pooled_loss_curve`).

  Returns:
    (rows, ring base s); a row has scenario, policy, workers, source, rounds, the medians and
    ``time_to_target_reached``: the rounds in which the policy reached the target.
  """
  by_key = {(run['round'], run['scenario'], run['policy']):
            run_measures(run, budget_s, workers, window) for run in info['runs']}
  rounds = sorted({k[0] for k in by_key})
  rows, full_syncs = [], []
  for scenario in info['config']['scenarios']:
    for policy in info['config']['policies']:
      per_round = [vs_allreduce(by_key[r, scenario, policy], by_key[r, scenario, 'all-reduce'],
                                target_at * budget_s) for r in rounds]
      if policy == 'all-reduce':
        full_syncs += [s for r in rounds
                       if (s := by_key[r, scenario, policy]['full_sync_s']) is not None]
      rows.append({'scenario': scenario, 'policy': policy, 'workers': workers,
                   'source': 'measured', 'rounds': len(rounds), **median_over_rounds(per_round),
                   'time_to_target_reached': sum(p['time_to_target_vs_allreduce'] is not None
                                                 for p in per_round)})
  return rows, ring_base_s(float(np.median(full_syncs)), workers)
