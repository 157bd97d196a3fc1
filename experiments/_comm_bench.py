"""bench_comm's plan and analysis (no flags, so tests can import it).

Scenarios: 4 workers on hosts of known speed, each step padded to ``compute_s`` × the host's
factor (``equal``: static:1,1,1,1; ``straggler``: static:1,1,1,3), at link speeds where the
baseline's communication is ``ratio`` × ``compute_s``: for the parameter server a push plus a
pull, 2 (α + b / β) = ratio × C; for all-reduce a ring all-reduce of the gradient,
`Links.all_reduce_s` = ratio × C (α = 1 ms, less for 64 workers and more, where the ring's
2 (n − 1) latencies alone would exceed it: `Setup.allreduce_link`; b the model's bytes). Both
are `hetjax.core.LinkCost.for_time`: the α–β model solved for β.

Measures, per run: ``iter_time_s``, the workers' mean iteration time (the first
``WARM_UP`` steps left out); ``iterations_to_target``, global batches of gradients applied
(parameter server: pushes / workers; all-reduce: steps) until the full data set's mean loss at
the parameters (the server's after every global batch of pushes; the all-reduce's exact ones,
on worker 0, after every step), its trailing mean over ``SMOOTH`` global batches, first
reaches the target — the synchronous scheme's (ps-bsp; allreduce-sync) at two thirds of its
run; the time to the target, from the first global batch applied to the one that reaches it
(a parameter server's on its clock, `curve_seconds`; all-reduce's those steps × the mean
iteration time); eager pull runs `EAGER_BUDGET` × the global batches, about the baseline's wall
time; and ``final_loss``, that
loss averaged over the last
tenth of the run (`final`; ``last_loss``: at the final parameters alone) (``diverged``: not
finite, or above the first loss; then reported as None).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import statistics

import numpy as np

from hetjax.core import LinkCost, ring_bytes, ring_steps

WORKERS = 4
ALPHA_S = 1e-3
WARM_UP = 3
SMOOTH = 3
HOSTS = {'equal': 'static:1,1,1,1', 'straggler': 'static:1,1,1,3',
         'equal-long': 'static:1,1,1,1'}   # the full bench's all-reduce run to a plateau
PS_SCHEMES = {  # name -> ps spec; the first is the baseline
    'ps-asp': 'asp',
    'ps-bsp': 'bsp',
    'ps-asp-stale-lr': 'asp,lr=staleness',
    'ps-eager': 'asp,eager',
    'ps-eager-stale-lr': 'asp,eager,lr=staleness',
}
AR_SCHEMES = ('allreduce-sync', 'allreduce-overlap', 'allreduce-overlap-int8')
#: Eager pull's runs take this many times the steps: its iteration is about half of
#: push-then-pull's where communication = compute, so they get about the baseline's wall time
#: (1.2–1.3× it at ratios 0.5 and 2), time in which to reach the target at their staleness.
EAGER, EAGER_BUDGET = ('ps-eager', 'ps-eager-stale-lr'), 2
BASELINE = {'ps': 'ps-asp', 'allreduce': 'allreduce-sync'}
BSP = {'ps': 'ps-bsp', 'allreduce': 'allreduce-sync'}
MEASURED = 'measured: launched workers on hosts of known speed'
VIRTUAL = 'virtual clock'


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every run of one bench shares."""

  compute_s: float = 0.04
  steps: int = 40
  global_batch: int = 128
  lr: float = 0.3
  model: tuple = (('hidden', 64), ('width', 32))
  model_bytes: int = 26280    # the mlp's float32 parameters at hidden 64, width 32

  def ps_network(self, ratio: float) -> str:
    """Links where a push plus a pull takes ``ratio`` × the compute."""
    return _spec(self.ps_link(ratio))

  def ps_link(self, ratio: float) -> LinkCost:
    """The link of `ps_network`: α = 1 ms, one transfer (α + b / β) half the communication."""
    return LinkCost.for_time(ratio * self.compute_s / 2, 1, self.model_bytes, ALPHA_S)

  def allreduce_network(self, ratio: float, workers: int = WORKERS) -> str:
    """Links where a ring all-reduce of the gradient takes ``ratio`` × the compute."""
    return _spec(self.allreduce_link(ratio, workers))

  def allreduce_link(self, ratio: float, workers: int) -> LinkCost:
    """The link of `allreduce_network`: α = 1 ms, or less where the ring's 2 (n − 1) latencies
    would take more than a quarter of the all-reduce (64 workers and more)."""
    steps = ring_steps(workers)
    alpha = min(ALPHA_S, ratio * self.compute_s / (4 * steps))
    return LinkCost.for_time(ratio * self.compute_s, steps,
                             ring_bytes(self.model_bytes, workers), alpha)


