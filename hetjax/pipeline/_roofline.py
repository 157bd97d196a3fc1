"""Nominal costs of a plan's stage actions from their compiled programs' own work: what an
emulated stage host (`hetjax.emulation.StagePace`) pads each action to, times its slowdown."""

from __future__ import annotations

from collections.abc import Mapping

Action = tuple[int, str]  # (stage, kind)


def roofline_costs(programs: Mapping[str, object], flops_per_s: float, bytes_per_s: float,
                   margin: float) -> dict[Action, float]:
  """Nominal costs from each compiled stage program's own work: ``margin × max(FLOPs /
  flops_per_s, bytes accessed / bytes_per_s)`` per device (XLA's ``cost_analysis()`` of the
  partitioned program is per device), with rates measured while every device of the job was
  busy (`hetjax.planner.measure_cluster`).

  Why not time the actions: on a machine whose cores every worker shares, an action runs
  faster while other workers idle. A plan that leaves some workers idle would
  calibrate cheaper hosts than one that keeps all busy, and the comparison between plans would
  measure the machine's sharing, not the plans. Priced from their work at one set of rates,
  every plan's hosts are equally fast. The price is circularity: the planner's cost model uses
  the same FLOPs, bytes and rates, so the padded compute agrees with its predictions by
  construction; what stays measured is everything else (collectives, moves between groups,
  dispatch) and any action that runs past its time.

  Args:
    programs: ``{'s<stage>/<kind>': jax.stages.Compiled}`` (`hetjax.planner.CompiledPlan`).
    flops_per_s, bytes_per_s: one device's rates.
    margin: > 1 leaves room for what the roofline does not see (dispatch, small kernels).
  """
  out = {}
  for key, compiled in programs.items():
    stage, kind = key.split('/')
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    work = max(analysis.get('flops', 0.0) / flops_per_s,
               analysis.get('bytes accessed', 0.0) / bytes_per_s)
    out[int(stage.removeprefix('s')), kind] = margin * work
  return out
