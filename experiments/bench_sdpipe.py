r"""SDPipe against all-reduce, random pairs and periodic averaging, on real workers and the virtual clock.

Measured: one job of 4 local workers with 2 CPU devices each; each worker is one replica of a
2-stage pipeline (the MLP on digits) and worker 0 also runs the group scheduler
(`experiments/_sdpipe_worker.py`). Every replica is a host of known speed (`HostPause`, the
one trace grammar): its step is padded by sleep to ``--step_ms`` (× 3 on worker 3 in the
persistent scenario, ``persistent:3:3``), and SDPipe's transient injection (``transient:H``)
sleeps h step times with probability 0.1 (h = 1 or 3), drawn per (round, worker, step): every
policy of a round meets the same stragglers. The baselines are named for what they do:
``random-pairs`` averages random pairs of the replicas ready within a window (AD-PSGD-like,
but both members wait), ``periodic-average`` averages everyone every 10 steps and steps
locally otherwise (HetPipe-like local SGD; no parameter server). Each (round, scenario, policy) trains from the same initial
parameters for ``--budget_s`` seconds; policies alternate within a round, and ratios are taken
within a round (side by side), then the median over rounds is reported. Per scenario × policy:

* ``thr/AR``: completed steps (all replicas, ending within the budget) per second, over
  all-reduce's in the same round;
* ``of limit``: throughput over the no-wait limit Σᵢ vᵢ, vᵢ = 1 / replica i's mean measured
  compute + injected sleep per step (the speed if nobody waited and syncs were free);
* ``ttt/AR``: time to the target loss over all-reduce's. The loss curve pools every replica's
  training loss (on its own batch, before its update) in time order, smoothed over the last 16;
  the target is all-reduce's smoothed loss at 60% of the budget in that round; '-' if the
  policy misses it in any round (the JSON's ``time_to_target_reached`` counts the rounds it
  made);
* ``group``: mean group size from the scheduler's report;
* ``consensus``: mean ‖xᵢ − x̄‖ over the replicas and over snapshots at 20, 40, 60, 80 and 100%
  of the run (x̄ by an all-replica average after the run, not timed).

``all-reduce+overlap`` and ``sdpipe+overlap`` are those policies with
`ReplicaDriver(overlap=True)`: each replica averages one step late, the group wait and the
collective overlapped with its next step (our option, not SDPipe's), measured in the same
rounds; the virtual clock models them too (`simulate_sync(overlap=True)`).

Virtual clock (`simulate_sync`): the same policies, options and scenarios with 64 and 1024
replicas of one stage (one persistent straggler among them), step time ``--step_ms``, group
sync cost from the ring model 2(k−1)/k × base with base calibrated on the measured all-reduce
syncs (of 4: 1.5 × base); no loss model there, so no time to target.

  .venv/bin/python experiments/bench_sdpipe.py --quick --json runs/bench_sdpipe.json
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np
from absl import flags

from experiments import _cli
from experiments._bench_launch import launch_workers
from hetjax import ConfigError
from hetjax.pipeline._policies import RENAMED, parse_sync_name

WORKERS = 4
SCENARIOS = {'transient-h1': 'transient:1', 'transient-h3': 'transient:3',
             'persistent-3x': 'persistent:3:3'}
POLICIES = ('all-reduce', 'random-pairs', 'periodic-average', 'sdpipe', 'all-reduce+overlap',
            'sdpipe+overlap')
OVERLAP = '+overlap'
SCALE = (64, 1024)
SMOOTH = 16
TARGET_AT = 0.6

_QUICK = flags.DEFINE_bool('quick', False, '1 round of 7 s runs (about 3 minutes)')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'rounds of every scenario x policy (default 3)')
_BUDGET = flags.DEFINE_float('budget_s', None, 'seconds per run (default 10, quick 7)')
_STEP_MS = flags.DEFINE_float('step_ms', 100.0, 'a healthy replica\'s emulated step time')
_WINDOW = flags.DEFINE_float('window', 0.1, 'SDPipe\'s and random-pairs\' first wait window, in '
                             'steps')
_MAX_GROUP = flags.DEFINE_integer('max_group', 4, 'SDPipe\'s maximum group size')
_POLICIES = flags.DEFINE_list('policies', list(POLICIES), 'policies to compare (all-reduce '
                              'must be one)')
_JSON = flags.DEFINE_string('json', None, 'write the rows as JSON here')
_KEEP = flags.DEFINE_string('keep', None, 'keep the run directory here')


def _smoothed(replicas: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(end times, rolling mean loss over the last SMOOTH steps of any replica), time order."""
  steps = sorted((s[0], s[1]) for r in replicas for s in r['steps'])
  ends, losses = np.array([s[0] for s in steps]), np.array([s[1] for s in steps])
  kernel = np.ones(SMOOTH) / SMOOTH
  return ends[SMOOTH - 1:], np.convolve(losses, kernel, mode='valid')


