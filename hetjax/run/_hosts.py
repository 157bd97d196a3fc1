"""Hosts of known speed for the run's programs, each built by `hetjax.emulation.build_host` (the
one builder: a given or calibrated cost, `MARGIN`, agreed across workers) from what the program
can time, and taken by the program (`hetjax.core.StepProgram.use_host`): the share and token
steps (`emulated_host`: a line fitted to local gradients), SchMP rounds (`schmp_host`) and a
plan's pipeline stages (`stage_host`: a roofline pace, not a cost per row). A pipeline replica's and a
parameter-server worker's hosts are built beside their modes (`_replicas`, `_ps_run`).
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from hetjax import emulation, pipeline, planner
from hetjax.emulation import MARGIN as MARGIN

STREAM_CALLS = 24  # token-shaped calibration: calls per size, the sizes alternating
TAIL = 0.9  # … and the quantile of its slow spells the host covers


def stage_host(trainer, programs, trace, ctx, channel, margin: float = MARGIN
               ) -> pipeline.StagePace:
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
  trainer.use_host(pace)
  return pace


def schmp_host(ctx, program, policy, trace, channel, host_row_s: float = 0.0, rounds: int = 3
               ) -> emulation.KnownSpeedHost:
  """This worker's host of known speed for SchMP rounds, attached to ``program``: a unit of its
  work (`SchmpProgram.local_work`: rows, or the app's ratings or tokens) costs the largest
  median round time any worker measured over ``rounds`` rounds (run here on a fresh state, all
  workers at once, before the clock starts) per unit of the average worker's work
  (`SchmpProgram.mean_work`: the padded program takes as long for a small share as for a
  large one), times `MARGIN`, times the trace's slowdown. ``host_row_s``: that cost per unit
  instead."""
  calibration = None
  if not host_row_s:
    first = policy.update(policy.init(), None)[0]
    calibration = emulation.Calibration(
        lambda units: float(np.median(program.time_rounds(first, rounds))),
        (max(program.mean_work(first.offset), 1),), repeats=1)
  host = emulation.build_host(trace, ctx.worker, ctx.workers, calibration=calibration,
                              row_s=host_row_s, board=channel)
  program.use_host(host)
  return host


def emulated_host(ctx, trainer, trace, channel, *, host_row_s: float = 0.0,
                  host_fixed_s: float = 0.0,
                  token_rows: int | None = None) -> emulation.KnownSpeedHost | None:
  """This worker's emulated host, when a slowdown ``trace`` is given, attached to ``trainer``
  (a `WorkerTrainer`, or a `TokenTrainer` with ``token_rows``, its token size): every worker
  runs as a host of one calibrated cost (the largest any worker measured, times `MARGIN`)
  slowed by the trace. ``host_row_s`` given: that cost per row, and ``host_fixed_s`` fixed
  (a calibrated run's ``run.json`` numbers give the same hosts again).

  Workers of different device counts: a worker of k devices, where the fewest any worker has
  is k₀, is a host of speed k / k₀ (`KnownSpeedHost.speed`: its per-row cost divided by it; its
  devices as fast as the others'), so a 2-device worker among 1-device ones is twice as fast
  per row at the same slowdown. The common cost (and ``host_row_s``) is then that of a k₀-device
  worker; each worker calibrates at its uniform share (equal rows per device) and publishes its
  per-row cost times its speed, so the largest holds for every worker.

  Every worker calibrates at once, so the timings carry the contention of a step in which all
  of them compute. Share steps (one call a step): medians of `WorkerTrainer.time_gradient` at
  a uniform share and a quarter of one. Token steps (``token_rows``: a stream of calls, one per
  token): `STREAM_CALLS` single calls at the token size and at a uniform share, alternating,
  and the line scaled to the `TAIL` quantile of the slow spells they meet
  (`hetjax.emulation.calibrate_row_cost`'s ``tail``). With workers pinned to cores (what the
  token benchmark does) the tail is close to the median and the margin decides. A cost per row
  the timing noise hides (a small model; four workers on two cores) is measured again, then
  taken as all per row (`hetjax.emulation.build_host`), never a failed job.
  """
  if trace is None:
    return None
  counts = [math.prod(shape) for shape in trainer.local_shapes]
  speed = counts[ctx.worker] / min(counts)
  calibration = None
  if not host_row_s:
    degree = trainer.local_batch_degree
    share = trainer.global_batch * counts[ctx.worker] // sum(counts)
    rows = max(degree, share // degree * degree)
    state = trainer.init_state()
    if token_rows:
      calibration = emulation.Calibration(_one_call(trainer, state, (token_rows, rows)),
                                          (token_rows, rows), STREAM_CALLS, TAIL)
    else:
      calibration = emulation.Calibration(
          lambda n: float(np.median(trainer.time_gradient(state, n))),
          (max(rows // 4 // degree * degree, degree), rows))
  host = emulation.build_host(trace, ctx.worker, ctx.workers, calibration=calibration,
                              row_s=host_row_s, fixed_s=host_fixed_s, speed=speed, board=channel)
  trainer.use_host(host)
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
