"""One builder for every emulated host: a cost per row (given, or calibrated on the worker's own
computation with the one `MARGIN`), agreed across the job's workers, as a `KnownSpeedHost`.

Every worker of a job runs as a host of the same base speed, slowed by its row of the trace, so
a host's cost must be one number for all: each worker times its real step, publishes its cost,
and every worker takes the largest (the slowest worker's compute must fit under its host's time
too). The workers time together: each runs every size once untimed (compiles), then waits for
all the others on the board before its timed runs. A cost per row given (``row_s``, the
config's ``emulation.host_row_s``) skips all of it.

What is timed depends on the program; `Calibration` says how:

* two or more sizes: a line ``fixed_s + rows × row_s`` (`calibrate_row_cost`): the share and
  token steps, whose rows change from step to step;
* one size: a step that always computes the same work (a pipeline replica's batch, a
  parameter-server worker's share, a SchMP round's mean work); its cost is all per row,
  ``MARGIN × median / size``.

A line whose cost per row is not resolved (a small model, its step mostly fixed cost or its
rows inside the timing noise: `calibrate_row_cost`'s module docstring) is measured again, up to
``attempts`` times; if it is still not resolved the job's hosts take their cost as all per row
(`RowCost.per_row_s`, the largest any worker offers), with a one-line notice, rather than a
slope that is noise or a host a balancer can only starve. Each retry is a detail, not news: it
goes to ``record`` (the run's ``run.json``), never to the console.

Example::

  host = build_host(trace, ctx.worker, ctx.workers, board=channel, calibration=Calibration(
      lambda rows: median_seconds_of_a_step(rows), sizes=(128, 512)))
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from hetjax._errors import ConfigError
from hetjax.emulation._calibrate import RowCost, calibrate_row_cost
from hetjax.emulation._hosts import KnownSpeedHost
from hetjax.emulation._traces import SlowdownTrace

logger = logging.getLogger('hetjax.emulation')

#: Host time over the calibrated compute, for every emulated host (rows, steps, rounds, stage
#: actions): a smaller margin left many share steps overrunning their host's time.
MARGIN = 1.5


class Board(Protocol):
  """Where the workers agree on one cost: `hetjax.runtime.Channel` (or `LocalChannel`)."""

  def set(self, key: str, value: Any) -> None: ...

  def get(self, key: str) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Calibration:
  """How `build_host` times a worker's real computation.

  Attributes:
    measure: ``measure(rows)`` runs one real computation of ``rows`` (compiled beforehand) and
      returns its seconds.
    sizes: the rows to time: two or more ints fit a line; one size (an int or, for work units
      such as a SchMP round's mean work, a float > 0) makes the cost all per row.
    repeats: timings per size (their median is taken).
    tail: `calibrate_row_cost`'s ``tail`` (calls made in a stream); None for one call a step.
  """

  measure: Callable[[int], float]
  sizes: Sequence[float]
  repeats: int = 5
  tail: float | None = None

  def __post_init__(self):
    if not self.sizes:
      raise ConfigError('a calibration needs at least one size')
    if isinstance(self.repeats, bool) or not isinstance(self.repeats, numbers.Integral) \
        or self.repeats < 1:
      raise ConfigError(f'repeats must be an int >= 1, got {self.repeats!r}')


def build_host(trace: SlowdownTrace, worker: int, workers: int, *,
               calibration: Calibration | None = None, row_s: float = 0.0,
               fixed_s: float = 0.0, speed: float = 1.0,
               board: Board | None = None, key: str = 'calibrate', attempts: int = 3,
               log: Callable[[str], None] | None = None,
               record: Callable[[str], None] | None = None) -> KnownSpeedHost:
  """Worker ``worker``'s host of known speed (module docstring), slowed by ``trace``.

  Args:
    trace: every worker's slowdowns.
    worker, workers: this worker, of ``workers`` (all of whom call this, at once, when a
      calibration is agreed on ``board``).
    calibration: how to time this worker (`Calibration`); None with ``row_s`` given.
    row_s: a given cost per row; > 0 skips the calibration and the agreement.
    fixed_s: with ``row_s``, the given seconds of a step whatever its rows (0: nothing fixed):
      a calibrated host's two numbers pin the same hosts on another run.
    speed: this worker's speed (`KnownSpeedHost.speed`): its device count over the fewest any
      worker has. A calibrated cost is published times it, so the cost agreed is a speed-1
      host's, and the slowest worker's compute fits under its own host's time.
    board: where the workers agree (None, or one worker: this worker's cost is the job's).
    key: the board's key namespace (``KEY/W``: worker W's cost).
    attempts: calibrations of a line tried before its cost is taken as all per row.
    log: where the job's one notice goes, that no cost per row was resolved (`print`, flushed,
      when None).
    record: where the retries go, one line each naming its worker: on worker 0, every
      worker's (gathered on ``board``: every worker gives a ``record``, or none does), so that
      the run records them (`hetjax.run` keeps them in ``run.json``'s
      ``host_calibration_retries``). None: this worker's own go to the ``hetjax.emulation``
      logger at INFO, off the console.

  Returns:
    the host, ``row_s``, ``fixed_s`` and ``speed`` set.

  Raises:
    ConfigError: neither a calibration nor a cost given, or a bad one.
  """
  say = log or (lambda line: print(line, flush=True))
  if row_s:
    return KnownSpeedHost(trace, worker, row_s, fixed_s, speed=speed)
  if calibration is None:
    raise ConfigError('an emulated host needs a cost per row (host_row_s) or a calibration')
  if board is not None and workers > 1:
    _start_together(calibration, worker, workers, board, key)
  cost, retries = _calibrate(calibration, worker, attempts)
  mine = [cost.row_s * speed, cost.fixed_s, cost.resolved, cost.per_row_s * speed]
  every = [mine]
  if board is not None and workers > 1:  # one host model for all: the slowest worker's
    board.set(f'{key}/{worker}', mine)
    every = [board.get(f'{key}/{w}') for w in range(workers)]
  _record_retries(retries, worker, workers, board, key, record)
  if all(c[2] for c in every):
    return KnownSpeedHost(trace, worker, max(c[0] for c in every), max(c[1] for c in every),
                          speed=speed)
  row = max(c[3] for c in every)
  if worker == 0:
    unresolved = ', '.join(str(w) for w, c in enumerate(every) if not c[2])
    say(f'host calibration: no cost per row resolved on worker {unresolved} (a small model: '
        f'its step mostly fixed cost, or its rows inside the timing noise): every host costs '
        f'{1e3 * row:.3g} ms a row, nothing fixed (the slowest step over its fewest rows, with '
        "the margin); emulation.host_row_s sets it, --hosts=RUN_DIR reuses a run's")
  return KnownSpeedHost(trace, worker, row, 0.0, speed=speed)


def _start_together(calibration: Calibration, worker: int, workers: int, board: Board,
                    key: str) -> None:
  """Runs every size once, untimed (its compile, its buffers' first touch), then waits until
  every worker has: the timings that follow carry the contention of all workers computing at
  once, which the run will have. Without it a worker still compiling leaves the others a
  quieter machine: their hosts come out calibrated far apart in time, and the quieter ones'
  steps overrun them."""
  for size in calibration.sizes:
    calibration.measure(size)
  board.set(f'{key}/ready/{worker}', True)
  for w in range(workers):
    board.get(f'{key}/ready/{w}')


def _calibrate(calibration: Calibration, worker: int, attempts: int
               ) -> tuple[RowCost, list[str]]:
  """This worker's cost, margin included: a line (measured again while its cost per row is
  not resolved), or one size's cost all per row; and one line per retry."""
  sizes = tuple(calibration.sizes)
  if len(sizes) == 1:
    return _one_size(calibration.measure, sizes[0], calibration.repeats), []
  retries = []
  for attempt in range(1, attempts + 1):
    cost = calibrate_row_cost(calibration.measure, sizes, repeats=calibration.repeats,
                              margin=MARGIN, tail=calibration.tail)
    if cost.resolved:
      return cost, retries
    if attempt < attempts:
      medians = ', '.join(f'{r}: {1e3 * _median(cost.measured, r):.3g} ms'
                          for r in sorted(set(sizes)))
      retries.append(f'worker {worker}: host calibration {attempt} of {attempts} resolved no '
                     f'cost per row (medians {medians}); measuring again')
  return cost, retries


def _record_retries(retries: list[str], worker: int, workers: int, board: Board | None,
                    key: str, record: Callable[[str], None] | None) -> None:
  """Hands the retries to ``record``: every worker's, on worker 0 (`build_host`'s ``record``);
  to the logger when there is no ``record``."""
  if record is None:
    for line in retries:
      logger.info(line)
    return
  every = [retries]
  if board is not None and workers > 1:
    board.set(f'{key}/retries/{worker}', retries)
    every = [board.get(f'{key}/retries/{w}') for w in range(workers)] if worker == 0 else []
  for lines in every:
    for line in lines:
      record(line)


def _median(measured, rows: int) -> float:
  return float(np.median([s for n, s in measured if n == rows]))


def _one_size(measure: Callable[[float], float], size: float, repeats: int) -> RowCost:
  if isinstance(size, bool) or not isinstance(size, numbers.Real) \
      or not (math.isfinite(size) and size > 0):
    raise ConfigError(f'a calibration size must be a number > 0, got {size!r}')
  measured = tuple((size, float(measure(size))) for _ in range(repeats))
  row = MARGIN * float(np.median([s for _, s in measured])) / size
  return RowCost(row, 0.0, measured, MARGIN, per_row_s=row)