def _measures(run: dict, budget_s: float) -> dict:
  steps = [np.array(r['steps']).reshape(-1, 7) for r in run['replicas']]
  done = sum(int(np.sum(s[:, 0] <= budget_s)) for s in steps)
  limit = sum(1.0 / float(np.mean(s[:, 2] + s[:, 3])) for s in steps)
  syncs = np.concatenate([s[s[:, 6] == WORKERS, 5] for s in steps])
  return {'throughput': done / budget_s, 'no_wait_limit': limit,
          'mean_group_size': run['report']['mean_group'],
          'consensus_distance': float(np.mean([r['distances'] for r in run['replicas']])),
          'full_sync_s': float(np.mean(syncs)) if syncs.size else None,
          'curve': _smoothed(run['replicas'])}


def _time_to(curve, target: float) -> float | None:
  ends, loss = curve
  hit = np.nonzero(loss <= target)[0]
  return float(ends[hit[0]]) if hit.size else None


def _measured_rows(info: dict, budget_s: float) -> tuple[list[dict], float]:
  """Rows per scenario × policy (medians over rounds) and the ring base of the full syncs."""
  by_key: dict[tuple, dict] = {}
  for run in info['runs']:
    by_key[run['round'], run['scenario'], run['policy']] = _measures(run, budget_s)
  rounds = sorted({k[0] for k in by_key})
  rows, full_syncs = [], []
  for scenario in info['config']['scenarios']:
    for policy in info['config']['policies']:
      per_round = []
      for r in rounds:
        m, ar = by_key[r, scenario, policy], by_key[r, scenario, 'all-reduce']
        ends, loss = ar['curve']
        target = float(loss[np.searchsorted(ends, TARGET_AT * budget_s) - 1])
        t_policy, t_ar = _time_to(m['curve'], target), _time_to(ar['curve'], target)
        per_round.append({
            'throughput_vs_allreduce': m['throughput'] / ar['throughput'],
            'of_no_wait_limit': m['throughput'] / m['no_wait_limit'],
            'time_to_target_vs_allreduce': None if t_policy is None else t_policy / t_ar,
            'mean_group_size': m['mean_group_size'], 'consensus_distance':
            m['consensus_distance'], 'throughput': m['throughput'],
            'no_wait_limit': m['no_wait_limit'], 'target_loss': target})
        if policy == 'all-reduce' and m['full_sync_s'] is not None:
          full_syncs.append(m['full_sync_s'])
      row = {'scenario': scenario, 'policy': policy, 'workers': WORKERS, 'source': 'measured',
             'rounds': len(rounds)}
      for key in per_round[0]:
        values = [p[key] for p in per_round]
        row[key] = (None if any(v is None for v in values)
                    else float(np.median(values)))
      row['time_to_target_reached'] = sum(p['time_to_target_vs_allreduce'] is not None
                                          for p in per_round)
      rows.append(row)
  return rows, float(np.median(full_syncs)) / (2 * (WORKERS - 1) / WORKERS)


def _virtual_rows(scenarios: dict, policies, workers: int, steps: int, step_s: float,
                  ring_base_s: float, options: dict) -> list[dict]:
  from hetjax.pipeline import simulate_sync

  rows = []
  for scenario, spec in scenarios.items():
    runs = {p: simulate_sync(p.removesuffix(OVERLAP), workers, steps, step_s, spec,
                             sync_s=ring_base_s, overlap=p.endswith(OVERLAP), **options[p])
            for p in policies}
    for p, r in runs.items():
      rows.append({'scenario': scenario, 'policy': p, 'workers': workers,
                   'source': 'virtual clock', 'rounds': 1,
                   'throughput_vs_allreduce': r.throughput / runs['all-reduce'].throughput,
                   'of_no_wait_limit': r.efficiency, 'time_to_target_vs_allreduce': None,
                   'mean_group_size': r.mean_group, 'consensus_distance': None,
                   'throughput': r.throughput, 'no_wait_limit': r.no_wait_limit})
  return rows


