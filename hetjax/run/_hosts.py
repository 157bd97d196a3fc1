"""Hosts of known speed for the run's programs, each built by `hetjax.emulation.build_host` (the
one builder: a given or calibrated cost, `MARGIN`, agreed across workers) from what the program
can time, and taken by the program (`hetjax.core.StepProgram.use_host`): the share and token
steps (`emulated_host`: a line fitted to local gradients), SchMP rounds (`schmp_host`) and a
plan's pipeline stages (`stage_host`: a roofline pace, not a cost per row). A pipeline replica's
and a parameter-server worker's hosts are built beside their modes (`_replicas`, `_ps_run`).
Every one is a `hetjax.core.Pace`: the program calls it and never asks which it is.

A run records the hosts it emulated in ``run.json`` (`recorded`), and another run emulates them
again with ``emulation.hosts=RUN_DIR`` (`reuse`): two policies compared on one cluster, not on
two calibrations of a busy machine (two runs' calibrations can come out severalfold apart).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from hetjax import ConfigError, emulation, pipeline, planner
from hetjax.emulation import MARGIN as MARGIN
from hetjax.run._config import Config
from hetjax.run._sections import Mode

STREAM_CALLS = 24  # token-shaped calibration: calls per size, the sizes alternating
TAIL = 0.9  # … and the quantile of its slow spells the host covers
#: ``run.json``'s list of the calibration's retries (`hetjax.emulation.build_host`'s
#: ``record``): kept out of the console, kept with the run.
RETRIES = 'host_calibration_retries'
#: ``run.json``'s ``host_source``: where the run's hosts came from.
CALIBRATED, DECLARED, REUSED = 'calibrated', 'declared', 'reused'
#: The modes whose hosts have a fixed cost a step beside the cost per row.
def reuse(config: Config, mode: Mode, slowdown: str | None, hosts: str) -> Config:
  """``config`` with the hosts of the run directory ``emulation.hosts`` names pinned: its
  ``run.json``'s ``host_row_s`` and ``host_fixed_s`` (`recorded`), so that this run emulates
  that run's cluster. ``config`` itself when it names none.

  Example: a uniform run calibrates, an LB-BSP run takes its hosts::

    hetjax-train … --policy=uniform --workdir=runs/first
    hetjax-train … --policy=lbbsp --hosts=runs/first --workdir=runs/second

  Args:
    config: the run's config.
    mode: the mode it runs in (`hetjax.run.mode_of`).
    slowdown: its slowdown trace (the config's or the launcher's), or None.
    hosts: what that mode's hosts cost (`hetjax.run.ModeEntry.hosts`): ``'rows'``, ``'rows
      and fixed'``, ``'units'`` (SchMP's) or ``'stages'`` (a plan's, paced by their roofline).

  Raises:
    ConfigError: one line: no such directory or no hosts recorded there; hosts this run cannot
      take (it has no slowdown, it runs a plan's stages, its unit of work differs, or the
      recorded fixed cost meets a mode without one); or a ``host_row_s`` or ``host_fixed_s``
      of the config's own that differs.
  """
  where = config.emulation.hosts
  if where is None:
    return config
  what = f'emulation.hosts={where}'
  if not slowdown:
    raise ConfigError(f'{what} reuses emulated hosts, and this run emulates none: give it a '
                      "slowdown (--slowdown, or the launcher's)")
  if hosts == 'stages':
    raise ConfigError(f"{what}: a plan's stages are paced by their roofline, not by a cost per "
                      'row: drop hosts')
  run = _run_json(pathlib.Path(where), what)
  row, fixed = run.get('host_row_s'), run.get('host_fixed_s') or 0.0
  if not (_seconds(row) and row > 0 and _seconds(fixed)):
    raise ConfigError(f'{what}: {pathlib.Path(where) / "run.json"} records no hosts (that run '
                      "emulated none: it had no slowdown, or ran a plan's stages)")
  theirs = run.get('mode')
  if (theirs == Mode.SCHMP.value) != (hosts == 'units'):
    raise ConfigError(f"{what}: that run's hosts cost a {_unit(theirs == Mode.SCHMP.value)} "
                      f"(mode {theirs}), this run's a {_unit(hosts == 'units')} (mode "
                      f'{mode.value})')
  if fixed and hosts != 'rows and fixed':
    raise ConfigError(f'{what}: its hosts have a fixed cost a step ({fixed:.3g} s, mode '
                      f'{theirs}), and mode {mode.value} takes a cost per row alone: give '
                      f'host_row_s={row!r} instead')
  mine = config.emulation
  if (mine.host_row_s and mine.host_row_s != row) or (
      mine.host_fixed_s and mine.host_fixed_s != fixed):
    raise ConfigError(f'{what} gives host_row_s={row!r}, host_fixed_s={fixed!r}, and this config '
                      f'sets host_row_s={mine.host_row_s!r}, host_fixed_s='
                      f'{mine.host_fixed_s!r}: keep one')
  pinned = dataclasses.replace(mine, host_row_s=float(row), host_fixed_s=float(fixed))
  return dataclasses.replace(config, emulation=pinned)


def source_of(config: Config) -> str:
  """Where ``config``'s hosts come from: `REUSED` (``emulation.hosts``), `DECLARED`
  (``emulation.host_row_s``) or `CALIBRATED`."""
  if config.emulation.hosts is not None:
    return REUSED
  return DECLARED if config.emulation.host_row_s else CALIBRATED


def recorded(host: emulation.KnownSpeedHost | None, config: Config,
             retries: Sequence[str] = ()) -> dict[str, Any]:
  """``run.json``'s fields of the hosts this run emulated: ``host_row_s`` and ``host_fixed_s``
  (a speed-1 host's, as `hetjax.emulation.KnownSpeedHost` holds them: what `reuse` takes
  again), ``host_source`` (`source_of`), ``hosts_from`` (the run directory, when reused) and
  the calibration's retries (`RETRIES`: a list when calibrated). None each where no host has a
  cost per row (``host`` None: no slowdown, or a plan's stages)."""
  if host is None:
    return {'host_row_s': None, 'host_fixed_s': None, 'host_source': None, RETRIES: None}
  source = source_of(config)
  out: dict[str, Any] = {'host_row_s': host.row_s, 'host_fixed_s': host.fixed_s,
                         'host_source': source,
                         RETRIES: list(retries) if source == CALIBRATED else None}
  if source == REUSED:
    out['hosts_from'] = config.emulation.hosts
  return out


def _run_json(directory: pathlib.Path, what: str) -> dict[str, Any]:
  if not directory.is_dir():
    raise ConfigError(f'{what}: no run directory {directory}')
  path = directory / 'run.json'
  try:
    run = json.loads(path.read_text())
  except FileNotFoundError:
    raise ConfigError(f'{what}: {directory} holds no run.json (not a run directory of '
                      'hetjax-train)') from None
  except (OSError, ValueError) as e:
    raise ConfigError(f'{what}: cannot read {path}: {e}') from None
  if not isinstance(run, dict):
    raise ConfigError(f'{what}: {path} is not a JSON object')
  return run


def _seconds(value: Any) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value) and value >= 0)


