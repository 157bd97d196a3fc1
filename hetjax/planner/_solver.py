"""`solve_chain`: the exact minimum-time choice per chain position under memory caps.

A pure function of cost tables (no devices, no JAX): per position, each option's time and
memory per memory class, plus the edge times between neighbouring options. It keeps Pareto
fronts of (time, memory) partial plans, prunes with lower bounds on the time and memory still to
come, starts from a good fitting plan as the upper limit, and with one memory class builds the
chain from both ends and joins in the middle. `tests/test_planner_search.py` checks it against
brute force on random tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


def least_memory(tables: Tables, k: int) -> float:
  best = tables.node_memory[0][:, k]
  for node, edge in zip(tables.node_memory[1:], tables.edge_memory, strict=True):
    best = (best[:, None] + edge[:, :, k]).min(axis=0) + node[:, k]
  return float(best.min())


@dataclasses.dataclass(frozen=True)
class Tables:
  """Cost tables of a chain of sub-models i = 0 … n−1 with O_i options each, under L memory
  constraints (a constraint sums the memory of the options whose group holds its workers).

  Attributes:
    node_time: n arrays [O_i]: seconds of option o of sub-model i.
    node_memory: n arrays [O_i, L]: bytes option o adds under each constraint.
    edge_time: n−1 arrays [O_{i−1}, O_i]: seconds of going from option a of i−1 to b of i.
    edge_memory: n−1 arrays [O_{i−1}, O_i, L].
  """

  node_time: list[np.ndarray]
  node_memory: list[np.ndarray]
  edge_time: list[np.ndarray]
  edge_memory: list[np.ndarray]

  def total(self, choice: Sequence[int]) -> tuple[float, np.ndarray]:
    """(time, memory[L]) of one option per sub-model, added in chain order
    ``((n₀ + e₁) + n₁) + e₂ …``: the totals `solve_chain` reports."""
    t, m = self.node_time[0][choice[0]], self.node_memory[0][choice[0]]
    for i in range(1, len(choice)):
      a, b = choice[i - 1], choice[i]
      t = (t + self.edge_time[i - 1][a, b]) + self.node_time[i][b]
      m = (m + self.edge_memory[i - 1][a, b]) + self.node_memory[i][b]
    return float(t), m

  def reversed(self) -> Tables:
    """The same chain walked from its last sub-model to its first."""
    return Tables(self.node_time[::-1], self.node_memory[::-1],
                  [e.T for e in self.edge_time[::-1]],
                  [e.transpose(1, 0, 2) for e in self.edge_memory[::-1]])


Solution = tuple[list[int], float]


def solve_chain(tables: Tables, caps: np.ndarray) -> Solution | None:
  """The option per sub-model of least total time whose memory fits ``caps``, or None.

  A label-setting dynamic program: per option of a sub-model it keeps the Pareto front of
  (time, memory) partial plans, since what follows a partial plan depends only on its last
  option. Fronts can grow exponentially along the chain, so three things keep them small
  without losing the optimum:

  * bounds: a partial plan is dropped when even the least memory any completion adds does not
    fit, or when it cannot lead to a fitting plan within a time threshold. The time bound is
    Lagrangian: for λ ≥ 0 a fitting plan through a partial plan of time t and memory m takes at
    least t + λ·m + G_λ − λ·cap (m and cap summed over the constraints), G_λ being the cheapest
    completion under time + λ·memory (a shortest path).
  * a threshold that starts just above the Lagrangian lower bound and doubles towards a known
    fitting plan (the incumbent: shortest paths under time + λ·memory for a sweep of λ, improved
    one option at a time). Every fitting plan within the threshold survives, so the first run
    that finds one within its threshold has found the optimum. If the fastest plan (λ = 0)
    fits, it is the answer at once.
  * meet in the middle (one memory constraint): fronts are grown from both ends to the middle
    of the chain and joined, each pair of options by a binary search over memory.

  Totals are reported as `Tables.total` adds them. Exact, except that two plans whose times
  differ by less than ~1e-12 relative may be told apart by the order of the additions.

  Returns:
    (option index per sub-model, total seconds), or None when no plan fits.
  """
  caps = np.asarray(caps, np.float64)
  least = _completion_memory(tables)
  if np.any((tables.node_memory[0] + least[0]).min(axis=0) > caps * (1 + 1e-9)):
    return None  # even the smallest plan does not fit
  incumbent, lambdas = _incumbent(tables, caps)
  if incumbent is not None and not lambdas:
    return incumbent  # the fastest plan fits
  search = _Bidirectional(tables, caps, lambdas)
  if incumbent is None:
    return search.best(np.inf)
  upper = incumbent[1]
  floor = search.lower_bound()
  gap = 1e-6 * max(abs(floor), abs(upper))
  while True:
    threshold = min(floor + gap, upper)
    found = search.best(threshold)
    if found is not None and found[1] <= threshold:
      return found if found[1] < upper else incumbent
    if threshold >= upper:
      return incumbent
    if found is not None and found[1] < upper:
      incumbent, upper = found, found[1]
    gap *= 2


class _Bidirectional:
  """Label fronts from the first sub-model forwards and (with one memory constraint) from the
  last backwards, joined in the middle."""

  def __init__(self, tables: Tables, caps: np.ndarray, lambdas: Sequence[float]):
    self.tables, self.caps = tables, caps
    n = len(tables.node_time)
    self.split = n if (len(caps) > 1 or n < 2) else (n + 1) // 2
    self.forward = _Labeller(tables, caps, lambdas or [0.0])
    self.backward = _Labeller(tables.reversed(), caps, lambdas or [0.0])

  def lower_bound(self) -> float:
    return self.forward.lower_bound()

  def best(self, threshold: float) -> Solution | None:
    """The fastest fitting plan among those the bounds keep at ``threshold`` (every fitting
    plan within the threshold is among them)."""
    n = len(self.tables.node_time)
    front = self.forward.run(threshold, self.split)
    if self.split == n:
      t, m, _, history = front
      fits = np.flatnonzero(np.all(m <= self.caps, axis=1))
      if not len(fits):
        return None
      index = int(fits[np.argmin(t[fits])])
      return _path(history, index), float(t[index])
    back = self.backward.run(threshold, n - self.split)
    return self._join(front, back)

  def _join(self, front, back) -> Solution | None:
    """Pairs each forward partial plan with, per option of the next sub-model, the fastest
    backward one that fits beside it; checks the best pairs' totals in chain order."""
    (tf, mf, af, hf), (tb, mb, ab, hb) = front, back
    cap = float(self.caps[0])
    loose, tight = cap + 1e-12 * abs(cap), cap - 1e-12 * abs(cap)
    edge_t, edge_m = self.tables.edge_time[self.split - 1], self.tables.edge_memory[
        self.split - 1][:, :, 0]
    pairs_f, pairs_b, times = [], [], []
    starts = np.flatnonzero(np.diff(ab, prepend=-1))
    for seg in np.split(np.arange(len(ab)), starts[1:]) if len(ab) else []:
      b = ab[seg[0]]
      base_t, base_m = tf + edge_t[af, b], mf[:, 0] + edge_m[af, b]
      memory = mb[seg, 0]  # ascending; times strictly descending (a Pareto front)
      hi = np.searchsorted(memory, loose - base_m, 'right') - 1
      lo = np.maximum(np.searchsorted(memory, tight - base_m, 'right') - 1, 0)
      ok = np.flatnonzero(hi >= 0)
      counts = hi[ok] - lo[ok] + 1  # the best surely fitting one, plus any on the border
      f = np.repeat(ok, counts)
      offsets = np.arange(len(f)) - np.repeat(np.cumsum(counts) - counts, counts)
      pos = seg[np.repeat(lo[ok], counts) + offsets]
      pairs_f.append(f)
      pairs_b.append(pos)
      times.append(base_t[f] + tb[pos])
    if not times:
      return None
    pairs_f, pairs_b, times = map(np.concatenate, (pairs_f, pairs_b, times))
    best: Solution | None = None
    for k in np.argsort(times, kind='stable'):
      if best is not None and times[k] > best[1] + 1e-12 * abs(best[1]):
        break
      choice = _path(hf, int(pairs_f[k])) + _path(hb, int(pairs_b[k]))[::-1]
      t, m = self.tables.total(choice)
      if np.all(m <= self.caps) and (best is None or t < best[1]):
        best = (choice, t)
    return best