def _fmt(value, spec: str) -> str:
  return '-' if value is None else format(value, spec)


def _table(rows: list[dict]) -> str:
  head = (f'{"scenario":<15}{"workers":>8} {"source":<14}{"policy":<20}{"thr/AR":>7}'
          f'{"of limit":>9}{"ttt/AR":>7}{"group":>6}{"consensus":>10}')
  lines = [head, '-' * len(head)]
  for r in rows:
    lines.append(f'{r["scenario"]:<15}{r["workers"]:>8} {r["source"]:<14}{r["policy"]:<20}'
                 f'{r["throughput_vs_allreduce"]:>7.2f}{r["of_no_wait_limit"]:>9.2f}'
                 f'{_fmt(r["time_to_target_vs_allreduce"], ".2f"):>7}'
                 f'{r["mean_group_size"]:>6.2f}{_fmt(r["consensus_distance"], ".4f"):>10}')
  return '\n'.join(lines)


def run(root: pathlib.Path, rounds: int, budget_s: float, step_s: float,
        virtual_steps: dict[int, int], policies: list[str]) -> list[dict]:
  config = {'rounds': rounds, 'scenarios': SCENARIOS, 'policies': list(policies),
            'budget_s': budget_s, 'step_s': step_s, 'window': _WINDOW.value,
            'max_group': _MAX_GROUP.value}
  runs_s = rounds * len(SCENARIOS) * len(policies) * budget_s
  info = launch_workers(root, '_sdpipe_worker.py', [json.dumps(config)], WORKERS,
                        timeout=300 + 3 * runs_s, devices_per_worker=2)
  rows, ring_base_s = _measured_rows(info, budget_s)
  print(f'measured: {WORKERS} replicas x {info["stages"]} stages {info["stage_links"]}, '
        f'warm-up {info["warm_up_s"]:.1f} s; all-reduce of 4 takes {1.5e3 * ring_base_s:.1f} ms '
        f'(ring base {1e3 * ring_base_s:.2f} ms for the virtual clock)', flush=True)
  for n, steps in virtual_steps.items():
    rows += _virtual_rows(SCENARIOS, policies, n, steps, step_s, ring_base_s,
                          info['policy_options'])
  return rows


def main() -> None:
  rounds = (1 if _QUICK.value else 3) if _ROUNDS.value is None else _ROUNDS.value
  budget_s = (7.0 if _QUICK.value else 10.0) if _BUDGET.value is None else _BUDGET.value
  policies = list(dict.fromkeys(_POLICIES.value))
  for p in policies:  # an old baseline name says its new one
    if p.removesuffix(OVERLAP) in RENAMED:
      parse_sync_name(p.removesuffix(OVERLAP))
  unknown = [p for p in policies if p not in POLICIES]
  if unknown or 'all-reduce' not in policies:
    raise ConfigError(f'--policies {",".join(policies)}: choose from {", ".join(POLICIES)}, '
                      'all-reduce among them')
  if rounds < 1 or budget_s <= 0 or _STEP_MS.value <= 0 or _WINDOW.value <= 0 \
      or not 1 <= _MAX_GROUP.value <= WORKERS:
    raise ConfigError(f'--rounds must be >= 1, --budget_s, --step_ms and --window > 0, and '
                      f'--max_group in 1..{WORKERS}')
  virtual_steps = {64: 50, 1024: 20}
  start = time.perf_counter()
  step_s = _STEP_MS.value / 1e3
  try:
    if _KEEP.value:
      rows = run(pathlib.Path(_KEEP.value), rounds, budget_s, step_s, virtual_steps, policies)
    else:
      with tempfile.TemporaryDirectory() as tmp:
        rows = run(pathlib.Path(tmp), rounds, budget_s, step_s, virtual_steps, policies)
  except RuntimeError as e:
    _cli.fail('bench_sdpipe.py', str(e))
  print(_table(rows))
  print(f'{rounds} round(s) x {budget_s:g} s per scenario and policy, step {_STEP_MS.value:g} ms, '
        f'window {_WINDOW.value:g} steps, max group {_MAX_GROUP.value}; virtual steps '
        f'{virtual_steps}; {time.perf_counter() - start:.0f} s')
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(rows, indent=2) + '\n')


if __name__ == '__main__':
  _cli.run_main('bench_sdpipe.py', main)