def _spec(link: LinkCost) -> str:
  return f'link:{link.alpha_s * 1e3:.6g}:{link.beta_bytes_per_s / 1e6:.6g}'


def runs(setup: Setup, family: str, scenario: str, ratios) -> list[dict]:
  """The runs of one launched job: every scheme of ``family`` at every ratio, interleaved."""
  out = []
  for ratio in ratios:
    if family == 'ps':
      schemes = [(name, {'ps': spec, 'network': setup.ps_network(ratio)})
                 for name, spec in PS_SCHEMES.items()]
    else:
      schemes = [(name, {'overlap': name.startswith('allreduce-overlap'),
                         'estimate': 'int8' if name.endswith('-int8') else 'own',
                         'network': setup.allreduce_network(ratio)}) for name in AR_SCHEMES]
    for name, extra in schemes:
      steps = setup.steps * (EAGER_BUDGET if name in EAGER else 1)
      out.append({'id': f'{scenario}-{ratio:g}-{name}', 'scheme': name, 'ratio': ratio,
                  'scenario': scenario, 'hosts': HOSTS[scenario], 'compute_s': setup.compute_s,
                  'steps': steps, 'global_batch': setup.global_batch, 'lr': setup.lr,
                  'model': dict(setup.model), **extra})
  return out


# -- reading a job's output --------------------------------------------------------------------


def curve(out: pathlib.Path) -> list[float]:
  """The full-data loss after 1, 2, … global batches of gradients applied."""
  points = {int(p[0]): float(p[1]) for p in json.loads((out / 'final.json').read_text())['curve']}
  return [points[k] for k in sorted(points) if k > 0]


def curve_seconds(out: pathlib.Path) -> list[float] | None:
  """A parameter server's clock at each point of `curve`, from the first (seconds): when each
  global batch of gradients was applied; None where the points carry no time (all-reduce: its
  workers step together, so a global batch takes their mean iteration time)."""
  points = sorted(json.loads((out / 'final.json').read_text())['curve'])
  times = [p[2] for p in points if p[0] > 0 and len(p) > 2]
  return [t - times[0] for t in times] if times else None


def measured(out: pathlib.Path, run: dict) -> dict:
  """One run's measurements (module docstring), before the comparisons."""
  times = []
  for w in range(WORKERS):
    steps = json.loads((out / f'worker-{w}.json').read_text())['steps']
    times.append(statistics.mean(s['iter_s'] for s in steps[WARM_UP:]))
  points = curve(out)
  record = {'scheme': run['scheme'], 'scenario': run['scenario'], 'comm_ratio': run['ratio'],
            'workers': WORKERS, 'source': MEASURED, 'iter_time_s': statistics.mean(times),
            'final_loss': final(points),
            'last_loss': json.loads((out / 'final.json').read_text())['final_loss'],
            'curve_s': curve_seconds(out), 'curve': points}
  if run['scheme'].startswith('ps-'):
    server = json.loads((out / 'server-0.json').read_text())
    staleness = [s for u in server['updates'] for s in u['staleness']]
    record |= {'staleness_mean': statistics.mean(staleness) if staleness else 0.0,
               'refused': sum(server['refused'].values())}
  return record