class _Labeller:
  """Grows Pareto fronts of partial plans along a chain, pruned by the bounds."""

  def __init__(self, tables: Tables, caps: np.ndarray, lambdas: Sequence[float]):
    self.tables, self.caps = tables, caps
    self.least = _completion_memory(tables)
    self.bounds = [(lam, _completion_time(tables, lam)) for lam in lambdas]

  def lower_bound(self) -> float:
    """The best Lagrangian lower bound on any fitting plan's time."""
    node_t, node_m = self.tables.node_time[0], self.tables.node_memory[0]
    return max(float(((node_t + lam * node_m.sum(axis=1)) + future[0]).min()
                     - lam * self.caps.sum()) for lam, future in self.bounds)

  def run(self, threshold: float, steps: int):
    """(time, memory, option, history) of the partial plans over the first ``steps``
    sub-models that may lead to a fitting plan within ``threshold``, grouped by option and,
    per option, sorted by memory (with one constraint)."""
    tables, width = self.tables, len(self.caps)
    t, m = tables.node_time[0], tables.node_memory[0]
    keep = self._prune(0, threshold, t, m, np.arange(len(t)))
    t, m, opt = t[keep], m[keep], keep
    history = [(opt, keep)]
    for i in range(1, steps):
      count = len(tables.node_time[i])
      ct = ((t[:, None] + tables.edge_time[i - 1][opt]) + tables.node_time[i][None]).reshape(-1)
      cm = (m[:, None, :] + tables.edge_memory[i - 1][opt]) + tables.node_memory[i][None]
      cm = cm.reshape(len(ct), width)
      options = np.tile(np.arange(count), len(t))
      keep = self._prune(i, threshold, ct, cm, options)
      t, m, opt = ct[keep], cm[keep], options[keep]
      history.append((opt, keep // count))
    return t, m, opt, history

  def _prune(self, i: int, threshold: float, t: np.ndarray, m: np.ndarray,
             options: np.ndarray) -> np.ndarray:
    # The slacks keep rounding in the bounds from dropping a plan that fits or ties exactly.
    caps = self.caps
    alive = np.all(m + self.least[i][options] <= caps + 1e-9 * np.abs(caps), axis=1)
    for lam, future in self.bounds:
      reach = threshold + lam * caps.sum()
      bound = (t + lam * m.sum(axis=1)) + future[i][options]
      alive &= bound <= reach + 1e-9 * abs(reach)
    return _pareto(np.flatnonzero(alive), t, m, options)


def _path(history: list[tuple[np.ndarray, np.ndarray]], index: int) -> list[int]:
  """The options of the partial plan at ``index`` of the last front, first sub-model first."""
  choice = []
  for opt, parent in reversed(history):
    choice.append(int(opt[index]))
    index = int(parent[index])
  return choice[::-1]


def _weighted(tables: Tables, lam: float):
  """Per step, (edge, node) weights time + λ·memory (exactly the times when λ = 0)."""
  nodes = [t + lam * m.sum(axis=1) for t, m in zip(tables.node_time, tables.node_memory,
                                                   strict=True)]
  edges = [t + lam * m.sum(axis=2) for t, m in zip(tables.edge_time, tables.edge_memory,
                                                   strict=True)]
  return nodes, edges


def _shortest(tables: Tables, lam: float) -> list[int]:
  """The options minimising Σ time + λ·Σ memory, added in chain order."""
  nodes, edges = _weighted(tables, lam)
  cost, parents = nodes[0], []
  for edge, node in zip(edges, nodes[1:], strict=True):
    total = (cost[:, None] + edge) + node[None]
    parents.append(np.argmin(total, axis=0))
    cost = total.min(axis=0)
  choice = [int(np.argmin(cost))]
  for parent in reversed(parents):
    choice.append(int(parent[choice[-1]]))
  return choice[::-1]


def _completion_time(tables: Tables, lam: float) -> list[np.ndarray]:
  """[n] arrays [O_i]: least Σ time + λ·Σ memory of sub-models after i, given option o at i."""
  nodes, edges = _weighted(tables, lam)
  out = [np.zeros(len(nodes[-1]))]
  for i in range(len(nodes) - 2, -1, -1):
    out.append(((edges[i] + nodes[i + 1][None]) + out[-1][None]).min(axis=1))
  return out[::-1]


def _completion_memory(tables: Tables) -> list[np.ndarray]:
  """[n] arrays [O_i, L]: per constraint, the least memory sub-models after i add, given
  option o at i (each constraint minimised on its own: a lower bound)."""
  out = [np.zeros_like(tables.node_memory[-1])]
  for i in range(len(tables.node_memory) - 2, -1, -1):
    step = tables.edge_memory[i] + tables.node_memory[i + 1][None]
    out.append((step + out[-1][None]).min(axis=1))
  return out[::-1]


def _incumbent(tables: Tables, caps: np.ndarray) -> tuple[Solution | None, list[float]]:
  """A fitting plan (or None) from shortest paths under time + λ·memory, and the λs that
  bracket the cap (none when the fastest plan, λ = 0, fits: then it is optimal)."""
  best: Solution | None = None

  def attempt(lam: float) -> bool:
    nonlocal best
    choice = _shortest(tables, lam)
    time, memory = tables.total(choice)
    if not np.all(memory <= caps):
      return False
    if best is None or time < best[1]:
      best = (choice, time)
    return True

  if attempt(0.0):
    return best, []
  scale = tables.total(_shortest(tables, 0.0))[0] / max(float(caps.sum()), 1e-300)
  grid = [scale * 2.0 ** k for k in range(-20, 80, 4)]
  fitting = [attempt(lam) for lam in grid]
  if not any(fitting):
    return None, [0.0]
  first = fitting.index(True)
  lo, hi = (grid[first - 1] if first else 0.0), grid[first]
  for _ in range(30):
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if attempt(mid) else (mid, hi)
  choice = _improve(tables, caps, best[0])
  return (choice, tables.total(choice)[0]), [lo, hi]


def _improve(tables: Tables, caps: np.ndarray, choice: list[int]) -> list[int]:
  """Local search from a fitting plan: switch one sub-model's option at a time to the one that
  saves the most time while still fitting, until no switch helps."""
  time, memory = tables.total(choice)
  n = len(choice)
  for _ in range(100):
    improved = False
    for i in range(n):
      cur = choice[i]
      dt = tables.node_time[i] - tables.node_time[i][cur]
      dm = tables.node_memory[i] - tables.node_memory[i][cur]
      if i:
        a = choice[i - 1]
        dt = dt + (tables.edge_time[i - 1][a] - tables.edge_time[i - 1][a, cur])
        dm = dm + (tables.edge_memory[i - 1][a] - tables.edge_memory[i - 1][a, cur])
      if i < n - 1:
        b = choice[i + 1]
        dt = dt + (tables.edge_time[i][:, b] - tables.edge_time[i][cur, b])
        dm = dm + (tables.edge_memory[i][:, b] - tables.edge_memory[i][cur, b])
      dt = np.where(np.all(memory + dm <= caps, axis=1), dt, np.inf)
      best = int(np.argmin(dt))
      if dt[best] < 0:
        trial = [*choice[:i], best, *choice[i + 1:]]
        t, m = tables.total(trial)
        if t < time and np.all(m <= caps):
          choice, time, memory, improved = trial, t, m, True
    if not improved:
      break
  return choice


def _pareto(alive: np.ndarray, t: np.ndarray, m: np.ndarray, options: np.ndarray) -> np.ndarray:
  """Indices among ``alive`` on each option's Pareto front of (time, memory), grouped by option
  (one constraint: sorted by memory, so times strictly fall)."""
  if m.shape[1] == 1:
    order = alive[np.lexsort((t[alive], m[alive, 0], options[alive]))]
  else:
    keys = (*(m[alive, k] for k in range(m.shape[1] - 1, -1, -1)), t[alive], options[alive])
    order = alive[np.lexsort(keys)]
  if not len(order):
    return order
  starts = np.flatnonzero(np.diff(options[order], prepend=-1))
  return np.concatenate([seg[_front(t[seg], m[seg])] for seg in np.split(order, starts[1:])])


def _front(t: np.ndarray, m: np.ndarray) -> np.ndarray:
  """Positions of the non-dominated rows: with one memory, rows come sorted by memory then time
  and a row survives if it is strictly faster than every row before it; with several, rows come
  sorted by time and a row survives if no kept row is at most as large in every memory."""
  if m.shape[1] == 1:
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], t[:-1])))
    return np.flatnonzero(t < best_before)
  kept: list[int] = []
  for row in range(len(t)):
    if not kept or not np.all(m[kept] <= m[row], axis=1).any():
      kept.append(row)
  return np.array(kept, np.int64)
