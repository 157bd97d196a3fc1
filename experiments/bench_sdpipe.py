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
locally otherwise (HetPipe-like local SGD; no parameter server). Each (round, scenario,
policy) trains from the same initial parameters for ``--budget_s`` seconds; policies alternate
within a round, their order rotating by one each round (`experiments._analysis.round_order`),
and ratios are taken within a round (side by side), then the median over rounds is reported
(`experiments._sdpipe_analysis`). Per scenario × policy:

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

Flags ``--quick``, ``--json`` and ``--keep`` and the one-line errors are the shared harness's
(`experiments._harness`).

  .venv/bin/python -m experiments.bench_sdpipe --quick --json runs/bench_sdpipe.json
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

from absl import flags

from experiments import _harness, _sdpipe_analysis
from experiments._bench_launch import launch_workers
from hetjax import ConfigError
from hetjax.replicas import RENAMED_SYNC_NAMES, parse_sync_name

WORKERS = 4
SCENARIOS = {'transient-h1': 'transient:1', 'transient-h3': 'transient:3',
             'persistent-3x': 'persistent:3:3'}
POLICIES = ('all-reduce', 'random-pairs', 'periodic-average', 'sdpipe', 'all-reduce+overlap',
            'sdpipe+overlap')
OVERLAP = '+overlap'
SCALE = (64, 1024)
VIRTUAL_STEPS = {64: 50, 1024: 20}
SMOOTH = 16
TARGET_AT = 0.6

FLAGS = _harness.define_flags('1 round of 7 s runs (about 3 minutes)')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'rounds of every scenario x policy (default 3)')
_BUDGET = flags.DEFINE_float('budget_s', None, 'seconds per run (default 10, quick 7)')
_STEP_MS = flags.DEFINE_float('step_ms', 100.0, 'a healthy replica\'s emulated step time')
_WINDOW = flags.DEFINE_float('window', 0.1, 'SDPipe\'s and random-pairs\' first wait window, in '
                             'steps')
_MAX_GROUP = flags.DEFINE_integer('max_group', 4, 'SDPipe\'s maximum group size')
_POLICIES = flags.DEFINE_list('policies', list(POLICIES), 'policies to compare (all-reduce '
                              'must be one)')


def measured_rows(info: dict, budget_s: float) -> tuple[list[dict], float]:
  """Rows per scenario × policy and the ring base of the full syncs
  (`_sdpipe_analysis.measured_rows` with this benchmark's workers, target and smoothing)."""
  return _sdpipe_analysis.measured_rows(info, budget_s, WORKERS, TARGET_AT, SMOOTH)


def virtual_rows(scenarios: dict, policies, workers: int, steps: int, step_s: float,
                 ring_base_s: float, options: dict) -> list[dict]:
  """The scenarios on the virtual clock (`simulate_sync`) with ``workers`` replicas of one
  stage (modelled, not measured): the measured run's policy options and ring base."""
  from hetjax.simulation import simulate_sync

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


def table(rows: list[dict]) -> str:
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
        policies: list[str]) -> list[dict]:
  config = {'rounds': rounds, 'scenarios': SCENARIOS, 'policies': list(policies),
            'budget_s': budget_s, 'step_s': step_s, 'window': _WINDOW.value,
            'max_group': _MAX_GROUP.value}
  runs_s = rounds * len(SCENARIOS) * len(policies) * budget_s
  info = launch_workers(root, '_sdpipe_worker', [json.dumps(config)], WORKERS,
                        timeout=300 + 3 * runs_s, devices_per_worker=2)
  rows, ring_base_s = measured_rows(info, budget_s)
  print(f'measured: {WORKERS} replicas x {info["stages"]} stages {info["stage_links"]}, '
        f'warm-up {info["warm_up_s"]:.1f} s; all-reduce of 4 takes {1.5e3 * ring_base_s:.1f} ms '
        f'(ring base {1e3 * ring_base_s:.2f} ms for the virtual clock)', flush=True)
  for n in SCALE:
    rows += virtual_rows(SCENARIOS, policies, n, VIRTUAL_STEPS[n], step_s, ring_base_s,
                         info['policy_options'])
  return rows


def main() -> None:
  quick = FLAGS.quick.value
  rounds = (1 if quick else 3) if _ROUNDS.value is None else _ROUNDS.value
  budget_s = (7.0 if quick else 10.0) if _BUDGET.value is None else _BUDGET.value
  policies = list(dict.fromkeys(_POLICIES.value))
  for p in policies:  # an old baseline name says its new one
    if p.removesuffix(OVERLAP) in RENAMED_SYNC_NAMES:
      parse_sync_name(p.removesuffix(OVERLAP))
  unknown = [p for p in policies if p not in POLICIES]
  if unknown or 'all-reduce' not in policies:
    raise ConfigError(f'--policies {",".join(policies)}: choose from {", ".join(POLICIES)}, '
                      'all-reduce among them')
  if rounds < 1 or budget_s <= 0 or _STEP_MS.value <= 0 or _WINDOW.value <= 0 \
      or not 1 <= _MAX_GROUP.value <= WORKERS:
    raise ConfigError(f'--rounds must be >= 1, --budget_s, --step_ms and --window > 0, and '
                      f'--max_group in 1..{WORKERS}')
  start = time.perf_counter()
  with _harness.run_directory(FLAGS.keep.value) as root:
    rows = run(root, rounds, budget_s, _STEP_MS.value / 1e3, policies)
  print(table(rows))
  print(f'{rounds} round(s) x {budget_s:g} s per scenario and policy, step {_STEP_MS.value:g} ms, '
        f'window {_WINDOW.value:g} steps, max group {_MAX_GROUP.value}; virtual steps '
        f'{VIRTUAL_STEPS}; {time.perf_counter() - start:.0f} s')
  _harness.finish(rows, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_sdpipe.py', main)
