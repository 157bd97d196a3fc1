"""LB-BSP's GPU curve: one device's step time against batch size, fitted, and the split it gives.

LB-BSP's GPU mode (`hetjax.balance.LBBSPGpu`) models a worker's compute time as
t(x) = max(c, a + b·x): flat while the device is not saturated, a line beyond. This part
measures that curve on the default backend's first device for two shipped models, fits it with
`fit_time_model`, and reports how far the fit is from the measured times (the goal on a GPU:
within 10%). It then asks the fit what LB-BSP would do with this device beside one of half its
speed (the same curve, every coefficient doubled): `finish_time_shares` of the largest batch
that fit, against the split in proportion to speed (2:1), which mis-splits a flat curve.

What is measured and what is modelled: the step times (``step_s``: after an untimed compile,
the median over blocks of training steps dispatched back to back) are measured; the fit, its
errors against the measured times, the shares and every predicted time come from the fit, and
the half-speed device is assumed, not run. Each row's ``measured`` and ``modelled`` lists name
the fields.

  rows = run(quick=True)          # tiny models, batches 2 … 16: 15-30 s on 2 CPU cores
  print('\\n'.join(markdown(rows)))
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from hetjax.balance import TimeModel, finish_time_shares, fit_time_model
from hetjax.models import make_task
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Trainer

PART = 'lbbsp_curve'
GOAL_REL_ERR = 0.10  # the fit's largest error against a measured time, as a fraction of it
SLOW = 2.0  # the other device's time factor: half this device's speed

#: Tiny models for the CPU check (``--quick``).
QUICK_MODELS = {
    'mlp': {'hidden': 64, 'width': 32},
    'gpt': {'d_model': 32, 'heads': 2, 'layers': 1, 'mlp': 64, 'seq_len': 16},
}
QUICK_SIZES = (2, 4, 8, 16)

#: Models that saturate a GPU at moderate batches. The MLP is widened from its default (256,
#: 128), whose step on a GPU is launch overhead at these batches: a curve without a knee does
#: not test the fit. Its ladder runs further because its steps are short.
FULL_MODELS = {
    'mlp': {'hidden': 8192, 'width': 8192},
    'gpt': {'d_model': 768, 'heads': 12, 'layers': 4, 'mlp': 3072, 'seq_len': 512,
            'dtype': 'bfloat16'},
}
FULL_SIZES = {'mlp': tuple(2**k for k in range(13)), 'gpt': tuple(2**k for k in range(10))}

# Keeps the full part near 90 s on an H100: a size's timed steps take about TIMED_S, no more
# sizes once a step takes MAX_STEP_S or a model has used BUDGET_S (compiles included). Steps are
# timed in blocks of up to MAX_BLOCK, dispatched back to back and waited for once, the block's
# time divided by its steps; the median of MIN_REPS … MAX_REPS blocks. Timed one step at a time
# (the seventh session's H200 run, 41 steps a size), the mlp's 1-ms steps each paid a host wait:
# medians 0.95 ms at batch 1, 1.25 at 2, 1.11 at 8, 23% off the fitted line where the sixth
# session's run had them flat within 4%.
TIMED_S, MIN_REPS, MAX_REPS, MAX_BLOCK = 0.5, 3, 41, 8
MAX_STEP_S, BUDGET_S = 2.0, 35.0


def is_out_of_memory(err: BaseException) -> bool:
  """Whether ``err`` is XLA running out of device memory (it reports RESOURCE_EXHAUSTED)."""
  text = str(err)
  return 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower()


def measure_ladder(name: str, kwargs: Mapping[str, Any], sizes: Sequence[int],
                   budget_s: float = math.inf) -> dict:
  """Median training-step seconds of model ``name`` at each batch size in ``sizes``, in order.

  One `Trainer` on a 1x1 mesh of the first device (data-parallel rules); its jitted step is
  traced again for each batch shape. A size's first step (compile and run) is untimed, then
  ``MIN_REPS`` … ``MAX_REPS`` blocks of steps (about ``TIMED_S`` in all) are timed, on a
  batch already on the device. The ladder stops at the first size that runs out of device
  memory (recorded, not raised), once a step takes ``MAX_STEP_S``, or once ``budget_s`` is
  spent (the full run's is `BUDGET_S` a model).

  Returns:
    ``{'batch_sizes', 'step_s', 'reps', 'block_steps', 'first_step_s', 'stopped',
    'stopped_at'}``: the sizes that ran, their medians, the blocks timed and their steps, and
    why (``'out of memory'``, ``'step time'``, ``'budget'``, or None) the ladder ended before
    its last size.
  """
  start = time.perf_counter()
  mesh = make_mesh((1, 1), devices=jax.devices()[:1])
  task = make_task(name, **kwargs)
  trainer = Trainer(task, optax.adam(1e-3), sizes[0], mesh, Strategy.DATA_PARALLEL.rules())
  state = trainer.init_state()
  out = {'batch_sizes': [], 'step_s': [], 'reps': [], 'block_steps': [], 'first_step_s': [],
         'stopped': None, 'stopped_at': None}
  batch = None
  for i, size in enumerate(sizes):
    try:
      batch = trainer.put_batch(task.data.global_batch(trainer.seed, i, size))
      t0 = time.perf_counter()
      state = jax.block_until_ready(trainer.train_step(state, batch))[0]  # compiles
      first = time.perf_counter() - t0
      block, state = _block_steps(trainer, state, batch)
      times = []
      while len(times) < MIN_REPS or (len(times) < MAX_REPS and sum(times) * block < TIMED_S):
        t0 = time.perf_counter()
        for _ in range(block):  # dispatched back to back: one wait a block
          state = trainer.train_step(state, batch)[0]
        jax.block_until_ready(state)
        times.append((time.perf_counter() - t0) / block)
    except jax.errors.JaxRuntimeError as err:
      if not is_out_of_memory(err):
        raise
      out['stopped'], out['stopped_at'] = 'out of memory', size
      break  # the donated state may be gone, and larger sizes need more memory still
    step_s = statistics.median(times)
    for key, value in (('batch_sizes', size), ('step_s', step_s), ('reps', len(times)),
                       ('block_steps', block), ('first_step_s', first)):
      out[key].append(value)
    if size != sizes[-1] and (step_s >= MAX_STEP_S or time.perf_counter() - start > budget_s):
      out['stopped'] = 'step time' if step_s >= MAX_STEP_S else 'budget'
      out['stopped_at'] = sizes[i + 1]
      break
  del state, trainer, batch
  gc.collect()  # this model's buffers go before the next model's are made
  return out


def _block_steps(trainer: Trainer, state: Any, batch: Any) -> tuple[int, Any]:
  """One step timed alone (waited for): the block size it implies (steps enough for a tenth
  of ``TIMED_S``, 1 … ``MAX_BLOCK``) and the state after it."""
  t0 = time.perf_counter()
  state = jax.block_until_ready(trainer.train_step(state, batch))[0]
  one = time.perf_counter() - t0
  return int(min(MAX_BLOCK, max(1, TIMED_S / 10 // max(one, 1e-9)))), state


def curve_row(name: str, kwargs: Mapping[str, Any], ladder: Mapping[str, Any]) -> dict:
  """The fit of ``ladder``'s times and the shares beside a half-speed device, as one row.

  E.g. times max(1 ms, 0.5 ms + 10 µs·x) measured at 1 … 512 rows fit exactly; beside a device
  taking twice as long, the 512 rows split 358 here and 154 there, both 4.08 ms, where the 2:1
  split (341, 171) takes the slow device 4.41 ms. With a curve flat past X, the other device
  keeps its one-row minimum and sets the step time.
  """
  xs, ts = np.array(ladder['batch_sizes'], float), np.array(ladder['step_s'])
  row = {'part': PART, 'model': name, 'config': dict(kwargs), **ladder}
  if len(xs) < 2:
    return {**row, 'measured': ['batch_sizes', 'step_s', 'reps', 'block_steps', 'first_step_s'],
            'modelled': [], 'fit_max_rel_err': math.nan}
  fit = fit_time_model(xs, ts)
  fitted = fit.time(xs)
  err = np.abs(fitted - ts) / ts
  slow = TimeModel(*(SLOW * v for v in (fit.floor_s, fit.intercept_s, fit.slope_s)))
  total = int(xs[-1])  # the largest batch that fit, as the global batch of the two
  # At least a row each (ShareRules' default minimum: no worker is dropped), at most ``total``.
  _, shares = finish_time_shares([fit, slow], total, [1, 1], [total, total])
  share_s = [float(fit.time(shares[0])), float(slow.time(shares[1]))]
  proportional = total * np.array([SLOW, 1.0]) / (SLOW + 1)
  prop_s = [float(fit.time(proportional[0])), float(slow.time(proportional[1]))]
  return {
      **row,
      'fit_floor_s': fit.floor_s, 'fit_intercept_s': fit.intercept_s,
      'fit_slope_s': fit.slope_s, 'fit_s': fitted.tolist(),
      'fit_max_rel_err': float(err.max()), 'fit_mean_rel_err': float(err.mean()),
      'global_batch': total, 'slow_factor': SLOW,
      'shares': [float(s) for s in shares],
      'share_s': share_s, 'finish_s': max(share_s),
      'proportional_shares': proportional.tolist(), 'proportional_share_s': prop_s,
      'proportional_finish_s': max(prop_s),
      'speedup_vs_proportional': max(prop_s) / max(share_s),
      'measured': ['batch_sizes', 'step_s', 'reps', 'block_steps', 'first_step_s'],
      'modelled': ['fit_floor_s', 'fit_intercept_s', 'fit_slope_s', 'fit_s', 'fit_max_rel_err',
                   'fit_mean_rel_err', 'shares', 'share_s', 'finish_s', 'proportional_shares',
                   'proportional_share_s',
                   'proportional_finish_s', 'speedup_vs_proportional'],
  }


def run(quick: bool) -> list[dict]:
  """One row per model: the measured curve on ``jax.devices()[0]``, its fit and the shares.

  Args:
    quick: tiny models at batches 2 … 16 (the CPU check); else `FULL_MODELS` from one row up
      to 512 (the MLP 4096) or the first size that runs out of memory.
  """
  device = jax.devices()[0]
  rows = []
  for name, kwargs in (QUICK_MODELS if quick else FULL_MODELS).items():
    sizes = QUICK_SIZES if quick else FULL_SIZES[name]
    ladder = measure_ladder(name, kwargs, sizes, math.inf if quick else BUDGET_S)
    row = curve_row(name, kwargs, ladder)
    rows.append({**row, 'platform': device.platform, 'device': device.device_kind,
                 'quick': quick})
  return rows


def _ms(seconds: float) -> str:
  return f'{1e3 * seconds:.3g}'


def markdown(rows: list[dict]) -> list[str]:
  """A heading, a table of measured step times, one of the fits and shares, the goal line."""
  rows = [r for r in rows if r['part'] == PART]
  lines = ["### LB-BSP's GPU curve", '']
  if not rows:
    return [*lines, 'no rows']
  r0 = rows[0]
  lines += [f'{r0["device"]} ({r0["platform"]}); training step (forward, backward, Adam) on '
            'one device, after an untimed compile; per step, the median over blocks of steps '
            'dispatched back to back, each block waited for once. Measured:', '']
  sizes = sorted({x for r in rows for x in r['batch_sizes']} |
                 {r['stopped_at'] for r in rows if r['stopped_at']})
  lines += ['| model | ' + ' | '.join(f'{x}' for x in sizes) + ' |',
            '|---|' + '---:|' * len(sizes)]
  for r in rows:
    ms = dict(zip(r['batch_sizes'], r['step_s'], strict=True))
    cells = [_ms(ms[x]) if x in ms else ('OOM' if x == r['stopped_at'] and
                                         r['stopped'] == 'out of memory' else '—') for x in sizes]
    lines.append(f'| {r["model"]} | ' + ' | '.join(cells) + ' |')
  lines += ['', 'ms per step by batch size; OOM: out of device memory; —: not run (the ladder '
            f'stops at a {MAX_STEP_S:g} s step or after {BUDGET_S:g} s a model). Modelled, from '
            'the fit t(x) = max(c, a + b·x), and the shares of the largest batch X beside a '
            f'device of half the speed (every coefficient x{SLOW:g}, assumed):', '',
            '| model | c ms | a ms | b µs/row | max err | mean err | X | shares (this, half) '
            '| finish ms | 2:1 split ms | speed-up |',
            '|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|']
  for r in rows:
    if 'fit_floor_s' not in r:
      lines.append(f'| {r["model"]} | fewer than two sizes ran: no fit |' + ' |' * 9)
      continue
    s = r['shares']
    lines.append(
        f'| {r["model"]} | {_ms(r["fit_floor_s"])} | {_ms(r["fit_intercept_s"])} | '
        f'{1e6 * r["fit_slope_s"]:.3g} | {100 * r["fit_max_rel_err"]:.1f}% | '
        f'{100 * r["fit_mean_rel_err"]:.1f}% | {r["global_batch"]} | {s[0]:.1f}, {s[1]:.1f} | '
        f'{_ms(r["finish_s"])} | {_ms(r["proportional_finish_s"])} | '
        f'{r["speedup_vs_proportional"]:.2f}x |')
  worst = max(r['fit_max_rel_err'] for r in rows)
  if any(math.isnan(r['fit_max_rel_err']) for r in rows):
    worst = math.nan  # a model without a fit does not meet the goal
  met = 'met' if worst <= GOAL_REL_ERR else 'not met'
  lines += ['', f'goal: fit within {100 * GOAL_REL_ERR:.0f}% of measured: {met} '
            f'(max {100 * worst:.1f}%)']
  return lines
