r"""Eager pull's learning rate: which rate reaches the synchronous target, in iterations and in
time, over several data orders, on the virtual clock.

Eager pull computes each gradient on parameters one own step staler than push-then-pull (τ ≈ 7
instead of 3 with 4 workers). This script runs bench_comm's setting (4 workers, digits mlp,
SGD at η = 0.3, links where communication = compute, equal hosts or a 3× straggler) on
`hetjax.simulation.simulate_comm` with the mlp as a `hetjax.simulation.TaskProblem`, for
``--seeds`` data orders: ps-bsp's run of 60 global batches sets the target (as bench_comm's),
and eager pull runs 120 with η / max(1, τ) and with constant rates c η / n per push
(`experiments/_eager_rate.py`). Per rule: the median iterations to the target, how many seeds
reach it within bsp's 60, and the median time to it against bsp's. Times are the virtual
clock's (modelled); the measured counterpart is `bench_comm.py`'s ps-eager-stale-lr rows.

Goal (issue 28, item 5): eager pull with a staleness rule that reaches the synchronous target.

  .venv/bin/python -m experiments.bench_eager_rate --quick --json runs/eager_rate.json
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

from absl import flags

from experiments import _eager_rate, _harness

FLAGS = _harness.define_flags('2 seeds, rates 0.6 and 1 only: about a minute', keep=False)
_SEEDS = flags.DEFINE_integer('seeds', 8, 'data orders per rule (full run)', lower_bound=1)


def main() -> None:
  quick = FLAGS.quick.value
  rates = (0.6, 1.0) if quick else _eager_rate.RATES
  rows = [r for scenario in _eager_rate.COMPUTE
          for seed in range(2 if quick else _SEEDS.value)
          for r in _eager_rate.seed_rows(scenario, seed, rates)]
  summaries = _eager_rate.summary(rows)
  print(_eager_rate.table(summaries))
  print('iterations: global batches of gradients; times: the virtual clock\'s; the target: '
        'bsp\'s trailing loss at 2/3 of its 60 global batches')
  _harness.finish({'summary': summaries, 'seeds': rows}, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_eager_rate.py', main)