def _unit(schmp: bool) -> str:
  return 'unit of SchMP work' if schmp else 'row'


def stage_host(trainer, programs, trace, ctx, channel, margin: float = MARGIN
               ) -> emulation.StagePace:
  """This worker's host of known speed for a plan's stages (`hetjax.emulation.StagePace`),
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
  pace = emulation.StagePace(trace, ctx.worker,
                             pipeline.roofline_costs(programs, rates[0], rates[1], margin))
  trainer.use_host(pace)
  return pace


def schmp_host(ctx, program, policy, trace, channel, host_row_s: float = 0.0, rounds: int = 3,
               record=None) -> emulation.KnownSpeedHost:
  """This worker's host of known speed for SchMP rounds, attached to ``program``: a unit of its
  work (`SchmpProgram.local_work`: rows, or the app's ratings or tokens) costs the largest
  median round time any worker measured over ``rounds`` rounds (run here on a fresh state, all
  workers at once, before the clock starts) per unit of the average worker's work
  (`SchmpProgram.mean_work`: the padded program takes as long for a small share as for a
  large one), times `MARGIN`, times the trace's slowdown. ``host_row_s``: that cost per unit
  instead. ``record``: `hetjax.emulation.build_host`'s."""
  calibration = None
  if not host_row_s:
    first = policy.update(policy.init(), None)[0]
    calibration = emulation.Calibration(
        lambda units: float(np.median(program.time_rounds(first, rounds))),
        (max(program.mean_work(first.offset), 1),), repeats=1)
  host = emulation.build_host(trace, ctx.worker, ctx.workers, calibration=calibration,
                              row_s=host_row_s, board=channel, record=record)
  program.use_host(host)
  return host


def emulated_host(ctx, trainer, trace, channel, *, host_row_s: float = 0.0,
                  host_fixed_s: float = 0.0, token_rows: int | None = None,
                  record=None) -> emulation.KnownSpeedHost | None:
  """This worker's emulated host, when a slowdown ``trace`` is given, attached to ``trainer``
  (a `WorkerTrainer`, or a `TokenTrainer` with ``token_rows``, its token size): every worker
  runs as a host of one calibrated cost (the largest any worker measured, times `MARGIN`)
  slowed by the trace. ``host_row_s`` given: that cost per row, and ``host_fixed_s`` fixed
  (a calibrated run's ``run.json`` numbers give the same hosts again: `reuse`). ``record``:
  where the calibration's retries go (`hetjax.emulation.build_host`'s).

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
  the timing noise hides (a small model; more workers than cores) is measured again, then
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
                              row_s=host_row_s, fixed_s=host_fixed_s, speed=speed, board=channel,
                              record=record)
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
