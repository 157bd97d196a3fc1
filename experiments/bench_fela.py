r"""Fela on this machine: the planner's plan against hand-written baselines, then tokens.

Part 1, plans. For wide & deep and the byte LM at two sizes, on 8 local CPU devices: the
planner's plan (`hetjax.planner.search`, costs from XLA's per-sub-model analyses, cluster
measured by `measure_cluster`) against ``hetjax/configs/plans/`` (pure data-parallel, pure
model-parallel, uniform hybrid). Per plan:

* ``bytes/device``: collective bytes per device per step, counted exactly from the compiled
  step's HLO (`hetjax.bench.collective_bytes`);
* ``measured ms``: median train-step time, plans interleaved (R rounds × N steps each after one
  untimed step, the order rotating by round) so machine drift hits all alike;
* ``predicted ms``: the cost model at the measured α and β; ``@1/10/100 Gbit/s``: the same
  model with β replaced, what the plan would cost on such a network (modelled, not measured).
  ``--cost=compiled`` (default): FSDP options priced from each sub-model's compiled step and its
  update timed on the mesh (`hetjax.planner.CompiledCost`; each FSDP option is printed with its
  evidence, or why it fell back to the formulas), and the analytic model's own plan (``analytic``)
  is measured beside the others when it is none of them; ``analytic_predicted_step_s`` in the JSON
  rows is every plan priced by `AnalyticCost`, for comparison. ``--cost=analytic``: every price
  from `AnalyticCost`;
* the Spearman rank correlation of predicted and measured times (average ranks for ties), per
  model and over all, with plans that compile to one program (same layouts, e.g. the planner's
  choosing pure data parallelism) counted once, their measured times averaged; ``n`` is the
  number of distinct programs (`experiments._analysis.rank_correlation_of_programs`).

Part 1's rows have ``cluster='equal'``: 8 equal devices in one process.

Part 3, the unequal cluster (`experiments/_fela_unequal.py`, rows with ``cluster='unequal'``): 4
launched workers of 2 devices, workers 2 and 3 emulated 3x slow (hosts of known speed per stage
action); the planner's plan for that cluster against the same baselines, all trained across
the 4 workers in interleaved rounds. It runs before part 2.

Part 2, tokens (`experiments/_fela_tokens.py`): Uniform BSP, LB-BSP and Fela's tokens under a
static 3x straggler and a Markov one, 4 real local workers, then 64 and 1024 on the virtual
clock.

  .venv/bin/python -m experiments.bench_fela --quick --json runs/bench_fela.json
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

import jax
import numpy as np
import optax
from absl import flags

from experiments import _analysis, _harness
from hetjax import ConfigError, configs, models, planner
from hetjax.bench import collective_bytes
from hetjax.sharding import submodel_names

PLANS = configs.PLANS
DEVICES = 8
# name → (model, make_task arguments, global batch)
MODELS = {
    'wide_deep': ('wide_deep', {'rows': 100_000, 'dim': 64, 'fields': 4}, 512),
    'lm_small': ('transformer', {'d_model': 128, 'heads': 8, 'layers': 2, 'mlp': 512,
                                 'seq_len': 64}, 64),
    'lm_large': ('transformer', {'d_model': 256, 'heads': 8, 'layers': 4, 'mlp': 1024,
                                 'seq_len': 64}, 64),
}
BETAS_GBIT = (1, 10, 100)

FLAGS = _harness.define_flags('fewer rounds and steps (about 7 minutes; 5 without tokens)',
                              keep=False)
_ROUNDS = flags.DEFINE_integer('rounds', None, 'interleaved rounds per model (default 5, quick 2)')
_STEPS = flags.DEFINE_integer('steps', None, 'steps per plan per round (default 5, quick 2)')
_MODELS = flags.DEFINE_list('models', list(MODELS), f'models to plan, of {list(MODELS)}')
_TOKENS = flags.DEFINE_bool('tokens', True, 'also run part 2 (tokens vs LB-BSP vs uniform)')
_UNEQUAL = flags.DEFINE_bool('unequal', True, 'also run part 3 (the plans on 2 fast and 2 slow '
                             'workers of 2 devices each)')
_UNEQUAL_SLOWDOWN = flags.DEFINE_string('unequal_slowdown', 'static:1,1,3,3',
                                        'part 3\'s emulated hosts: one factor per worker')
_COST = flags.DEFINE_enum('cost', 'compiled', ['compiled', 'analytic'],
                          'cost model of part 1: compiled (FSDP options from each sub-model\'s '
                          'compiled step and timed update, hetjax.planner.CompiledCost) or '
                          'analytic (every option from the formulas)')


def _plans(task, profiles, cluster, batch, cost) -> list[planner.Plan]:
  names = submodel_names(task.make_model)
  plans = [planner.search(profiles, cluster, batch, cost)]
  for path in sorted(PLANS.glob('*.json')):
    plans.append(planner.evaluate(planner.Plan.load(path, names), profiles, cluster, batch, cost))
  if not isinstance(cost, planner.AnalyticCost):
    # The analytic model's own choice, measured beside the others when it is none of them.
    analytic = dataclasses.replace(planner.search(profiles, cluster, batch), name='analytic')
    if all(_placements(analytic) != _placements(p) for p in plans):
      plans.insert(1, planner.evaluate(analytic, profiles, cluster, batch, cost))
  return plans


def _placements(plan: planner.Plan) -> list:
  return [(s.layout, s.group) for s in plan.submodels]


def _time_steps(compiled_plan, state, batches, steps: int):
  trainer = compiled_plan.trainer
  start = time.perf_counter()
  for i in range(steps):
    state, _ = trainer.train_step(state, batches[i % len(batches)])
  jax.block_until_ready(state)
  return state, (time.perf_counter() - start) / steps


def _model_rows(key: str, rounds: int, steps: int, cluster) -> list[dict]:
  model, kwargs, batch = MODELS[key]
  task = models.make_task(model, **kwargs)
  profiles = planner.profile_submodels(task)
  optimizer = optax.adam(1e-3)
  cost = (planner.CompiledCost(task, optimizer) if _COST.value == 'compiled'
          else planner.AnalyticCost())
  compiled, states, batches = {}, {}, {}
  plans = _plans(task, profiles, cluster, batch, cost)
  if isinstance(cost, planner.CompiledCost):  # how each FSDP option was priced, at the measured β
    for pricing in cost.pricings:
      if pricing.source is not planner.PricedBy.ANALYTIC:
        print(f'{key}: {pricing.describe()}', flush=True)
  for plan in plans:
    try:
      c = planner.compile_plan(plan, task, optimizer, batch)
    except ConfigError as e:
      print(f'{key}: plan {plan.name} skipped: {e}', flush=True)
      continue
    name = plan.name
    compiled[name], states[name] = c, c.trainer.init_state()
    batches[name] = [c.trainer.put_batch(c.trainer.global_batch_at(s)) for s in range(2)]
    states[name], _ = _time_steps(c, states[name], batches[name], 1)  # warm-up

  def block(name: str):
    def run() -> float:
      # One untimed step first: the step after switching plans runs on cold caches.
      states[name], _ = _time_steps(compiled[name], states[name], batches[name], 1)
      states[name], t = _time_steps(compiled[name], states[name], batches[name], steps)
      return t
    return run

  times = _harness.interleave({name: block(name) for name in compiled}, rounds)
  rows = []
  for name, c in compiled.items():
    moved = collective_bytes(c.compiled)
    row = {'model': key, 'plan': name, 'cluster': 'equal', 'layouts': {s.name: s.layout.name(DEVICES)
                                                   for s in c.plan.submodels},
           'bytes_per_device': float(moved.total), 'measured_step_s': float(np.median(times[name])),
           'predicted_step_s': float(c.plan.predicted_step_s), 'memory_bytes': c.memory_bytes,
           'cost': _COST.value, 'analytic_predicted_step_s': float(planner.evaluate(
               c.plan, profiles, cluster, batch).predicted_step_s)}
    for gbit in BETAS_GBIT:
      at = planner.evaluate(c.plan, profiles, cluster.with_bandwidth(gbit * 1e9 / 8), batch,
                            cost)
      row[f'predicted_step_s_at_{gbit}gbit'] = float(at.predicted_step_s)
    rows.append(row)
  rho, n = _analysis.rank_correlation_of_programs(rows, 'predicted_step_s', 'measured_step_s')
  for r in rows:
    r['rank_correlation'], r['rank_correlation_n'] = rho, n
  if _COST.value != 'analytic':
    before, _ = _analysis.rank_correlation_of_programs(rows, 'analytic_predicted_step_s',
                                                       'measured_step_s')
    print(f'{key}: the analytic model\'s predictions (analytic_predicted_step_s) rank the same '
          f'programs with rho {before:.2f}', flush=True)
  return rows


def _plan_table(rows: list[dict]) -> str:
  head = (f'{"model":<10}{"plan":<9}{"bytes/device":>14}{"measured ms":>13}{"predicted ms":>14}'
          + ''.join(f'{f"@{g}Gb/s ms":>12}' for g in BETAS_GBIT) + f'{"rho":>7}{"n":>3}')
  lines = [head, '-' * len(head)]
  for r in rows:
    lines.append(
        f'{r["model"]:<10}{r["plan"]:<9}{r["bytes_per_device"]:>14,.0f}'
        f'{1e3 * r["measured_step_s"]:>13.2f}{1e3 * r["predicted_step_s"]:>14.2f}'
        + ''.join(f'{1e3 * r[f"predicted_step_s_at_{g}gbit"]:>12.2f}' for g in BETAS_GBIT)
        + f'{r["rank_correlation"]:>7.2f}{r["rank_correlation_n"]:>3}')
  lines.append('measured: wall clock; predicted and @β: the cost model (modelled); rho over the '
               'n distinct programs')
  return '\n'.join(lines)


def _goals(rows: list[dict]) -> list[str]:
  out = []
  for key in dict.fromkeys(r['model'] for r in rows):
    mine = [r for r in rows if r['model'] == key]
    plan = next((r for r in mine if r['plan'] == 'planner'), None)
    others = [r for r in mine if r['plan'] != 'planner']
    if plan is None or not others:
      continue
    best_bytes = min(r['bytes_per_device'] for r in others)
    best_time = min(r['measured_step_s'] for r in others)
    same = [r['plan'] for r in others if r['layouts'] == plan['layouts']]
    out.append(f'{key}: planner bytes {plan["bytes_per_device"]:,.0f} vs best baseline '
               f'{best_bytes:,.0f} ({"met" if plan["bytes_per_device"] <= best_bytes else "NOT met"})'
               f'; measured {1e3 * plan["measured_step_s"]:.2f} ms vs best {1e3 * best_time:.2f} ms'
               f' ({plan["measured_step_s"] / best_time:.3f}x); rho {mine[0]["rank_correlation"]:.2f}'
               f' over n = {mine[0]["rank_correlation_n"]} distinct programs'
               + (f'; same layouts as {", ".join(same)} (one program: any difference is noise)'
                  if same else ''))
  rho, n = _analysis.rank_correlation_of_programs(rows, 'predicted_step_s', 'measured_step_s')
  out.append(f'rank correlation over all models and plans: {rho:.2f} over n = {n} distinct '
             'programs (goal >= 0.8 per model)')
  return out


def main() -> None:
  quick = FLAGS.quick.value
  rounds = (2 if quick else 5) if _ROUNDS.value is None else _ROUNDS.value
  steps = (2 if quick else 5) if _STEPS.value is None else _STEPS.value
  bad = [m for m in _MODELS.value if m not in MODELS]
  if bad or rounds < 1 or steps < 1:
    raise ConfigError(f'bad arguments {bad} (models: {list(MODELS)}; rounds and steps >= 1)')
  if jax.device_count() != DEVICES:
    raise ConfigError(f'needs {DEVICES} devices, found {jax.device_count()}')
  start = time.perf_counter()
  cluster = planner.measure_cluster()
  print(f'cluster: {cluster.devices} devices, {cluster.workers[0].flops_per_s / 1e9:.1f} GFLOP/s '
        f'per device, α {cluster.alpha_s * 1e6:.1f} µs, '
        f'β {cluster.beta_bytes_per_s * 8 / 1e9:.2f} Gbit/s (measured)', flush=True)
  rows = []
  for key in _MODELS.value:
    rows += _model_rows(key, rounds, steps, cluster)
    print(_plan_table([r for r in rows if r['model'] == key]), flush=True)
  print(_plan_table(rows))
  print('\n'.join(_goals(rows)))
  if _UNEQUAL.value and _MODELS.value:
    from experiments import _fela_unequal
    with _harness.run_directory(None) as tmp:
      unequal = _fela_unequal.run_unequal(
          tmp, {k: MODELS[k] for k in _MODELS.value}, rounds=2 if quick else 3,
          steps=1 if quick else 2, slowdown=_UNEQUAL_SLOWDOWN.value)
    print(_fela_unequal.table(unequal))
    print('\n'.join(_fela_unequal.goals(unequal)), flush=True)
    rows += unequal
  if _TOKENS.value:
    from experiments import _fela_tokens
    with _harness.run_directory(None) as tmp:
      token_rows = _fela_tokens.run_tokens(tmp, quick=quick)
    print(_fela_tokens.table(token_rows))
    rows += token_rows
  print(f'{time.perf_counter() - start:.0f} s')
  _harness.finish(rows, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_fela.py', main, cpu_devices=DEVICES)
