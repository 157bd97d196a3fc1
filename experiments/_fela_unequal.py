"""The unequal-cluster part of the Fela benchmark: plans on 2 fast and 2 slow workers.

One job of 4 local workers of 2 CPU devices each (`experiments/_fela_unequal_worker.py`),
workers 2 and 3 emulated 3x slower (``static:1,1,3,3``: hosts of known speed per stage action,
`hetjax.emulation.StagePace`). For each model, the planner's plan for that cluster (its speeds
measured, then divided by the factors) against pure data parallelism, pure model parallelism
and the uniform hybrid (``hetjax/configs/plans/``), all compiled across the four workers and
trained in interleaved rounds. Rows keep part 1's fields (``model``, ``plan``,
``bytes_per_device``, ``measured_step_s``, ``predicted_step_s``) with ``cluster='unequal'``.

What is measured and what is not: step times are wall clock on worker 0 between barriers; the
compute inside each action is padded to its host's time, priced from the action's compiled
work at rates measured with every device busy (`hetjax.pipeline.roofline_costs`), so it agrees
with the cost model by construction (stated there); collectives, moves between groups,
dispatch and actions past their host's time are real. Bytes are counted from the compiled
programs' HLO on worker 0 (its stages; rows moved between stages are not collectives and are
not in them).

  rows = run_unequal(pathlib.Path('/tmp/fu'), models=MODELS, rounds=2, steps=2)
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping

from experiments import _analysis
from experiments._bench_launch import launch_workers
from hetjax.emulation import MARGIN  # host time over the roofline of an action's compiled work

WORKERS = 4
DEVICES_PER_WORKER = 2
SLOWDOWN = 'static:1,1,3,3'


def run_unequal(out: pathlib.Path, models: Mapping[str, tuple], rounds: int, steps: int,
                micro_batches: int = 1, timeout: float = 1500, slowdown: str = SLOWDOWN
                ) -> list[dict]:
  """Rows of the unequal cluster, one per (model, plan), with per-model rank correlations
  (``slowdown``: the trace of the emulated hosts, one factor per worker)."""
  spec = {'models': {k: list(v) for k, v in models.items()}, 'rounds': rounds, 'steps': steps,
          'micro_batches': micro_batches, 'margin': MARGIN}
  info = launch_workers(out, '_fela_unequal_worker', [json.dumps(spec)], WORKERS,
                        timeout=timeout, slowdown=slowdown,
                        devices_per_worker=DEVICES_PER_WORKER)
  rows = info['rows']
  for key in dict.fromkeys(r['model'] for r in rows):
    mine = [r for r in rows if r['model'] == key]
    rho, n = _analysis.rank_correlation_of_programs(mine, 'predicted_step_s', 'measured_step_s')
    for r in mine:
      r['rank_correlation'], r['rank_correlation_n'] = rho, n
  return rows


def table(rows: list[dict]) -> str:
  head = (f'{"model":<10}{"plan":<9}{"stages":>7}{"bytes/device":>14}{"measured ms":>13}'
          f'{"predicted ms":>14}{"vs pure_dp":>11}{"late":>6}{"rho":>7}{"n":>3}  layouts')
  lines = [head, '-' * len(head)]
  for r in rows:
    dp = next(x for x in rows if x['model'] == r['model'] and x['plan'] == 'pure_dp')
    layouts = ', '.join(f'{k} {v}' for k, v in r['layouts'].items())
    lines.append(f'{r["model"]:<10}{r["plan"]:<9}{r["stages"]:>7}{r["bytes_per_device"]:>14,.0f}'
                 f'{1e3 * r["measured_step_s"]:>13.2f}{1e3 * r["predicted_step_s"]:>14.2f}'
                 f'{dp["measured_step_s"] / r["measured_step_s"]:>10.2f}x'
                 f'{r["actions_past_host_time"]:>6}{r["rank_correlation"]:>7.2f}'
                 f'{r["rank_correlation_n"]:>3}  {layouts}')
  lines.append(f'unequal cluster: 4 workers x 2 devices slowed by {rows[0]["slowdown"]} (hosts of '
               'known speed); measured: wall clock; late: actions past their host\'s time')
  return '\n'.join(lines)


def goals(rows: list[dict]) -> list[str]:
  """The issue's goals on the unequal cluster, one line per model."""
  out = []
  for key in dict.fromkeys(r['model'] for r in rows):
    mine = {r['plan']: r for r in rows if r['model'] == key}
    plan, others = mine['planner'], [r for n, r in mine.items() if n != 'planner']
    best = min(others, key=lambda r: r['measured_step_s'])
    ratio = plan['measured_step_s'] / best['measured_step_s']
    ties = [r for r in others if r['measured_step_s'] <= plan['measured_step_s'] * 1.03]
    fewest = min((r['bytes_per_device'] for r in ties), default=None)
    over_dp = mine['pure_dp']['measured_step_s'] / plan['measured_step_s']
    line = (f'{key} (unequal): planner {ratio:.3f}x the best baseline\'s time ({best["plan"]}; '
            f'goal <= 1.03: {"met" if ratio <= 1.03 else "NOT met"}); {over_dp:.2f}x faster '
            f'than pure data parallel; rho {plan["rank_correlation"]:.2f} over '
            f'{plan["rank_correlation_n"]} programs (goal >= 0.8: '
            f'{"met" if plan["rank_correlation"] >= 0.8 - 1e-9 else "NOT met"})')
    if fewest is not None:
      line += (f'; bytes {plan["bytes_per_device"]:,.0f} vs {fewest:,.0f} of the baselines as '
               f'fast ({"met" if plan["bytes_per_device"] <= fewest else "NOT met"})')
    if key == 'wide_deep':
      line += f' (wide & deep >= 1.3x pure DP: {"met" if over_dp >= 1.3 else "NOT met"})'
    out.append(line)
  return out
