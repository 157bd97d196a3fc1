r"""Communication scheduling: a parameter server with eager pull and staleness-aware rates, and
the all-reduce scheduler that overlaps the next iteration, against their synchronous baselines.

Measured part (`experiments/_comm_job.py` under `hetjax.launch`): 4 workers, one device each, on
hosts of known speed (every step padded to ``--compute_ms`` × the host's factor: ``equal``, or
``straggler`` with the last 3× slow), on emulated links where the baseline's communication is
0.5×, 1× and 2× the compute (`experiments._comm_bench.Setup`). Parameter-server jobs add one
server (``--servers 1``) and run, interleaved at each link speed: push-then-pull asp (the
baseline) and bsp, asp with the staleness-aware rate, eager pull with and without it (eager
runs twice the steps: about the baseline's wall time, `_comm_bench.EAGER_BUDGET`).
All-reduce jobs run the synchronous fused all-reduce (`hetjax.train.WorkerTrainer`, the
baseline) and the all-reduce scheduler (`hetjax.train.OverlapTrainer`), with its own estimate
and with ``estimate='int8'`` (``allreduce-overlap-int8``). Every scheme trains the
digits mlp with SGD at one learning rate (``--lr``, the best of 0.1, 0.3 and 1 for bsp).
The full run adds the two all-reduce schemes for `LONG_STEPS` steps (equal hosts, ratio 1:
scenario ``equal-long``), where the loss curve flattens. Virtual part
(`hetjax.simulation.simulate_comm`): the same schemes and link ratios on the virtual clock at 4,
64 and 1024 workers, on a noisy least-squares problem.

Rows: ``scheme``, ``scenario``, ``comm_ratio``, ``workers``, ``source`` (measured or virtual
clock), ``iter_time_s``, ``iter_time_vs_baseline``, ``iterations_to_target`` (global batches
of gradients), ``iterations_to_target_vs_baseline``, ``time_to_target_vs_baseline`` and
``time_to_target_vs_bsp`` (seconds from the first global batch applied to the one that
reaches the target: the server's clock for the parameter server, steps × the mean iteration
time for all-reduce), ``curve_s``, ``final_loss`` (mean over the last tenth of the run),
``last_loss``, ``final_loss_vs_bsp``,
``target_loss``, ``diverged``, ``baseline``; parameter-server rows add ``staleness_mean`` and
``refused``. Baselines: push-then-pull asp for the parameter server, synchronous all-reduce
for all-reduce; "bsp": ps-bsp and synchronous all-reduce.

Goals: eager pull ≥ 40% less time per iteration than push-then-pull where communication ≈
compute; with a straggler, the staleness-aware rate ≥ 25% fewer iterations to the target than
plain asp; eager pull with the staleness-aware rate reaches the synchronous target (issue 28;
`bench_eager_rate.py` asks which rate could); the all-reduce scheduler ≥ 20% faster per
iteration than synchronous all-reduce where communication ≈ compute, its final loss within 1%
of bsp's.

  .venv/bin/python -m experiments.bench_comm --quick --json runs/bench_comm.json
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

from absl import flags

from experiments import _comm_bench, _harness
from hetjax import ConfigError, runtime

FLAGS = _harness.define_flags('ratio 1 only with a straggler, fewer steps: under 5 minutes')
_FAMILIES = flags.DEFINE_list('families', ['ps', 'allreduce'], 'ps and/or allreduce')
_COMPUTE_MS = flags.DEFINE_float('compute_ms', 40.0, 'an undisturbed host\'s step time')
_LR = flags.DEFINE_float('lr', 0.3, 'SGD learning rate of every scheme')
_VIRTUAL = flags.DEFINE_bool('virtual', True, 'add the virtual-clock rows (4, 64, 1024 workers)')
_TIMEOUT = flags.DEFINE_float('timeout', 900, 'seconds before a launched job is stopped')
JOB = pathlib.Path(__file__).with_name('_comm_job.py')
LONG_STEPS = 300


def _launch(out: pathlib.Path, runs: list[dict], servers: int) -> None:
  out.mkdir(parents=True, exist_ok=True)
  (out / 'runs.json').write_text(json.dumps(runs))
  with open(out / 'workers.log', 'w') as log:
    result = runtime.launch_local([sys.executable, str(JOB), str(out)], _comm_bench.WORKERS,
                                  servers=servers, timeout=_TIMEOUT.value, init_timeout=120,
                                  stdout=log)
  if result.returncode:
    raise RuntimeError(f'{result.cause} (see {out / "workers.log"})')


def main() -> None:
  quick, start = FLAGS.quick.value, time.perf_counter()
  families = set(_FAMILIES.value)
  if not families or families - {'ps', 'allreduce'}:
    raise ConfigError(f'--families must be ps and/or allreduce, got {",".join(_FAMILIES.value)}')
  if not _COMPUTE_MS.value >= 5:
    raise ConfigError(f'--compute_ms must be at least 5, got {_COMPUTE_MS.value}')
  if not _LR.value > 0:
    raise ConfigError(f'--lr must be positive, got {_LR.value}')
  setup = _comm_bench.Setup(compute_s=_COMPUTE_MS.value / 1e3, steps=30 if quick else 60,
                            lr=_LR.value)
  plan = {'equal': (0.5, 1.0, 2.0), 'straggler': (1.0,) if quick else (0.5, 1.0, 2.0)}
  records = []
  with _harness.run_directory(FLAGS.keep.value) as root:
    for family in ('ps', 'allreduce'):
      if family not in families:
        continue
      for scenario, ratios in plan.items():
        runs = _comm_bench.runs(setup, family, scenario, ratios)
        out = root / f'{family}-{scenario}'
        _launch(out, runs, servers=1 if family == 'ps' else 0)
        records += [_comm_bench.measured(out / run['id'], run) for run in runs]
        print(f'{family} {scenario}: done at {time.perf_counter() - start:.0f} s', flush=True)
    if 'allreduce' in families and not quick:  # the scheduler's loss where the curve flattens
      long = dataclasses.replace(setup, steps=LONG_STEPS)
      runs = _comm_bench.runs(long, 'allreduce', 'equal-long', (1.0,))
      _launch(root / 'allreduce-equal-long', runs, servers=0)
      records += [_comm_bench.measured(root / 'allreduce-equal-long' / run['id'], run)
                  for run in runs]
      print(f'allreduce to a plateau: done at {time.perf_counter() - start:.0f} s', flush=True)
  if _VIRTUAL.value:
    for workers in (4, 64, 1024):
      for scenario, ratios in plan.items():
        for ratio in ratios:
          records += _comm_bench.virtual_records(setup, workers, scenario, ratio, setup.steps,
                                                 setup.lr)
    print(f'virtual clock: done at {time.perf_counter() - start:.0f} s', flush=True)
  rows = _comm_bench.compare(records)
  print(_comm_bench.table(rows))
  print('\n'.join(_comm_bench.goals(rows)))
  print(f'total {time.perf_counter() - start:.0f} s')
  _harness.finish(rows, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_comm.py', main)