def final(points: list[float]) -> float:
  """The mean loss over the last tenth of a run (at least 3 points): at a learning rate near
  the edge of stability single points swing ±30% (bench_comm at lr 0.3)."""
  tail = points[-max(3, len(points) // 10):]
  return float(np.mean(tail)) if tail else math.nan


def trailing_mean(values: list[float], window: int = SMOOTH) -> list[float]:
  """Each point's mean with the ``window − 1`` before it: a curve that swings (asp's jumps
  from 1.3 to 3.8 and back) does not reach a target by one lucky point."""
  return [float(np.mean(values[max(0, i - window + 1):i + 1])) for i in range(len(values))]


def first_below(values: list[float], target: float) -> int | None:
  """Iterations (1-based) until ``values`` first reaches ``target``; None if never."""
  return next((i + 1 for i, v in enumerate(values) if v <= target), None)


def compare(records: list[dict]) -> list[dict]:
  """Adds the ratios to the baseline (and BSP) of each record's family, scenario and ratio."""
  rows = []
  for r in records:
    family = 'ps' if r['scheme'].startswith('ps-') else 'allreduce'
    group = [o for o in records if o['scenario'] == r['scenario'] and
             o['comm_ratio'] == r['comm_ratio'] and o['workers'] == r['workers'] and
             o['source'] == r['source'] and o['scheme'].startswith(family)]
    base = next(o for o in group if o['scheme'] == BASELINE[family])
    bsp = next(o for o in group if o['scheme'] == BSP[family])
    smoothed = trailing_mean(bsp['curve'])
    target = smoothed[max(0, 2 * len(smoothed) // 3 - 1)]
    reached = first_below(trailing_mean(r['curve']), target)
    base_reached = first_below(trailing_mean(base['curve']), target)
    bsp_reached = first_below(smoothed, target)
    diverged = _diverged(r)
    row = {k: v for k, v in r.items() if k != 'curve'}
    row |= {'final_loss': None if diverged else r['final_loss'], 'diverged': diverged,
            'target_loss': target, 'iterations_run': len(r['curve']),
            'iterations_to_target': reached,
            'iter_time_vs_baseline': r['iter_time_s'] / base['iter_time_s'],
            'iterations_to_target_vs_baseline':
                None if reached is None or not base_reached else reached / base_reached,
            'time_to_target_vs_baseline': _time_ratio(r, reached, base, base_reached),
            'time_to_target_vs_bsp': _time_ratio(r, reached, bsp, bsp_reached),
            'final_loss_vs_bsp': None if diverged or _diverged(bsp)
            else r['final_loss'] / bsp['final_loss'], 'baseline': base['scheme']}
    rows.append(row)
  return rows


def _time_to(record: dict, reached: int) -> float:
  """Seconds from the first global batch applied to the ``reached``-th: on the server's clock
  (or the virtual clock) where the curve has times, else those steps × the mean iteration
  time (all-reduce: every worker steps together)."""
  times = record.get('curve_s')
  return times[reached - 1] if times else (reached - 1) * record['iter_time_s']


def _time_ratio(record: dict, reached: int | None, other: dict, other_reached: int | None
                ) -> float | None:
  if reached is None or not other_reached:
    return None
  theirs = _time_to(other, other_reached)
  return _time_to(record, reached) / theirs if theirs > 0 else None


def _diverged(record: dict) -> bool:
  loss = record['final_loss']
  return loss is None or not math.isfinite(loss) or loss > record['curve'][0]


def table(rows: list[dict]) -> str:
  head = (f'{"scheme":20s} {"scenario":9s} {"comm":>4s} {"n":>5s} {"source":8s} {"iter_s":>7s} '
          f'{"iter/base":>9s} {"it→tgt":>6s} {"/base":>6s} {"t/base":>6s} {"t/bsp":>6s} '
          f'{"final":>7s} '
          f'{"/bsp":>6s}')
  lines = [head]
  for r in rows:
    lines.append(
        f'{r["scheme"]:20s} {r["scenario"]:9s} {r["comm_ratio"]:4g} {r["workers"]:5d} '
        f'{r["source"][:8]:8s} {r["iter_time_s"]:7.4f} {r["iter_time_vs_baseline"]:9.2f} '
        f'{_fmt(r["iterations_to_target"], "6d")} '
        f'{_fmt(r["iterations_to_target_vs_baseline"], "6.2f")} '
        f'{_fmt(r["time_to_target_vs_baseline"], "6.2f")} '
        f'{_fmt(r["time_to_target_vs_bsp"], "6.2f")} '
        f'{"diverged" if r["diverged"] else _fmt(r["final_loss"], "7.3f")} '
        f'{_fmt(r["final_loss_vs_bsp"], "6.3f")}')
  return '\n'.join(lines)


def _fmt(value, spec: str) -> str:
  width = int(spec.split('.')[0].rstrip('df') or 0)
  return ' ' * (width - 1) + '—' if value is None else format(value, spec)


def goals(rows: list[dict]) -> list[str]:
  """The issue's three goals, each with the numbers it was decided on (measured rows only)."""
  out = []
  m = [r for r in rows if r['source'] == MEASURED]

  def get(scheme, scenario, ratio=1.0):
    return next((r for r in m if r['scheme'] == scheme and r['scenario'] == scenario and
                 r['comm_ratio'] == ratio), None)

  eager = get('ps-eager', 'equal')
  if eager:
    less = 1 - eager['iter_time_vs_baseline']
    out.append(f'eager pull: {less:.0%} less time per iteration than push-then-pull asp where '
               f'communication = compute (goal >= 40%): {"met" if less >= 0.4 else "NOT met"}')
  for scheme, plain in (('ps-eager-stale-lr', 'ps-eager'), ('ps-asp-stale-lr', 'ps-asp')):
    a, b = get(scheme, 'straggler'), get(plain, 'straggler')
    if a and b:
      ia, ib = a['iterations_to_target'], b['iterations_to_target']
      if ia is None:
        verdict = f'{scheme} did not reach the target ({a["target_loss"]:.3f}): NOT met'
      elif ib is None:
        verdict = (f'{scheme} reached it in {ia}, {plain} never in {b["iterations_run"]}: '
                   'met')
      else:
        fewer = 1 - ia / ib
        verdict = f'{ia} vs {ib} iterations, {fewer:.0%} fewer: {"met" if fewer >= 0.25 else "NOT met"}'
      out.append(f'staleness-aware rate with a 3x straggler, {scheme} vs {plain} (goal >= 25% '
                 f'fewer iterations to the target): {verdict}')
  for scenario in ('equal', 'straggler'):
    row = get('ps-eager-stale-lr', scenario)
    if row:
      it, t = row['iterations_to_target'], row['time_to_target_vs_bsp']
      shown = (f'never in {row["iterations_run"]} iterations' if it is None else
               f'in {it} iterations, {t:.2f}x ps-bsp\'s time')
      out.append(f'eager pull with the staleness-aware rate reaches the synchronous target '
                 f'({scenario}): {shown}: {"met" if it is not None else "NOT met"}')
  for scheme, name in (('allreduce-overlap', 'all-reduce scheduler'),
                       ('allreduce-overlap-int8', 'all-reduce scheduler, int8 estimate')):
    overlap, long = get(scheme, 'equal'), get(scheme, 'equal-long')
    if long:
      loss = long['final_loss_vs_bsp']
      shown = 'diverged' if loss is None else f'{loss:.4f}x'
      out.append(f'{name} run to a plateau ({long["iterations_run"]} iterations): '
                 f'{1 - long["iter_time_vs_baseline"]:.0%} less time per iteration, final loss '
                 f'{shown} BSP\'s (goal: at most 1% above): '
                 f'{"met" if loss is not None and loss <= 1.01 else "NOT met"}')
    if overlap:
      faster = 1 - overlap['iter_time_vs_baseline']
      loss = overlap['final_loss_vs_bsp']
      ok = faster >= 0.2 and loss is not None and loss <= 1.01
      shown = 'diverged' if loss is None else f'{loss:.4f}x'
      out.append(f'{name}: {faster:.0%} less time per iteration than synchronous all-reduce '
                 f'where communication = compute, final loss {shown} BSP\'s (goal >= 20%, and '
                 f'the loss at most 1% above): {"met" if ok else "NOT met"}')
  return out


# -- the virtual clock ---------------------------------------------------------------------------

VIRTUAL_SCHEMES = ('ps-asp', 'ps-bsp', 'ps-eager', 'ps-eager-stale-lr', 'allreduce-sync',
                   'allreduce-overlap')


def virtual_records(setup: Setup, workers: int, scenario: str, ratio: float, iterations: int,
                    lr: float) -> list[dict]:
  """The same comparisons on the virtual clock (`hetjax.simulation.simulate_comm`): ``workers``
  workers (``straggler``: the last one 3× slow), the links of ``ratio`` as in the measured
  runs, a noisy least-squares problem (its full-data excess loss is the loss), one ``lr`` for
  every scheme; ``iterations`` global batches of gradients each (eager pull `EAGER_BUDGET`
  times that)."""
  from hetjax.emulation import Links
  from hetjax.simulation import simulate_comm
  compute = [setup.compute_s] * workers
  if scenario == 'straggler':
    compute[-1] *= 3
  b = setup.model_bytes
  ps_link, ar_link = setup.ps_link(ratio), setup.allreduce_link(ratio, workers)
  out = []
  for scheme in VIRTUAL_SCHEMES:
    link = ps_link if scheme.startswith('ps-') else ar_link
    links = Links((link.alpha_s,) * workers, (link.beta_bytes_per_s,) * workers)
    asynchronous = scheme.startswith('ps-') and scheme != 'ps-bsp'
    every = workers if asynchronous else 1
    budget = iterations * (EAGER_BUDGET if scheme in EAGER else 1)
    run = simulate_comm(scheme, compute, links, b, budget * every, lr)
    points = [float(x) for x in run.losses[every - 1::every]]
    applied = run.update_times[every - 1::every]
    record = {'scheme': scheme, 'scenario': scenario, 'comm_ratio': ratio, 'workers': workers,
              'source': VIRTUAL, 'iter_time_s': run.iter_s, 'final_loss': final(points),
              'last_loss': points[-1], 'curve': points,
              'curve_s': [float(t - applied[0]) for t in applied]}
    if scheme.startswith('ps-'):
      record |= {'staleness_mean': float(np.mean(run.staleness)) if len(run.staleness) else 0.0,
                 'refused': run.refused}
    out.append(record)
  return out
