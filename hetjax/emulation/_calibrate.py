"""Calibrating a host: the seconds per row (and per step) of one model on this machine.

`KnownSpeedHost` needs what a step of ``rows`` rows costs an undisturbed host: fixed_s + rows ×
row_s. `calibrate_row_cost` times the real computation at two or more sizes, takes each size's
median (a scheduler spike or a compile in one repeat does not move it), fits the line by least
squares and multiplies it by a margin, so that the real compute normally stays under the target
it is padded to (an overrun is a step the emulation could not hold).

Calls made in a stream (a token worker's 4–5 calls a step) meet the machine's slow spells in a
way a margin on medians does not cover: where several processes share a few cores, the same
call made back to back runs at one speed for seconds, then several times slower (several times
the CPU time for the same work) for seconds. Such spells slow every call alike, so they
scale the line rather than add a fixed cost per call: ``tail=q`` scales the fitted line by the
q-quantile of measured / fitted over every timing when that exceeds the margin, leaving the
line's shape (fixed cost against cost per row) to the medians.

A small model's step is nearly all fixed cost (dispatch), and its cost per row can be smaller
than the timing noise at the sizes measured (an MLP of width 8 takes the same time, within the
noise, at 10 rows as at 42). A slope fitted there is noise: refused as none, or a host that
is all fixed cost. Neither serves: the host model slows the fixed cost too, so a 3× slow host
that is mostly fixed cost can never match the others however few rows it gets, and a balancer
gives it none (shares [54, 72, 2] for speeds 1, 1, 3, where rows in proportion to speed are
3/7, 3/7, 1/7). So the line is kept only when its cost per row is resolved: the rise it fits
across the sizes exceeds `RESOLVE` standard errors of the medians (each from its size's median
absolute deviation), and the rows make at least `ROW_SHARE` of the largest size's step (the
benchmarks' recorded hosts clear it).
Otherwise the cost is taken as all per row, sized so that no call of the fewest rows measured
overruns (`RowCost.per_row_s`): the slowest size's median over the smallest size, scaled.
Measuring larger sizes instead would resolve a slope too small to matter at the run's sizes.

The circularity, stated once: the virtual clock's per-sample cost and the emulated hosts' row
cost are this same calibration. When a virtual run and an emulated run agree, that checks the
policies, the collectives and the model of a step against real ones; it does not check the
calibration, which both take as given.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence

import numpy as np

from hetjax._errors import ConfigError

#: Standard errors of the medians' difference the fitted rise must exceed to count as a cost per
#: row (about 1 in 700 for pure noise; scripted, noiseless timings pass at any rise > 0).
RESOLVE = 3.0
#: The least share of the largest size's fitted step its rows must make for the line to be kept:
#: a fixed cost at most half the rows' (a 3× slow host among two others then still gets rows).
ROW_SHARE = 2 / 3
#: The standard error of a median of n timings is about ``MEDIAN_SE × MAD / √n`` for a normal
#: spread (1.4826 MAD estimates σ; the median's error is √(π/2) σ / √n).
MEDIAN_SE = 1.4826 * math.sqrt(math.pi / 2)


@dataclasses.dataclass(frozen=True)
class RowCost:
  """A fitted step cost: ``fixed_s + rows × row_s`` seconds, margin included.

  Attributes:
    row_s: seconds per row (> 0).
    fixed_s: seconds per step whatever the rows (>= 0).
    measured: every timing taken, as (rows, seconds) pairs in the order measured.
    scale: what the median line was multiplied by: the margin, or the tail quantile.
    resolved: whether the cost per row rose above the timing noise and makes most of a step
      (module docstring); if not, ``row_s`` is ``per_row_s`` and ``fixed_s`` is 0.
    per_row_s: the cost taken as all per row: the largest median over the fewest rows measured,
      times the margin (or the tail quantile of every timing over that median), so that no
      call of those rows runs past it. What a worker whose slope was resolved offers when
      another worker's was not, so that every worker of a job gets one host model.
  """

  row_s: float
  fixed_s: float
  measured: tuple[tuple[int, float], ...]
  scale: float = 1.0
  resolved: bool = True
  per_row_s: float = 0.0

  def seconds(self, rows: int) -> float:
    """The fitted cost of a step of ``rows`` rows."""
    return self.fixed_s + rows * self.row_s


def calibrate_row_cost(measure: Callable[[int], float], rows: Sequence[int], repeats: int = 5,
                       margin: float = 1.25, tail: float | None = None) -> RowCost:
  """Fits fixed_s + rows × row_s to real timings, robustly, with a safety margin.

  The sizes are measured interleaved (every size once, ``repeats`` times over), so a slow spell
  of the machine hits all sizes alike. Each size's median is taken: with 5 repeats, two spikes
  per size leave it where it was. The margin, not a high quantile, covers the ordinary spread:
  a higher quantile would follow the spikes as soon as two repeats of five are hit. Where
  the spikes are what the host must cover (calls in a stream, many repeats), ``tail`` scales
  the line up to them. A fitted
  fixed cost below 0 is clamped to 0 and the line refitted through the origin.

  Example::

    >>> cost = calibrate_row_cost(lambda r: 0.004 + r * 1e-4, rows=(64, 256), margin=1.25)
    >>> round(cost.row_s, 12), round(cost.fixed_s, 12)   # 1.25 × (1e-4, 0.004)
    (0.000125, 0.005)

  Args:
    measure: ``measure(rows)`` runs one real computation of ``rows`` rows (already compiled, or
      the compile is one of the spikes) and returns its seconds.
    rows: the sizes to measure, at least two distinct ints >= 1; spread them (e.g. 1× and 4×).
    repeats: timings per size, >= 1.
    margin: both fitted costs are multiplied by this, >= 1.
    tail: a quantile in (0, 1], or None: the fitted costs are multiplied by the larger of
      ``margin`` and this quantile of every timing over the median line at its size
      (module docstring); None: by ``margin`` alone.

  Returns:
    the fitted `RowCost`, with every timing in ``measured``; when the cost per row does not
    rise above the timing noise or the fixed cost is most of a step, the cost taken as all per
    row (``resolved`` False; module docstring).

  Raises:
    ConfigError: a bad argument, a bad timing, or no time measured at all.
  """
  sizes = tuple(dict.fromkeys(_count(r, 'rows', 1) for r in rows))
  if len(sizes) < 2:
    raise ConfigError(f'calibration needs at least two distinct row counts, got {tuple(rows)!r}')
  repeats = _count(repeats, 'repeats', 1)
  if isinstance(margin, bool) or not isinstance(margin, numbers.Real) \
      or not (math.isfinite(margin) and margin >= 1):
    raise ConfigError(f'margin must be a finite number >= 1, got {margin!r}')
  if tail is not None and (isinstance(tail, bool) or not isinstance(tail, numbers.Real)
                           or not 0 < tail <= 1):
    raise ConfigError(f'tail must be a quantile in (0, 1] or None, got {tail!r}')
  measured = []
  for _ in range(repeats):
    for size in sizes:
      seconds = measure(size)
      if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) \
          or not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f'measure({size}) returned {seconds!r}; it must be seconds >= 0')
      measured.append((size, float(seconds)))
  x = np.array(sizes, dtype=np.float64)
  y = np.array([np.median([s for r, s in measured if r == size]) for size in sizes])
  row_s, fixed_s = np.polyfit(x, y, 1)
  if fixed_s < 0:
    row_s, fixed_s = float(x @ y / (x @ x)), 0.0
  if not y.max() > 0:
    raise ConfigError(f'calibration measured no time at rows {sizes!r}; measure(rows) must time '
                      'a real computation')
  per_row, per_row_scale = _per_row(measured, float(y.max()), min(sizes), margin, tail)
  if not (_resolved(measured, x, y, row_s) and row_s * x.max() >= ROW_SHARE * (
      fixed_s + row_s * x.max())):
    return RowCost(per_row, 0.0, tuple(measured), per_row_scale, resolved=False,
                   per_row_s=per_row)
  scale = float(margin)
  if tail is not None:
    ratios = [s / (fixed_s + r * row_s) for r, s in measured]
    scale = max(scale, float(np.quantile(ratios, tail)))
  return RowCost(float(scale * row_s), float(scale * fixed_s), tuple(measured), scale,
                 per_row_s=per_row)


def _resolved(measured, x: np.ndarray, y: np.ndarray, row_s: float) -> bool:
  """Whether the fitted slope rises across the sizes by more than `RESOLVE` standard errors of
  the smallest and largest sizes' medians (module docstring)."""
  lo, hi = int(x[np.argmin(x)]), int(x[np.argmax(x)])
  if not (row_s > 0 and y[np.argmax(x)] > y[np.argmin(x)]):
    return False
  variance = 0.0
  for size in (lo, hi):
    times = np.array([s for r, s in measured if r == size])
    mad = float(np.median(np.abs(times - np.median(times))))
    variance += (MEDIAN_SE * mad) ** 2 / len(times)
  return row_s * (hi - lo) > RESOLVE * math.sqrt(variance)


def _per_row(measured, slowest: float, fewest: int, margin: float, tail: float | None
             ) -> tuple[float, float]:
  """`RowCost.per_row_s` and its scale: every call taken to cost the slowest median, spread over
  the fewest rows, scaled by the margin or the ``tail`` quantile of every timing over that
  median."""
  scale = float(margin)
  if tail is not None:
    scale = max(scale, float(np.quantile([s / slowest for _, s in measured], tail)))
  return scale * slowest / fewest, scale


def _count(value: int, what: str, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
    raise ConfigError(f'{what} must be an int >= {low}, got {value!r}')
  return int(value)
