"""bench_local's plan and analysis: the runs it launches (`hetjax-train` under the launcher) and
the time to the synchronous run's loss it reads back. Pure functions but for `launch`.

A method is a set of ``--set`` options of the one training CLI, so the bench trains the way a
user does. Two kinds of runs, both measured:

- **Curves**: each method trained long enough (BSP `Setup.steps`, local SGD
  `Setup.local_steps`) with an evaluation every `Setup.eval_every` steps, on hosts of known
  speed (``--slowdown``) and no emulated links. What a method computes does not depend on the
  links, so one curve per method serves every link ratio; on the slow hosts only the
  heterogeneity-aware rounds compute something else (their shares and cutoffs follow the hosts),
  and LB-BSP computes BSP's steps (exact; `tests/test_workers.py`), so they share BSP's curve.
- **Step times**: each method on the same hosts with the links where one ring all-reduce of the
  model costs ``ratio`` × an undisturbed host's step, timed on the chief's wall clock after
  the first steps (compiles, LB-BSP's first moves; `Setup.steps_timed`).

Time to target = the curve's steps to BSP's evaluation loss at its last step × the method's
mean step time at the ratio: measured steps times measured seconds, from two runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import pathlib
import sys
from collections.abc import Sequence

import jax
import numpy as np

from experiments import _comm_bench
from hetjax import balance, emulation, models, runtime, sharding, simulation
from hetjax.bench import int8_bytes
from hetjax.core import ShareRules, ring_bytes

WORKERS = 4
STALL_TIMEOUT_S = 120
ROOT = pathlib.Path(__file__).resolve().parents[1]
HOSTS = {'equal': 'static:1,1,1,1', 'slow': 'static:1,1,1,3'}
#: method → its options (``--set``), beyond the mode (shares) and the hosts.
METHODS = {
    'bsp': {'balance.policy': 'uniform'},
    'lbbsp': {'balance.policy': 'lbbsp'},
    'allreduce-overlap': {'parallelism.overlap': 'true'},
    'diloco': {'balance.policy': 'uniform'},
    'diloco-int8': {'balance.policy': 'uniform', 'local.exchange': 'int8'},
    'diloco-stream': {'balance.policy': 'uniform', 'local.fragments': '4'},
    'diloco-hetero': {'balance.policy': 'lbbsp'},
}
LOCAL = ('diloco', 'diloco-int8', 'diloco-stream', 'diloco-hetero')
#: The gpt config at a size 90 runs fit on two cores: 2 layers of d_model 64, sequence 64.
MODEL_ARGS = {'layers': 2, 'd_model': 64, 'mlp': 256, 'heads': 4, 'seq_len': 64}


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every run of one bench shares.

  Attributes:
    compute_s: an undisturbed host's step (its uniform share of 8 rows).
    steps: BSP's run; the target is its evaluation loss there.
    local_steps: local SGD's runs, to reach that target.
    inner_steps: H of local SGD.
    outer, outer_lr, outer_momentum, cutoff: local SGD's outer optimizer and cutoff.
    eval_every: steps between evaluations of a curve.
    model_bytes: float32 bytes of the model's parameters (read from the first curve run).
  """

  compute_s: float = 0.08
  steps: int = 300
  local_steps: int = 600
  inner_steps: int = 20
  outer: str = 'nesterov'
  outer_lr: float = 0.7
  outer_momentum: float = 0.9
  cutoff: float = 1.5
  eval_every: int = 20
  global_batch: int = 32

  def steps_timed(self, method: str) -> tuple[int, int]:
    """(steps, skip) of ``method``'s step-time runs: BSP and the all-reduce scheduler, whose
    steps are all alike, from step 10 to 30; LB-BSP after its first moves; local SGD over
    whole rounds after two; the heterogeneity-aware rounds after five (their policy learns
    once a round)."""
    h = self.inner_steps
    if method in ('bsp', 'allreduce-overlap'):
      return 30, 10
    if method == 'lbbsp':
      return 40, 20
    if method == 'diloco-hetero':
      return 8 * h, 5 * h
    return 4 * h, 2 * h

  def options(self, method: str) -> dict[str, str]:
    """``--set`` options of ``method``."""
    out = dict(METHODS[method])
    if method in LOCAL:
      out.update({'local.inner_steps': str(self.inner_steps), 'local.outer': self.outer,
                  'local.outer_lr': str(self.outer_lr),
                  'local.outer_momentum': str(self.outer_momentum)})
      if method == 'diloco-hetero':
        out['local.cutoff'] = str(self.cutoff)
      if method == 'diloco-stream':   # a quarter of a round to land in
        out['local.overlap_steps'] = str(self.inner_steps // 4)
    return out

  def network(self, ratio: float, model_bytes: int) -> str:
    """Links where a ring all-reduce of the model takes ``ratio`` × `compute_s`."""
    return _comm_bench.Setup(compute_s=self.compute_s,
                             model_bytes=model_bytes).allreduce_network(ratio, WORKERS)

  def command(self, method: str, workdir: pathlib.Path, steps: int, network: str | None,
              evaluate: bool) -> list[str]:
    """The training CLI's command line of one run."""
    sets = {'parallelism.mode': 'shares', 'data.global_batch': str(self.global_batch),
            'emulation.host_row_s': repr(self.compute_s * WORKERS / self.global_batch),
            'checkpoint.every': str(steps), 'logging.every': str(max(steps // 5, 1)),
            'eval.every': str(self.eval_every if evaluate else 10 * steps),
            **{f'model.args.{k}': str(v) for k, v in MODEL_ARGS.items()},
            **self.options(method)}
    if network:
      sets['emulation.network'] = network
    return [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=gpt',
            '--mesh=1x1', f'--workdir={workdir}', f'--steps={steps}', '--overwrite',
            *(f'--set={k}={v}' for k, v in sets.items())]


def curve_runs(setup: Setup, hosts: Sequence[str]) -> list[dict]:
  """The curves: BSP, the all-reduce scheduler and fixed-H DiLoCo once (their steps do not
  depend on the hosts), the heterogeneity-aware rounds on each of ``hosts``."""
  runs = [{'id': f'curve-{m}', 'method': m, 'hosts': 'equal',
           'steps': setup.local_steps if m in LOCAL else setup.steps}
          for m in ('bsp', 'allreduce-overlap', 'diloco', 'diloco-int8', 'diloco-stream')]
  runs += [{'id': f'curve-diloco-hetero-{h}', 'method': 'diloco-hetero', 'hosts': h,
            'steps': setup.local_steps} for h in hosts]
  return runs


def timing_runs(setup: Setup, hosts: Sequence[str], ratios: Sequence[float],
                repeats: int) -> list[dict]:
  """The step-time runs: every method at every ratio on every hosts, repeated, methods
  interleaved within each (repeat, hosts, ratio)."""
  return [{'id': f'time-{h}-{r:g}-{m}-{k}', 'method': m, 'hosts': h, 'ratio': r, 'repeat': k,
           'steps': setup.steps_timed(m)[0], 'skip': setup.steps_timed(m)[1]}
          for k in range(repeats) for h in hosts for r in ratios for m in METHODS]


def curve_for(method: str, hosts: str) -> str:
  """The curve run a method's time to target reads (above)."""
  if method == 'diloco-hetero':
    return f'curve-diloco-hetero-{hosts}'
  return 'curve-bsp' if method == 'lbbsp' else f'curve-{method}'


def launch(setup: Setup, run: dict, root: pathlib.Path, network: str | None,
           cache: pathlib.Path | None, timeout: float, reuse: bool = False) -> pathlib.Path:
  """Runs ``run`` on `WORKERS` local workers; returns its run directory. ``reuse``: a run
  whose directory under ``root`` holds a finished run of its steps (``summary.json``) is not
  run again (a bench continued after an interruption, or re-run for some of its methods).

  Raises:
    RuntimeError: the job failed (the cause and the log named).
  """
  workdir = root / run['id']
  summary = workdir / 'summary.json'
  if reuse and summary.is_file() and json.loads(summary.read_text()).get(
      'final_step') == run['steps']:
    return workdir
  workdir.mkdir(parents=True, exist_ok=True)
  # A first overlapped step compiles its reductions: on two loaded cores past the watchdog's
  # 10 s floor; the bench measures steps, not stalls.
  env = dict(os.environ, HETJAX_STALL_TIMEOUT=str(STALL_TIMEOUT_S),
             **({'HETJAX_COMPILATION_CACHE': str(cache)} if cache else {}))
  command = setup.command(run['method'], workdir, run['steps'], network,
                          evaluate=run['id'].startswith('curve'))
  with open(workdir / 'workers.log', 'w') as log:
    result = runtime.launch_local(command, WORKERS, slowdown=HOSTS[run['hosts']],
                                  timeout=timeout, init_timeout=120, stdout=log, env=env)
  if result.returncode:
    raise RuntimeError(f'{run["id"]}: {result.cause} (see {workdir / "workers.log"})')
  return workdir


# -- reading runs back -----------------------------------------------------------------------


def eval_curve(workdir: pathlib.Path) -> list[tuple[int, float]]:
  """(step, evaluation loss) of every evaluation of a run, in step order."""
  out = []
  for line in (workdir / 'metrics.jsonl').read_text().splitlines():
    row = json.loads(line)
    if 'eval_loss' in row:
      out.append((int(row['step']), float(row['eval_loss'])))
  return sorted(out)


def steps_to(curve: Sequence[tuple[int, float]], target: float) -> int | None:
  """The first evaluated step whose loss is at most ``target`` (None: never)."""
  return next((step for step, loss in curve if loss <= target), None)


def step_time_s(workdir: pathlib.Path, skip: int) -> float:
  """Mean wall seconds a step after the first ``skip``: the chief's clock from the end of step
  ``skip`` to the end of the last (``metrics.jsonl``'s ``returned_s``). Not one worker's own
  step times: the emulated links pad each worker's exchange from its own arrival, so under
  local SGD a fast worker leaves an exchange early and its steps' sum over a round is not the
  round's."""
  returned = {}
  for line in (workdir / 'metrics.jsonl').read_text().splitlines():
    row = json.loads(line)
    if 'returned_s' in row:
      returned[int(row['step'])] = float(row['returned_s'])
  last = max(returned, default=0)
  if skip not in returned or last <= skip:
    raise RuntimeError(f'{workdir}: no step after {skip} in its metrics')
  return (returned[last] - returned[skip]) / (last - skip)


def model_bytes() -> int:
  """float32 bytes of the bench's model's parameters (the gpt config at `MODEL_ARGS`)."""
  config = importlib.import_module('hetjax.configs.gpt').get_config()
  task = models.make_task('gpt', **{**config.model.args, **MODEL_ARGS})
  params = sharding.abstract_model(task.make_model)[1]
  return 4 * sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))


def wire_bytes(setup: Setup, method: str, nbytes: int) -> float:
  """Bytes each worker sends a step: a ring all-reduce of the model every step, or every
  `Setup.inner_steps` under local SGD, in 8 bits a ring all-gather of a byte a value and a
  scale a block (the exchange's size, not a measurement)."""
  if method == 'diloco-int8':
    return (WORKERS - 1) * int8_bytes(nbytes // 4) / setup.inner_steps
  per = ring_bytes(nbytes, WORKERS)
  return per / setup.inner_steps if method in LOCAL else per


def rows(setup: Setup, curves: dict[str, list[tuple[int, float]]],
         times: dict[tuple[str, float, str], list[float]], nbytes: int) -> list[dict]:
  """One row per (hosts, ratio, method): its mean step time, steps and time to BSP's final
  evaluation loss, their ratios to BSP's at the same hosts and ratio, its curve's last loss."""
  target = curves['curve-bsp'][-1][1]
  out = []
  for (hosts, ratio, method), samples in times.items():
    curve = curves[curve_for(method, hosts)]
    steps = steps_to(curve, target)
    step_s = sum(samples) / len(samples)
    out.append({'hosts': hosts, 'ratio': ratio, 'method': method, 'source': 'measured',
                'step_s': step_s, 'step_s_runs': samples, 'steps_to_target': steps,
                'time_to_target_s': None if steps is None else steps * step_s,
                'target_loss': target, 'final_eval_loss': curve[-1][1],
                'final_vs_bsp': curve[-1][1] / target - 1,
                'bytes_per_worker_step': wire_bytes(setup, method, nbytes)})
  for row in out:
    bsp = next(r for r in out if (r['hosts'], r['ratio'], r['method']) ==
               (row['hosts'], row['ratio'], 'bsp'))
    diloco = next(r for r in out if (r['hosts'], r['ratio'], r['method']) ==
                  (row['hosts'], row['ratio'], 'diloco'))
    row['vs_bsp'] = _ratio(row['time_to_target_s'], bsp['time_to_target_s'])
    row['vs_diloco'] = _ratio(row['time_to_target_s'], diloco['time_to_target_s'])
  return out


def _ratio(a: float | None, b: float | None) -> float:
  return math.inf if a is None or not b else a / b


#: Goals (issue 43): DiLoCo's time to target against BSP's at each link ratio, the
#: heterogeneity-aware rounds' against fixed-H DiLoCo's with the slow host, final loss.
GOALS = {4.0: 0.5, 16.0: 0.25}
HETERO_GOAL = 0.8
FINAL_GOAL = 0.01


def goals(table: Sequence[dict]) -> list[str]:
  """One line per goal: met or not, with the numbers."""
  lines = []
  for row in table:
    if row['method'] in LOCAL and row['ratio'] in GOALS:
      limit = GOALS[row['ratio']]
      lines.append(f'{row["method"]} {row["hosts"]} ratio {row["ratio"]:g}: '
                   f'{row["vs_bsp"]:.3f}x BSP\'s time (goal <= {limit}): '
                   f'{"met" if row["vs_bsp"] <= limit else "NOT met"}')
    if row['method'] == 'diloco-hetero' and row['hosts'] == 'slow':
      lines.append(f'diloco-hetero slow ratio {row["ratio"]:g}: {row["vs_diloco"]:.3f}x fixed-H '
                   f'DiLoCo\'s time (goal <= {HETERO_GOAL}): '
                   f'{"met" if row["vs_diloco"] <= HETERO_GOAL else "NOT met"}')
  finals = {(r['method'], r['hosts']): r['final_vs_bsp'] for r in table if r['method'] in LOCAL}
  for (method, hosts), off in sorted(finals.items()):
    lines.append(f'{method} {hosts}: final eval loss {off:+.2%} of BSP\'s (goal within '
                 f'{FINAL_GOAL:.0%}): {"met" if off <= FINAL_GOAL else "NOT met"}')
  return lines


# -- the virtual clock ---------------------------------------------------------------------------

VIRTUAL_WORKERS = (64, 1024)
VIRTUAL_METHODS = ('bsp', 'lbbsp', 'diloco', 'diloco-hetero')


def virtual_rows(setup: Setup, workers: int, ratios: Sequence[float], nbytes: int,
                 rounds: int = 12) -> list[dict]:
  """The same methods (but the all-reduce scheduler) on the virtual clock
  (`hetjax.simulation.simulate_local`): ``workers`` hosts of 8 rows a step, the last 3× slow,
  links where the ring all-reduce of the model costs ``ratio`` × a step (α capped at a quarter
  of the ring's time, `_comm_bench.Setup.allreduce_link`). BSP and LB-BSP are rounds of one
  step. Rows carry each method's mean modelled seconds a step after two rounds and its ratio to
  BSP's; no loss model, so no time to target."""
  rows_per = setup.global_batch // WORKERS
  batch = rows_per * workers
  trace = emulation.StaticTrace((1,) * (workers - 1) + (3,))
  out = []
  for ratio in ratios:
    link = _comm_bench.Setup(compute_s=setup.compute_s,
                             model_bytes=nbytes).allreduce_link(ratio, workers)
    cost = simulation.ClockCosts(per_sample_s=setup.compute_s / rows_per, alpha_s=link.alpha_s,
                                 beta_bytes_per_s=link.beta_bytes_per_s, grad_bytes=nbytes)
    step_s = {}
    for method in VIRTUAL_METHODS:
      h = setup.inner_steps if method in LOCAL else 1
      name = 'uniform' if method in ('bsp', 'diloco') else 'lbbsp'
      policy = balance.make_policy(name, ShareRules(batch, workers, 1))
      run = simulation.simulate_local(policy, trace, cost, batch, rounds, h,
                                      cutoff=setup.cutoff if method == 'diloco-hetero' else 0.0)
      step_s[method] = run.mean_round_s(skip=2) / h
    for method, s in step_s.items():
      out.append({'hosts': 'slow', 'ratio': ratio, 'method': method, 'workers': workers,
                  'source': 'virtual clock', 'step_s': s, 'step_vs_bsp': s / step_s['bsp']})
  return out
