"""Eager pull's learning rate on the virtual clock: which rate, if any, reaches the synchronous
target, in iterations and in time (`experiments/bench_eager_rate.py` prints it; no flags here,
so tests can import it).

bench_comm's setting on `hetjax.simulation.simulate_comm`, with bench_comm's digits mlp as the
problem (`hetjax.simulation.TaskProblem`, the loss over the whole data set): 4 workers at
40 ms a gradient (``equal``, or ``straggler``: the last 3× slow), links where a push plus a pull
takes the compute (ratio 1), SGD. Per data order (seed): ps-bsp at η for `STEPS` global batches
sets the target (its trailing mean over 3 global batches at two thirds of the run, as
bench_comm); eager pull then runs `EAGER_STEPS` global batches with the staleness-aware rate
η / max(1, τ) (``eager-stale-lr``) and with constant rates c η / n per push (``eager-c``; c = 1
is the synchronous step per global batch). Iterations are global batches of gradients; times
are the virtual clock's (modelled, not measured), from the first global batch applied to the one
that reaches the target, as bench_comm counts them.
"""

from __future__ import annotations

import numpy as np

from experiments import _comm_bench
from hetjax import models
from hetjax.emulation import Links
from hetjax.simulation import TaskProblem, simulate_comm

WORKERS, LR, STEPS, EAGER_STEPS = 4, 0.3, 60, 120
RATES = (0.4, 0.6, 0.8, 1.0, 1.3, 1.6)
COMPUTE = {'equal': (1, 1, 1, 1), 'straggler': (1, 1, 1, 3)}


def _curve(scheme: str, problem: TaskProblem, scenario: str, steps: int, lr: float):
  """(losses, virtual seconds) after each global batch of gradients."""
  setup = _comm_bench.Setup()
  link = setup.ps_link(1.0)
  links = Links((link.alpha_s,) * WORKERS, (link.beta_bytes_per_s,) * WORKERS)
  compute = [setup.compute_s * f for f in COMPUTE[scenario]]
  every = 1 if scheme == 'ps-bsp' else WORKERS
  run = simulate_comm(scheme, compute, links, problem.model_bytes, steps * every, lr,
                      problem=problem)
  return run.losses[every - 1::every], run.update_times[every - 1::every]


def seed_rows(scenario: str, seed: int, rates=RATES) -> list[dict]:
  """One data order's rows: bsp (the target), eager with η/τ, eager at each constant rate."""
  task = models.make_task('mlp', **dict(_comm_bench.Setup().model))
  problem = TaskProblem(task, _comm_bench.Setup().global_batch, seed=seed,
                        loss_batch=task.data.arrays)
  losses, times = _curve('ps-bsp', problem, scenario, STEPS, LR)
  smoothed = _comm_bench.trailing_mean(list(losses))
  target = smoothed[2 * STEPS // 3 - 1]
  bsp_at = _comm_bench.first_below(smoothed, target)
  bsp_s = float(times[bsp_at - 1] - times[0])   # from the first global batch, as bench_comm
  runs = [('eager-stale-lr', 'ps-eager-stale-lr', LR)]
  runs += [(f'eager-{c:g}', 'ps-eager', LR * c / WORKERS) for c in rates]
  out = [{'scenario': scenario, 'seed': seed, 'rule': 'bsp', 'iterations_to_target': bsp_at,
          'time_to_target_vs_bsp': 1.0, 'target_loss': target}]
  for rule, scheme, lr in runs:
    losses, times = _curve(scheme, problem, scenario, EAGER_STEPS, lr)
    at = _comm_bench.first_below(_comm_bench.trailing_mean(list(losses)), target)
    out.append({'scenario': scenario, 'seed': seed, 'rule': rule, 'iterations_to_target': at,
                'time_to_target_vs_bsp':
                    None if at is None else float(times[at - 1] - times[0]) / bsp_s,
                'target_loss': target})
  return out


def summary(rows: list[dict]) -> list[dict]:
  """Per scenario and rule, over seeds: the median iterations and time to the target (a seed
  that never reaches it counts as beyond every one that does), and how many reach it within
  `STEPS` global batches (bsp's run)."""
  out = []
  for scenario, rule in dict.fromkeys((r['scenario'], r['rule']) for r in rows):
    group = [r for r in rows if (r['scenario'], r['rule']) == (scenario, rule)]
    its = [r['iterations_to_target'] or np.inf for r in group]
    times = [r['time_to_target_vs_bsp'] or np.inf for r in group]
    median_it, median_t = float(np.median(its)), float(np.median(times))
    out.append({'scenario': scenario, 'rule': rule, 'seeds': len(group),
                'median_iterations_to_target': median_it if np.isfinite(median_it) else None,
                'within_bsp_steps': int(sum(i <= STEPS for i in its)),
                'reached': int(sum(np.isfinite(i) for i in its)),
                'median_time_to_target_vs_bsp': median_t if np.isfinite(median_t) else None})
  return out


def table(summaries: list[dict]) -> str:
  lines = [f'{"scenario":9s} {"rule":15s} {"median it→tgt":>13s} {"≤ " + str(STEPS):>6s} '
           f'{"reached":>7s} {"t→tgt / bsp":>11s}']
  for s in summaries:
    it, t = s['median_iterations_to_target'], s['median_time_to_target_vs_bsp']
    lines.append(f'{s["scenario"]:9s} {s["rule"]:15s} {"never" if it is None else f"{it:g}":>13s} '
                 f'{s["within_bsp_steps"]:>3d}/{s["seeds"]:<2d} {s["reached"]:>4d}/{s["seeds"]:<2d} '
                 f'{"—" if t is None else f"{t:.2f}":>11s}')
  return '\n'.join(lines)
