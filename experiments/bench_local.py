r"""Training over slow links: local SGD (DiLoCo) and its heterogeneity-aware rounds against BSP,
LB-BSP and the all-reduce scheduler, in time to the synchronous run's loss.

Measured (`experiments._local_bench`): the gpt config (at 2 layers of d_model 64, sequence 64:
`_local_bench.MODEL_ARGS`) on 4 launched workers of one CPU device each, trained by the
training CLI (mode shares) on hosts of known speed, ``equal`` or ``slow`` (the last 3× slow),
an undisturbed host's step padded to ``--compute_ms``. Links are emulated where one ring
all-reduce of the model costs 1×, 4× and 16× that step. Methods: ``bsp`` (uniform shares, one
all-reduce a step), ``lbbsp`` (shares from predicted speeds), ``allreduce-overlap`` (the
all-reduce scheduler), ``diloco`` (local SGD: ``--inner_steps`` steps alone, then the outer
step, uniform shares), ``diloco-int8`` (its exchange in 8 bits), ``diloco-stream`` (its exchange
in 4 fragments on a background thread, landing a quarter of a round later) and ``diloco-hetero``
(LB-BSP's shares held a round, ``--cutoff``).

Each method's curve (evaluation every 20 steps) comes from one run without emulated links
(what a method computes does not depend on them; on the slow hosts only ``diloco-hetero``
computes differently, so it has a curve there too); its step time at each (hosts, ratio) from
``--repeats`` runs on the emulated links (`_local_bench.Setup.steps_timed`), interleaved. Time to target =
the curve's steps to BSP's final evaluation loss × the mean step time: both measured, in
separate runs. Rows: hosts, ratio, method, step_s (and each repeat's), steps_to_target,
time_to_target_s, vs_bsp, vs_diloco, final_eval_loss, final_vs_bsp, bytes_per_worker_step
(the exchange's size, not a measurement). Virtual clock (`simulate_local`, modelled): the
same methods but the all-reduce scheduler at 64 and 1024 workers, one 3× slow, each step's
modelled seconds over BSP's.

Goals (issue 43): local SGD ≤ 0.5× BSP's time at ratio 4 and ≤ 0.25× at 16; the
heterogeneity-aware rounds ≤ 0.8× fixed-H DiLoCo's with the slow host; final evaluation loss
within 1% of BSP's.

  .venv/bin/python -m experiments.bench_local --quick --json runs/bench_local.json
"""

from __future__ import annotations

import pathlib
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

from absl import flags

from experiments import _harness
from experiments import _local_bench as lb

FLAGS = _harness.define_flags('the slow hosts only, ratios 4 and 16, one repeat, 200 BSP steps: '
                              'about 12 minutes')
_COMPUTE_MS = flags.DEFINE_float('compute_ms', 80.0, "an undisturbed host's step")
_REPEATS = flags.DEFINE_integer('repeats', 3, 'step-time runs of each (hosts, ratio, method)')
_INNER = flags.DEFINE_integer('inner_steps', 20, "local SGD's H")
_OUTER = flags.DEFINE_enum('outer', 'sgd', ['sgd', 'nesterov'], "local SGD's outer optimizer")
_OUTER_LR = flags.DEFINE_float('outer_lr', 1.0, 'its learning rate')
_OUTER_MOMENTUM = flags.DEFINE_float('outer_momentum', 0.9, "nesterov's momentum")
_CUTOFF = flags.DEFINE_float('cutoff', 1.5, "the heterogeneity-aware rounds' cutoff")
_TIMEOUT = flags.DEFINE_float('timeout_s', 900.0, 'each launched run')
_REUSE = flags.DEFINE_bool('reuse', False, 'with --keep: do not run again the runs already '
                           'finished there (delete a run\'s directory to run it again)')


def main() -> None:
  quick = FLAGS.quick.value
  setup = lb.Setup(compute_s=_COMPUTE_MS.value / 1e3, inner_steps=_INNER.value,
                   outer=_OUTER.value, outer_lr=_OUTER_LR.value,
                   outer_momentum=_OUTER_MOMENTUM.value, cutoff=_CUTOFF.value,
                   steps=200 if quick else 300, local_steps=400 if quick else 600)
  hosts = ('slow',) if quick else ('equal', 'slow')
  ratios = (4.0, 16.0) if quick else (1.0, 4.0, 16.0)
  repeats = 1 if quick else _REPEATS.value
  nbytes = lb.model_bytes()
  start = time.perf_counter()
  with _harness.run_directory(FLAGS.keep.value) as root, _harness.compilation_cache() as cache:
    curves = {}
    for run in lb.curve_runs(setup, hosts):
      curves[run['id']] = lb.eval_curve(lb.launch(setup, run, root, None, cache,
                                                  _TIMEOUT.value, _REUSE.value))
      print(f'{run["id"]}: {len(curves[run["id"]])} evaluations, last '
            f'{curves[run["id"]][-1][1]:.4f} ({time.perf_counter() - start:.0f} s)', flush=True)
    times: dict[tuple[str, float, str], list[float]] = {}
    for run in lb.timing_runs(setup, hosts, ratios, repeats):
      workdir = lb.launch(setup, run, root, setup.network(run['ratio'], nbytes), cache,
                          _TIMEOUT.value, _REUSE.value)
      times.setdefault((run['hosts'], run['ratio'], run['method']), []).append(
          lb.step_time_s(workdir, run['skip']))
  table = lb.rows(setup, curves, times, nbytes)
  print(f'\nmeasured; target: BSP\'s evaluation loss at step {setup.steps}, '
        f'{table[0]["target_loss"]:.4f}; {_COMPUTE_MS.value:g} ms a step on an undisturbed '
        f'host; local SGD H={setup.inner_steps}, outer {setup.outer} {setup.outer_lr:g}; '
        f'{time.perf_counter() - start:.0f} s')
  print(f'{"hosts":6} {"ratio":>5} {"method":18} {"step_s":>7} {"steps":>6} {"time_s":>8} '
        f'{"vs_bsp":>7} {"vs_diloco":>9} {"final":>7} {"MB/step":>8}')
  for r in sorted(table, key=lambda r: (r['hosts'], r['ratio'], list(lb.METHODS).index(
      r['method']))):
    steps = '-' if r['steps_to_target'] is None else r['steps_to_target']
    time_s = '-' if r['time_to_target_s'] is None else f'{r["time_to_target_s"]:.1f}'
    print(f'{r["hosts"]:6} {r["ratio"]:5g} {r["method"]:18} {r["step_s"]:7.3f} {steps:>6} '
          f'{time_s:>8} {r["vs_bsp"]:7.3f} {r["vs_diloco"]:9.3f} {r["final_eval_loss"]:7.4f} '
          f'{r["bytes_per_worker_step"] / 1e6:8.4f}')
  virtual = [row for n in lb.VIRTUAL_WORKERS for row in lb.virtual_rows(setup, n, ratios, nbytes)]
  print('\nvirtual clock (modelled), one 3x slow host: seconds a step and over BSP\'s')
  print(f'{"workers":>7} {"ratio":>5} {"method":18} {"step_s":>7} {"vs_bsp":>7}')
  for r in virtual:
    print(f'{r["workers"]:7} {r["ratio"]:5g} {r["method"]:18} {r["step_s"]:7.3f} '
          f'{r["step_vs_bsp"]:7.3f}')
  print('\n' + '\n'.join(lb.goals(table)))
  _harness.finish(table + virtual, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_local.py', main)
