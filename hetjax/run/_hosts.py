"""Hosts of known speed: the share and token modes' (`emulated_host`: a calibrated cost per
row), a plan's pipeline stages (`stage_host`) and SchMP rounds (`schmp_host`).
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from hetjax import ConfigError, emulation, pipeline, planner


def stage_host(trainer, programs, trace, ctx, channel, margin: float) -> pipeline.StagePace:
  """This worker's host of known speed for a plan's stages (`hetjax.pipeline.StagePace`),
  attached to ``trainer``: each action of its stages takes ``margin`` × its compiled program's
  roofline at one device's FLOP/s and memory bandwidth, measured with every device of the job
  busy (`hetjax.planner.measure_cluster`, worker 0's numbers for all) — the same hosts for any
  plan (`hetjax.pipeline.roofline_costs` says why) — times the trace's slowdown."""
  measured = planner.measure_cluster().workers[0]  # a collective: every worker takes part
  rates = [measured.flops_per_s, measured.memory_bytes_per_s or measured.flops_per_s]
  if channel is not None and ctx.workers > 1:
    if ctx.is_chief:
      channel.set('stage-host/rates', rates)
    rates = channel.get('stage-host/rates')
  pace = pipeline.StagePace(trace, ctx.worker,
                            pipeline.roofline_costs(programs, rates[0], rates[1], margin))
  trainer.pace = pace
  return pace


def schmp_host(config, ctx, program, policy, trace, channel, margin: float, rounds: int = 3
               ) -> emulation.KnownSpeedHost:
  """This worker's host of known speed for SchMP rounds, attached to ``program``: a unit of its
  work (`SchmpProgram.local_work`: rows, or the app's ratings or tokens) costs the largest
  median round time any worker measured over ``rounds`` rounds (run here on a fresh state, all
  workers at once, before the clock starts) per unit of the average worker's work
  (`SchmpProgram.mean_work`: the padded program takes as long for a small share as for a
  large one), times ``margin``, times the trace's slowdown. ``config.emulation.host_row_s``: that cost per
  unit instead."""
  row_s = config.emulation.host_row_s
  if not row_s:
    first = policy.update(policy.init(), None)[0]
    times = program.time_rounds(first, rounds)
    row_s = margin * float(np.median(times)) / max(program.mean_work(first.offset), 1)
    if channel is not None and ctx.workers > 1:
      channel.set(f'schmp-host/{ctx.worker}', row_s)
      row_s = max(channel.get(f'schmp-host/{w}') for w in range(ctx.workers))
  host = emulation.KnownSpeedHost(trace, ctx.worker, row_s)
  program.host = host
  return host


MARGIN = 1.5  # host time over the calibrated compute: 1.25 left 10–30% of steps overrunning
STREAM_CALLS = 24  # token-shaped calibration: calls per size, the sizes alternating
TAIL = 0.9  # … and the quantile of its slow spells the host covers


def emulated_host(config, ctx, trainer, trace, channel, attempts: int = 3
                  ) -> emulation.KnownSpeedHost | None:
  """This worker's emulated host, when a slowdown is given, attached to ``trainer``: every
  worker runs as a host of one calibrated cost (the largest any worker measured, times
  `MARGIN`) slowed by the trace. ``config.emulation.host_row_s`` given: that cost per row, nothing fixed.

  Workers of different device counts: a worker of k devices, where the fewest any worker has
  is k₀, is a host of speed k / k₀ (`KnownSpeedHost.speed`: its per-row cost divided by it; its
  devices as fast as the others'), so a 2-device worker among 1-device ones is twice as fast
  per row at the same slowdown. The common cost (and ``host_row_s``) is then that of a k₀-device
  worker; each worker calibrates at its uniform share (equal rows per device) and publishes its
  per-row cost times its speed, so the largest holds for every worker.

  Every worker calibrates at once, so the timings carry the contention of a step in which all
  of them compute. Share steps (one call a step): medians of `WorkerTrainer.time_gradient` at
  a uniform share and a quarter of one. Token steps (mode tokens: a stream of calls, one per
  token): `STREAM_CALLS` single calls at the token size and at a uniform share, alternating,
  and the line scaled to the `TAIL` quantile of the slow spells they meet
  (`hetjax.emulation.calibrate_row_cost`'s ``tail``). With workers pinned to cores (what the
  token benchmark does) the tail is close to the median and the margin decides. Four workers on two cores can time the larger size no slower than the
  smaller (no cost per row found): such a worker measures again, up to ``attempts`` times,
  before it publishes.
  """
  if trace is None:
    return None
  counts = [math.prod(shape) for shape in trainer.local_shapes]
  speed = counts[ctx.worker] / min(counts)
  row_s, fixed_s = config.emulation.host_row_s, 0.0
  if not row_s:
    degree = trainer.local_batch_degree
    share = config.data.global_batch * counts[ctx.worker] // sum(counts)
    rows = max(degree, share // degree * degree)
    state = trainer.init_state()
    from hetjax.run._build import Mode, default_token_rows, mode_of  # (imports this module)
    if mode_of(config, ctx) is Mode.TOKENS:
      tokens = config.balance.token_rows or default_token_rows(config.data.global_batch, ctx.workers, degree)
      sizes, measure = (tokens, rows), _one_call(trainer, state, (tokens, rows))
      kwargs = {'repeats': STREAM_CALLS, 'tail': TAIL}
    else:
      sizes = (max(rows // 4 // degree * degree, degree), rows)
      measure, kwargs = (lambda n: float(np.median(trainer.time_gradient(state, n)))), {}
    for attempt in range(1, attempts + 1):
      try:
        cost = emulation.calibrate_row_cost(measure, sizes, margin=MARGIN, **kwargs)
        break
      except ConfigError as e:
        if attempt == attempts:
          raise
        print(f'worker {ctx.worker}: host calibration {attempt} of {attempts} failed ({e}); '
              'measuring again', flush=True)
    row_s, fixed_s = cost.row_s * speed, cost.fixed_s
    if channel is not None and ctx.workers > 1:  # one host model for all: the slowest probe
      channel.set(f'calibrate/{ctx.worker}', [row_s, fixed_s])
      costs = [channel.get(f'calibrate/{w}') for w in range(ctx.workers)]
      row_s, fixed_s = max(c[0] for c in costs), max(c[1] for c in costs)
  host = emulation.KnownSpeedHost(trace, ctx.worker, row_s, fixed_s, speed=speed)
  trainer.host = host
  return host


def _one_call(trainer, state, sizes):
  """``measure(rows)``: the seconds of one local gradient of ``rows`` rows, each size's batch
  placed and its program compiled beforehand."""
  batches = {}
  for n in sizes:
    batches[n] = trainer.place(trainer.task.data.global_batch(trainer.seed, 0, n))
    trainer.time_gradient(state, n, repeats=1)

  def measure(rows: int) -> float:
    start = time.perf_counter()
    jax.block_until_ready(trainer.local_gradient(state, batches[rows]))
    return time.perf_counter() - start

  return measure
