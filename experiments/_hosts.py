"""Hosts of known speed for the modes whose work is not a batch of rows: a plan's pipeline
stages (`stage_host`) and SchMP rounds (`schmp_host`). `experiments._programs.emulated_host`
calibrates the share and token modes'.
"""

from __future__ import annotations

import numpy as np

from hetjax import emulation, pipeline, planner


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
  large one), times ``margin``, times the trace's slowdown. ``config.host_row_s``: that cost per
  unit instead."""
  row_s = config.host_row_s
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
