r"""LB-BSP against uniform BSP under stragglers: real local workers, then the virtual clock at scale.

For each scenario, one job of 4 local workers (one CPU device each, each a host of known speed:
`hetjax.emulation.KnownSpeedHost`, one calibrated per-row cost for the job, slowed by the
scenario's trace) trains with every policy in turn, in interleaved blocks; policy p's k-th step
meets slowdown trace(k), so all policies see the same slowdowns
(`experiments/_lbbsp_worker.py`). The oracle knows every worker's true speed at every step: the
trace's factor and delay, and the hosts' calibrated ``row_s`` and ``fixed_s`` (one for the
job), so its shares are the balanced optimum of each step (`hetjax.balance.Oracle`) and it
bounds every causal policy up to the hosts' overruns.
Per scenario × policy it reports, from measured telemetry (steps of that policy only):

* ``iter/limit``: median iteration time (compile time left out) over the median balanced limit:
  the T at which hosts of the calibrated ``fixed_s + rows × row_s``, each at its measured
  slowdown (busy / that cost), cover the batch, plus the step's measured time outside compute
  (`experiments._harness.JobRun.limit_s`; fixed costs count, so it is the true balanced time);
* ``speedup``: Uniform's mean iteration time over the policy's;
* ``of ideal``: the policy's speedup over the ideal one (Uniform iteration / limit), i.e.
  limit / iteration — 1.0 is perfect balance;
* ``idle``: mean fraction of a step the workers wait at the barrier;
* ``compile``: share of the policy's time its steps waited for compiles (lowering a new share
  size's program; the XLA compile runs in the background while the size runs as pieces — see
  `hetjax.train.WorkerTrainer`'s ``bucket``). The piece ladder, compiled once before the first
  step, is printed per scenario instead;
* ``settle``: policy steps until the shares stop moving by more than one bucket (after the
  change for ``step``; ``-`` if they never settle, as expected under Markov);
* ``reversals``: direction reversals of any share after settling (oscillation).

Per scenario it also prints the hosts' calibrated cost and how many worker-steps overran their
host's time (the real compute took longer than the emulated host: the emulation did not hold).

Communication (``links``, ``both``): the workers exchange the gradient through a server on
emulated links of one uniform share's host time × ``EXCHANGE`` each (worker 3's push and pull
as long as its compute; `experiments._lbbsp_worker.exchange_links`), on equal hosts
(``links``) or with worker 2 at half speed (``both``). They run ``LINK_POLICIES``: uniform,
compute-only LB-BSP (``lbbsp-ewma``), LB-BSP with each worker's declared transfer in its
objective (``lbbsp-links``, `hetjax.balance.LBBSP`'s ``transfer_s``) and the oracle (which
knows the transfers too). Their limit is the balanced time of compute plus transfer (every
worker's equal), from the host and link models, plus the measured time outside both.

Then the same scenarios (patterns tiled over the workers, `_analysis.tile_trace`) on the virtual
clock at 64 and 1024 workers: the hosts' calibrated costs, host time from the Uniform blocks of
the first scenario's run (`experiments._harness.host_costs`). Rows say ``measured`` or
``virtual`` (modelled).

Markov also runs on the virtual clock at the measured 4 workers, and at every size it gets a
``causal-limit`` row: the Bayes-optimal causal policy that knows the chain and the states just
observed (`experiments._markov_limit`), what no predictor can beat in expectation. The oracle
also knows the next states; the gap between the two is the price of not seeing a switch coming.

Compiled share sizes are kept in memory and in a persistent compilation cache that is empty
when the benchmark starts and shared by its scenarios (as a relaunched job would share it), so
the first scenario pays cold compiles and later ones mostly load them.

Part ``harm`` (`experiments._lbbsp_harm`) asks whether LB-BSP ever makes a run slower than
uniform shares on work nobody tuned it for: `experiments/train.py` launched as a user runs it,
on foreign models (``tests/foreign``) and a shipped one, hosts calibrated (equal, one 3x slow)
or declared (one 3x slow), each job from an empty compilation cache, whole runs timed (compiles
included), uniform and LB-BSP in turn, ``--harm_runs`` times.

  .venv/bin/python -m experiments.bench_lbbsp --quick --json runs/bench_lbbsp.json
  .venv/bin/python -m experiments.bench_lbbsp --quick --scenarios=links,both
  .venv/bin/python -m experiments.bench_lbbsp --parts=harm --json runs/bench_lbbsp_harm.json
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

import numpy as np
from absl import flags

from experiments import _analysis, _harness, _lbbsp_harm, _markov_limit
from experiments._bench_launch import launch_workers
from experiments._lbbsp_worker import LINKS_POLICY
from hetjax import ConfigError, balance, core, emulation, simulation

WORKERS = 4
SCENARIOS = {
    'static': 'static:1,1,1,3',
    'skewed': 'static:1,1.25,2,4',
    'markov': 'markov:3:0.9:seed=1',
    'step': 'step:20:1,1,1,1:1,1,1,3',
    'links': 'none',
    'both': 'static:1,1,2,1',
}
#: Scenarios on a server exchange: worker i's push and pull take EXCHANGE[i] × a uniform share's
#: host time.
EXCHANGE = {'links': (0.1, 0.1, 0.1, 1.0), 'both': (0.1, 0.1, 0.1, 1.0)}
LINK_POLICIES = ('uniform', 'lbbsp-ewma', LINKS_POLICY, 'oracle')
STEP_AT = 20  # the step scenario's change: settling is counted from there
POLICIES = ('uniform', 'proportional', 'lbbsp-last', 'lbbsp-ewma', 'lbbsp-ar', 'lbbsp-narx',
            'lbbsp-regime', 'oracle')
SCALE = (64, 1024)
VIRTUAL_ROWS_PER_WORKER, VIRTUAL_BUCKET = 512, 32

FLAGS = _harness.define_flags('static and markov only, 3 rounds: under 3 minutes')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'blocks per policy (default 6, quick 3)')
_BLOCK = flags.DEFINE_integer('block', None, 'steps per block (default 5)')
_SCENARIOS = flags.DEFINE_list('scenarios', None, 'scenarios to run (default all; quick: '
                               'static, markov)')
_POLICIES = flags.DEFINE_list('policies', list(POLICIES), 'policies to compare')
PARTS = ('policies', 'harm')
_PARTS = flags.DEFINE_list('parts', list(PARTS), 'policies: the scenarios above; harm: LB-BSP '
                           'against uniform on foreign models, whole launched runs')
_HARM_MODELS = flags.DEFINE_list('harm_models', None, 'models of part harm (default the foreign '
                                 'nnx_transformer and the shipped mlp; quick: nnx_transformer)')
_HARM_HOSTS = flags.DEFINE_list('harm_hosts', list(_lbbsp_harm.HOSTS), 'hosts of part harm')
_HARM_RUNS = flags.DEFINE_integer('harm_runs', None, 'runs of each policy (default 3, quick 1)')
_HARM_STEPS = flags.DEFINE_integer('harm_steps', None, 'steps of each run (default 100, quick 60)')


def _launch(out: pathlib.Path, spec: str, policies, rounds: int, block: int,
            cache: pathlib.Path, exchange: tuple[float, ...] = ()) -> dict:
  extra = [','.join(map(str, exchange))] if exchange else []
  return launch_workers(out, '_lbbsp_worker', [','.join(policies), rounds, block, *extra],
                        WORKERS, timeout=900, slowdown=spec, cache=cache)


def _policies(scenario: str, policies) -> tuple[str, ...]:
  return LINK_POLICIES if scenario in EXCHANGE else tuple(policies)


def _after(scenario: str) -> int:
  return STEP_AT if scenario == 'step' else 0


def virtual_rows(scenario: str, workers: int, cost: simulation.ClockCosts, steps: int,
                 policies) -> list[dict]:
  """The scenario tiled over ``workers`` on the virtual clock (modelled, not measured)."""
  trace = _analysis.tile_trace(emulation.parse_trace(SCENARIOS[scenario], WORKERS), workers)
  x = VIRTUAL_ROWS_PER_WORKER * workers
  rules = core.ShareRules(x, workers, VIRTUAL_BUCKET)
  if scenario in EXCHANGE:  # each worker's own transfer, tiled as the trace is
    uniform_s = cost.fixed_s + VIRTUAL_ROWS_PER_WORKER * float(np.max(cost.per_sample_s))
    cost = dataclasses.replace(cost, transfer_s=tuple(
        EXCHANGE[scenario][i % WORKERS] * uniform_s for i in range(workers)))
  rows = []
  for name in _policies(scenario, policies):
    start = time.perf_counter()
    transfer = cost.transfer_s if name in (LINKS_POLICY, 'oracle') else ()
    known = (balance.KnownCosts(cost.per_sample_s, cost.fixed_s, transfer_s=transfer)
             if name == 'oracle' else balance.KnownCosts(transfer_s=transfer))
    policy = balance.make_policy('lbbsp-ewma' if name == LINKS_POLICY else name, rules, trace,
                                 known)
    v = simulation.simulate_shares(policy, trace, cost, x, steps)
    settle, reversals = _analysis.settle(v.shares, VIRTUAL_BUCKET, _after(scenario))
    rows.append({'scenario': scenario, 'policy': name, 'workers': workers, 'source': 'virtual',
                 'iter_s': v.mean_iter_s(), 'limit_s': v.mean_balanced_limit_s(),
                 'idle_fraction': float(v.idle_fraction.mean()), 'compile_overhead_share': None,
                 'settle_iterations': settle, 'reversals_after_settle': reversals,
                 'simulate_s': time.perf_counter() - start})
  if scenario == 'markov':  # the best any causal policy can do: experiments/_markov_limit.py
    rows.append(_markov_limit.virtual_row(scenario, trace, rules, cost, steps))
  return _analysis.with_speedups(rows, ideal=True)


def table(rows: list[dict]) -> str:
  head = (f'{"scenario":<8}{"workers":>8} {"source":<9}{"policy":<14}{"iter ms":>9}{"iter/limit":>11}'
          f'{"speedup":>9}{"of ideal":>9}{"idle":>6}{"compile":>8}{"settle":>7}{"rev":>4}')
  lines = [head, '-' * len(head)]
  for r in rows:
    compile_share = '-' if r['compile_overhead_share'] is None else f'{r["compile_overhead_share"]:.3f}'
    settle = '-' if r['settle_iterations'] is None else str(r['settle_iterations'])
    lines.append(
        f'{r["scenario"]:<8}{r["workers"]:>8} {r["source"]:<9}{r["policy"]:<14}'
        f'{1e3 * r["iter_s"]:>9.1f}{r["ratio_to_limit"]:>11.2f}{r["speedup_vs_uniform"]:>9.2f}'
        f'{r["fraction_of_ideal_speedup"]:>9.2f}{r["idle_fraction"]:>6.2f}{compile_share:>8}'
        f'{settle:>7}{r["reversals_after_settle"]:>4}')
  return '\n'.join(lines)


def run(root: pathlib.Path, rounds: int, block: int, scenarios, policies) -> list[dict]:
  rows = []
  with _harness.compilation_cache() as cache:  # cold at the start, warmed by each scenario
    for scenario in scenarios:
      rows += _scenario(root, scenario, policies, rounds, block, cache)
  first = _harness.JobRun.load(root / scenarios[0])
  cost = _harness.host_costs(first, first.rows('uniform', skip=1))
  if 'markov' in scenarios:  # the measured size too, beside the causal limit
    rows += virtual_rows('markov', WORKERS, cost, rounds * block, policies)
  for n in SCALE:
    for scenario in scenarios:
      rows += virtual_rows(scenario, n, cost, rounds * block, policies)
  return rows


def _scenario(root, scenario, policies, rounds, block, cache) -> list[dict]:
  info = _launch(root / scenario, SCENARIOS[scenario], _policies(scenario, policies), rounds,
                 block, cache, EXCHANGE.get(scenario, ()))
  job = _harness.JobRun.load(root / scenario)
  compiles = {k: info[k] for k in ('warmup_compile_s', 'background_compiles',
                                   'background_compile_s', 'piece_steps')}
  print(f'{scenario} (worker 0): piece ladder compiled before step 1 in '
        f'{compiles["warmup_compile_s"]:.1f} s; {compiles["background_compiles"]} sizes compiled '
        f'in the background ({compiles["background_compile_s"]:.1f} s); '
        f'{compiles["piece_steps"]} steps ran as pieces; {job.host_line()}'
        + (f'; links {info["network"]}, transfers '
           f'{" ".join(f"{1e3 * t:.1f}" for t in info["transfer_s"])} ms'
           if info.get('network') else ''), flush=True)
  return [r | compiles for r in _harness.share_policy_rows(job, scenario, _after(scenario))]


def main() -> None:
  quick = FLAGS.quick.value
  rounds = (3 if quick else 6) if _ROUNDS.value is None else _ROUNDS.value
  block = 5 if _BLOCK.value is None else _BLOCK.value
  scenarios = _SCENARIOS.value or (['static', 'markov'] if quick else list(SCENARIOS))
  bad = [s for s in scenarios if s not in SCENARIOS] + [
      p for p in _POLICIES.value if p not in POLICIES]
  if bad or 'uniform' not in _POLICIES.value or rounds < 1 or block < 2:
    raise ConfigError(f'bad arguments {bad} (scenarios: {", ".join(SCENARIOS)}; policies: '
                      f'{", ".join(POLICIES)}, uniform among them; rounds >= 1, block >= 2)')
  models = _HARM_MODELS.value or (['nnx_transformer'] if quick else ['nnx_transformer', 'mlp'])
  runs = (1 if quick else 3) if _HARM_RUNS.value is None else _HARM_RUNS.value
  steps = (60 if quick else 100) if _HARM_STEPS.value is None else _HARM_STEPS.value
  bad = ([p for p in _PARTS.value if p not in PARTS]
         + [m for m in models if m not in _lbbsp_harm.MODELS]
         + [h for h in _HARM_HOSTS.value if h not in _lbbsp_harm.HOSTS])
  if bad or runs < 1 or steps <= _lbbsp_harm.WARM_UP + 1:
    raise ConfigError(f'bad arguments {bad} (parts: {", ".join(PARTS)}; harm models: '
                      f'{", ".join(_lbbsp_harm.MODELS)}; hosts: {", ".join(_lbbsp_harm.HOSTS)}; '
                      f'harm_runs >= 1, harm_steps > {_lbbsp_harm.WARM_UP + 1})')
  start = time.perf_counter()
  rows, harm = [], []
  with _harness.run_directory(FLAGS.keep.value) as root:
    if 'policies' in _PARTS.value:
      rows = run(root, rounds, block, scenarios, _POLICIES.value)
    if 'harm' in _PARTS.value:
      harm = _lbbsp_harm.measure(root / 'harm', models, _HARM_HOSTS.value, runs, steps)
  if rows:
    print(table(rows))
    print(f'{rounds} rounds x {block} steps per policy and scenario')
  if harm:
    print(_lbbsp_harm.table(harm))
    print(f'part harm: {runs} run(s) of {steps} steps per policy, model and hosts; every step '
          'timed, compiles included, from empty compilation caches; measured')
  print(f'{time.perf_counter() - start:.0f} s')
  _harness.finish(rows + [{'part': 'harm', **r} for r in harm], FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_lbbsp.py', main)
