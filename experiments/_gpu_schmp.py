"""gpu_check's SchMP part: Lasso rounds per second on the accelerator against the CPU.

One Lasso problem (`hetjax.data.correlated_design` through ``make_app('lasso', …)``, as
``experiments/schmp.py --app=lasso`` makes it: λ = λ_max / 10, SchMP's dynamic scheduler with
its default current priorities, 32 slots) runs on a mesh of one device twice: on the default
backend's first device (``jax.devices()[0]``: the GPU on a GPU machine) and on the CPU
(``jax.devices('cpu')[0]``). On a machine whose default backend is the CPU both are the same
device; the two runs then repeat one another (their objectives are equal), and the rows say so.

Each run compiles its round off the clock (`SchmpProgram.time_rounds`), then trains in the one
loop (`hetjax.train.training_steps`) in blocks of rounds (`Pace`), waiting for the device at
each block's end. The first block is a warm-up and is not timed; the rate is the median over
the timed blocks of rounds / seconds (``measured`` lists them). The CPU runs first, until its
timed blocks reach a few seconds (`size` says why the CPU sets the pace); the default device
then runs at least as many rounds and fetches β at the round the CPU stopped at (off the
clock), and keeps timing blocks past it for as long as its own pace asks, so that a millisecond
round is not timed from a handful of blocks. Each objective ½‖y − Xβ‖² + λ‖β‖₁ is recomputed
from its β on the host in float64, so that the two values differ only by what the rounds did.

The two objectives agree closely but need not be equal: the accelerator's float32 sums come in
another order than the CPU's, so two coordinates of near-equal priority can swap places in a
schedule and the runs then follow slightly different paths. ``objective_rel_diff`` is
|f_device − f_cpu| / |f_cpu|.

Example::

  rows = run(quick=True)           # two rows: the default device, then the CPU
  print('\\n'.join(markdown(rows)))
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import jax
import numpy as np

from hetjax.schmp import SchmpProgram, make_app
from hetjax.train import training_steps

PART = 'schmp'


@dataclasses.dataclass(frozen=True)
class Pace:
  """How one run is timed: blocks of ``block`` rounds (the first is the warm-up), until the
  timed blocks sum to ``min_timed_s`` and at least ``min_rounds`` rounds ran, or at
  ``max_rounds`` (multiples of ``block``)."""

  block: int
  min_timed_s: float
  min_rounds: int
  max_rounds: int


@dataclasses.dataclass(frozen=True)
class Size:
  """The problem (the design's n, d and correlated groups, `correlated_design`) and the pace of
  the CPU's run and of the default device's."""

  rows: int
  features: int
  groups: int
  group_size: int
  cpu: Pace
  device: Pace


def size(quick: bool) -> Size:
  """10³ features × 256 rows (quick), or 10⁵ features × 4096 rows (a 1.6 GB float32 design).

  The full size is set by the CPU, not the GPU: a round also reports every coordinate's
  priority, and on XLA:CPU the Σᵢ xᵢⱼ² of all d columns it recomputes is a column reduction of
  about 6 ns an element on one core (0.6 s for 10³ × 10⁵; the matrix-vector product Xᵀr takes
  0.02 s), so a CPU round of 4096 × 10⁵ takes about 2.5 s and one of 10⁴ × 10⁵ about 6 s.
  The CPU therefore runs a warm-up round and then rounds until 6 s are timed (at least two),
  and the default device compares its objective at the round the CPU stopped at.
  """
  if quick:
    return Size(rows=256, features=1024, groups=8, group_size=32,
                cpu=Pace(block=5, min_timed_s=0.3, min_rounds=15, max_rounds=20),
                device=Pace(block=5, min_timed_s=0.2, min_rounds=15, max_rounds=100))
  return Size(rows=4096, features=100_000, groups=32, group_size=32,
              cpu=Pace(block=1, min_timed_s=6.0, min_rounds=3, max_rounds=40),
              device=Pace(block=10, min_timed_s=2.0, min_rounds=30, max_rounds=2000))


def _describe(device: jax.Device) -> str:
  return f'{device.platform}:{device.id} ({device.device_kind})'


def _objective(app: Any, beta: np.ndarray) -> float:
  """½‖y − Xβ‖² + λ‖β‖₁ in float64 on the host, from β's nonzero coordinates only (a Lasso β
  is sparse: this reads a few columns of X, not all of it)."""
  beta = np.asarray(beta, np.float64)
  support = np.flatnonzero(beta)
  x, y = app.design.x, app.design.y.astype(np.float64)
  r = y - x[:, support].astype(np.float64) @ beta[support]
  return float(0.5 * r @ r + app.lam * np.abs(beta).sum())


def _train(app: Any, device: jax.Device, pace: Pace, compare_at: int | None
           ) -> dict[str, Any]:
  """Trains ``app`` on a mesh of ``device`` alone at ``pace`` (module docstring): the timed
  blocks' rates (rounds/s), the rounds run, and the objective at round ``compare_at`` (None:
  the last round run), which the run reaches whatever its pace says."""
  start = time.perf_counter()
  schedule_size = app.default_schedule_size(1)
  program = SchmpProgram(app, schedule_size, [device], seed=0, objective_every=10**9)
  policy = app.policy(schedule_size, seed=0)
  program.time_rounds(policy.update(policy.init(), None)[0], 0)  # compiles, off the clock
  min_rounds = max(pace.min_rounds, compare_at or 0)
  max_rounds = max(pace.max_rounds, -(-min_rounds // pace.block) * pace.block)
  rates: list[float] = []
  timed, beta, step = 0.0, None, 0
  last = time.perf_counter()
  for info in training_steps(program, program.init_state(), max_rounds, policy=policy):
    step = info.step
    if step == compare_at:  # fetched before the next round donates it; off the clock
      fetch = time.perf_counter()
      beta = np.asarray(jax.device_get(info.state.params['beta']))
      last += time.perf_counter() - fetch
    if step % pace.block:
      continue
    jax.block_until_ready(info.state.params)
    now = time.perf_counter()
    if step > pace.block:  # the first block is the warm-up
      rates.append(pace.block / (now - last))
      timed += now - last
    last = now
    if step >= min_rounds and timed >= pace.min_timed_s:
      break
  if compare_at is None:
    beta, compare_at = np.asarray(jax.device_get(info.state.params['beta'])), step
  return {'rates': rates, 'rounds_run': step, 'compared_at': compare_at,
          'objective': _objective(app, beta), 'schedule_size': schedule_size,
          'wall_s': time.perf_counter() - start}


def run(quick: bool) -> list[dict]:
  """Rows of the default device's run and the CPU's (module docstring); the CPU runs first and
  the round it stopped at is where both objectives are compared.

  Args:
    quick: the small problem (`size`): seconds on a CPU.

  Returns:
    Two rows, the default device's then the CPU's. Each: ``part`` ('schmp'), ``device``, ``platform``, ``role`` ('device' or 'cpu'),
  ``features``, ``rows``, ``schedule_size``, ``rounds`` (where the objectives were compared),
  ``rounds_run``, ``timed_rounds``, ``rounds_per_s`` (median of ``measured``, the timed
  blocks' rounds/s), ``objective`` (at ``rounds``), ``objective_rel_diff`` (against the CPU
  row's), ``speedup_vs_cpu`` (``rounds_per_s`` over the CPU row's), ``same_device`` (the
  default device is the CPU one), ``wall_s`` (the run, compiling included) and ``note``.
  """
  s = size(quick)
  app = make_app('lasso', scheduler='schmp', rows=s.rows, features=s.features,
                 groups=s.groups, group_size=s.group_size)
  default, cpu = jax.devices()[0], jax.devices('cpu')[0]
  same = default == cpu
  base = _train(app, cpu, s.cpu, None)
  results = {'device': _train(app, default, s.device, base['compared_at']), 'cpu': base}
  base_rate = statistics.median(base['rates'])
  rows = []
  for role, device, pace in (('device', default, s.device), ('cpu', cpu, s.cpu)):
    result = results[role]
    rate = statistics.median(result['rates'])
    note = ''
    if same:
      note = ('the default backend is the CPU: both rows ran on the same device'
              if role == 'device' else 'the same device as the row above (a repeat)')
    rows.append({
        'part': PART, 'device': _describe(device), 'platform': device.platform, 'role': role,
        'features': s.features, 'rows': s.rows, 'schedule_size': result['schedule_size'],
        'rounds': result['compared_at'], 'rounds_run': result['rounds_run'],
        'timed_rounds': len(result['rates']) * pace.block,
        'rounds_per_s': round(rate, 3), 'objective': result['objective'],
        'objective_rel_diff': abs(result['objective'] - base['objective']) /
                              abs(base['objective']),
        'speedup_vs_cpu': round(rate / base_rate, 2), 'same_device': same,
        'wall_s': round(result['wall_s'], 1), 'note': note,
        'measured': [round(r, 3) for r in result['rates']]})
  return rows


def markdown(rows: list[dict]) -> list[str]:
  """The part's report: a heading and a table of ``rows`` (`run`'s), one line each.

  Example::

    markdown(run(quick=True))[0]     # '### SchMP Lasso on the device'
  """
  lines = ['### SchMP Lasso on the device', '',
           'Lasso by SchMP (dynamic schedule, one device each), rounds per second after '
           'compiling (median of timed blocks), and the objective after the same rounds.', '',
           '| device | features | rows | rounds/s | speedup vs CPU | objective | '
           'objective diff | note |',
           '|---|---:|---:|---:|---:|---:|---:|---|']
  for r in rows:
    lines.append(f'| {r["device"]} | {r["features"]:,} | {r["rows"]:,} | '
                 f'{r["rounds_per_s"]:.3g} | {r["speedup_vs_cpu"]:.2f}× | '
                 f'{r["objective"]:.6g} (round {r["rounds"]}) | '
                 f'{r["objective_rel_diff"]:.1e} | {r["note"]} |')
  return lines
