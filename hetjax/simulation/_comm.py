"""Communication schemes on the virtual clock: parameter servers and all-reduce, 1…1024 workers.

A discrete-event simulation (numpy only) of n workers training a `CommProblem` by one `Scheme`,
reporting what a real run would measure, on modelled time. Worker i computes a gradient in
``compute_s[i]`` seconds (a 3× straggler has 3× the time) and moves b = ``model_bytes`` through
its link in tᵢ = αᵢ + b / βᵢ (`hetjax.emulation.Links.transfer_s`), a push or a pull; a ring
all-reduce takes R = `Links.all_reduce_s` (all n workers, the slowest link's pace). The servers
are on links fast enough, or there are enough of them, that they add no time and never queue
(the real parameter server on localhost is modelled the same way); a pull reads the server's
state when it starts, and its bytes arrive tᵢ later.

Each scheme's exact semantics and closed-form iteration time are in `Scheme`'s module
(`hetjax.simulation.iteration_s`); here they run as events. The asynchronous PS schemes take
DC-ASGD's ``dc_lambda`` (g + λ g ⊙ g ⊙ (w_now − w_then), Zheng et al. 2017; 0.04 in the paper)
and a ``max_staleness`` above which pushes are refused and counted (never applied), as
`hetjax.ps` does. Staleness and iteration times come out of the event order; ties go to the
lower worker id.

Example::

  >>> links = Links((1e-3,) * 4, (1e8,) * 4)        # 1 ms, 100 MB/s: 11 ms a 1 MB transfer
  >>> run = simulate_comm('ps-asp', (0.02,) * 4, links, 10 ** 6, updates=200, lr=0.1)
  >>> round(run.iter_s, 6), float(run.staleness[8:].mean())   # 20 + 2 × 11 ms; n − 1
  (0.042, 3.0)
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence

import numpy as np

from hetjax._checks import integer, number, positive_int, positive_number
from hetjax._errors import ConfigError, parse_choice
from hetjax.emulation import Links
from hetjax.simulation._comm_problem import CommProblem, LeastSquares
from hetjax.simulation._comm_schemes import ASYNC_PS, Scheme, compute_times, transfer_times


@dataclasses.dataclass(frozen=True, eq=False)
class CommRun:
  """A simulated run (read-only arrays): its updates, when they happened, the loss after each.

  ``worker_iter_s[i]``: worker i's mean time between the starts of its gradient computations,
  the first iteration (a warm-up: nothing to overlap yet) left out. ``staleness``: per applied
  update, the versions its gradient's parameters lag the server (bsp, sync: 0; overlap: 1 after
  the first). ``refused``: pushes staler than ``max_staleness`` (never applied).
  """

  scheme: Scheme
  workers: int
  worker_iter_s: np.ndarray
  update_times: np.ndarray
  losses: np.ndarray
  staleness: np.ndarray
  refused: int = 0

  @property
  def iter_s(self) -> float:
    """The mean worker iteration time."""
    return float(self.worker_iter_s.mean())

  def updates_to(self, target: float) -> int | None:
    """How many updates until the loss is first <= ``target`` (None: never in this run)."""
    reached = np.flatnonzero(self.losses <= target)
    return int(reached[0]) + 1 if len(reached) else None

  def time_to(self, target: float) -> float | None:
    """The virtual time of the update that first brings the loss to ``target`` (None: never)."""
    count = self.updates_to(target)
    return None if count is None else float(self.update_times[count - 1])


def simulate_comm(scheme: Scheme | str, compute_s: float | Sequence[float], links: Links,
                  model_bytes: int, updates: int, lr: float, problem: CommProblem | None = None,
                  *, dc_lambda: float | None = None, max_staleness: int | None = None,
                  noise_cv: float = 0.0, seed: int = 0) -> CommRun:
  """Trains ``problem`` by ``scheme`` on the virtual clock until ``updates`` updates are applied.

  Example::

    run = simulate_comm('ps-eager-stale-lr', (0.01, 0.01, 0.01, 0.03), parse_links('link:1:100',
                        4), model_bytes=10 ** 6, updates=2000, lr=0.3)
    run.iter_s, run.updates_to(0.1), run.time_to(0.1)

  Args:
    scheme: a `Scheme` or its name.
    compute_s: seconds per gradient, one value or one per worker of ``links`` (base × slowdown).
    links: each worker's link; their number is the number of workers n.
    model_bytes: b, the bytes of the parameters (and of a gradient).
    updates: how many updates (server versions, all-reduce steps) to run.
    lr: η, plain SGD's learning rate.
    problem: default `LeastSquares()`; n must divide its global batch.
    dc_lambda: DC-ASGD's λ for the asynchronous PS schemes (None: off).
    max_staleness: asynchronous PS: pushes with τ above it are refused (None: no limit).
    noise_cv: every compute time times an independent log-normal factor of this coefficient of
      variation (0: exactly ``compute_s``; the closed forms then hold).
    seed: the compute-noise seed (the problem has its own).

  Raises:
    ConfigError: bad sizes or values, or options the scheme has no use for.

  A run that diverges is still a run: its losses become inf or nan (no warnings), and
  `CommRun.updates_to` says None for targets it never reached.
  """
  scheme = parse_choice(Scheme, scheme, 'communication scheme')
  problem = LeastSquares() if problem is None else problem
  n = links.workers
  if (dc_lambda is not None or max_staleness is not None) and scheme not in ASYNC_PS:
    raise ConfigError(f'{scheme.value} has no stale gradients: dc_lambda and max_staleness need '
                      'ps-asp or ps-eager')
  if dc_lambda is not None:
    number(dc_lambda, 'dc_lambda')
  positive_number(lr, 'lr')
  number(noise_cv, 'noise_cv')
  nbytes = integer(model_bytes, 'model_bytes')
  clock = _Clock(compute_times(compute_s, n), transfer_times(links, nbytes),
                 links.all_reduce_s(range(n), nbytes), noise_cv, seed)
  sim = _Sim(problem, lr, [problem.worker_rows(i, n) for i in range(n)])
  updates = positive_int(updates, 'updates')
  bound = None if max_staleness is None else integer(max_staleness, 'max_staleness')
  with np.errstate(over='ignore', invalid='ignore'):  # a diverging run is a result: inf, nan
    if scheme is Scheme.PS_BSP:
      starts = _ps_bsp(sim, clock, updates)
    elif scheme in ASYNC_PS:
      starts = _ps_async(sim, clock, updates, scheme, dc_lambda, bound)
    elif scheme is Scheme.ALLREDUCE_SYNC:
      starts = _allreduce_sync(sim, clock, updates)
    else:
      starts = _allreduce_overlap(sim, clock, updates)
  arrays = [np.array([_mean_interval(s) for s in starts]), np.array(sim.times),
            np.array(sim.losses), np.array(sim.staleness, dtype=np.int64)]
  for a in arrays:
    a.setflags(write=False)
  return CommRun(scheme, n, *arrays, refused=sim.refused)


class _Sim:
  """The training side: the parameters, and the log of applied updates."""

  def __init__(self, problem: CommProblem, lr: float, rows: list[slice]):
    self.problem, self.lr, self.rows = problem, lr, rows
    self.w = problem.start()
    self.times: list[float] = []
    self.losses: list[float] = []
    self.staleness: list[int] = []
    self.refused = 0

  def apply(self, w: np.ndarray, at: float, staleness: int) -> None:
    self.w = w
    self.times.append(at)
    self.losses.append(self.problem.loss(w))
    self.staleness.append(staleness)


class _Clock:
  """The modelled seconds: compute (optionally noisy), one transfer per worker, an all-reduce."""

  def __init__(self, compute: np.ndarray, transfer: np.ndarray, reduce: float, noise_cv: float,
               seed: int):
    self.c, self.t, self.reduce = compute, transfer, reduce
    self.sigma = math.sqrt(math.log1p(noise_cv ** 2))
    self.rng = np.random.default_rng([seed, 0xC0AA])

  def compute(self, worker: int | None = None) -> np.ndarray | float:
    """One worker's next compute time (all workers' with None)."""
    c = self.c if worker is None else self.c[worker]
    if not self.sigma:
      return c
    return c * self.rng.lognormal(-self.sigma ** 2 / 2, self.sigma, np.shape(c))


def _ps_bsp(sim: _Sim, clock: _Clock, updates: int) -> list[list[float]]:
  start = np.zeros(len(clock.c))
  starts = []
  for r in range(updates):
    starts.append(start)
    applied = float((start + clock.compute() + clock.t).max())
    sim.apply(sim.w - sim.lr * sim.problem.gradient(sim.w, r, slice(None)), applied, 0)
    start = applied + clock.t
  return np.array(starts).T.tolist()


def _ps_async(sim: _Sim, clock: _Clock, updates: int, scheme: Scheme, dc_lambda: float | None,
              bound: int | None) -> list[list[float]]:
  """ps-asp and ps-eager: one event per push arrival, in time order (ties: lower worker id)."""
  eager = scheme is not Scheme.PS_ASP
  version = 0
  held = [(sim.w, 0)] * len(clock.c)      # eager: what the last pull brought, adopted next step
  flight = []                             # per worker: gradient, its parameters, version, step, E
  events = []
  for i, rows in enumerate(sim.rows):
    done = float(clock.compute(i))
    flight.append((sim.problem.gradient(sim.w, 0, rows), sim.w, 0, 0, done))
    events.append((done + clock.t[i], i))
  heapq.heapify(events)
  starts = [[0.0] for _ in sim.rows]
  while len(sim.times) < updates:
    at, i = heapq.heappop(events)
    g, then, v, step, done = flight[i]
    tau = version - v
    if bound is not None and tau > bound:
      sim.refused += 1
    else:
      if dc_lambda is not None:
        g = g + dc_lambda * g * g * (sim.w - then)
      scale = 1 / max(1, tau) if scheme is Scheme.PS_EAGER_STALE_LR else 1.0
      version += 1
      sim.apply(sim.w - sim.lr * scale * g, at, tau)
    if eager:  # step + 1 started at E (= done) on the previous pull; its comm runs from E
      (w, v), held[i] = held[i], (sim.w, version)
      start = done
      done = max(start + float(clock.compute(i)), done + 2 * clock.t[i])
    else:      # the pull of what is there now arrives t later; compute starts then
      w, v, start = sim.w, version, at + clock.t[i]
      done = start + float(clock.compute(i))
    starts[i].append(start)
    flight[i] = (sim.problem.gradient(w, step + 1, sim.rows[i]), w, v, step + 1, done)
    heapq.heappush(events, (done + clock.t[i], i))
  return starts


def _allreduce_sync(sim: _Sim, clock: _Clock, updates: int) -> list[list[float]]:
  start, starts = 0.0, []
  for step in range(updates):
    starts.append(np.full(len(clock.c), start))
    start = float((start + clock.compute()).max()) + clock.reduce
    sim.apply(sim.w - sim.lr * sim.problem.gradient(sim.w, step, slice(None)), start, 0)
  return np.array(starts).T.tolist()


def _allreduce_overlap(sim: _Sim, clock: _Clock, updates: int) -> list[list[float]]:
  """Step t + 1 computes at w̃ᵢ = wₜ − η gₜ⁽ⁱ⁾ while all-reduce t runs."""
  n = len(clock.c)
  start, reduced = np.zeros(n), 0.0             # reduced: when all-reduce t − 1 ended: wₜ known
  at = np.broadcast_to(sim.w, (n, len(sim.w)))  # each worker's (approximate) parameters
  starts = []
  for step in range(updates):
    starts.append(start)
    done = start + clock.compute()
    start = np.maximum(done, reduced)           # step t + 1 needs its step t and wₜ
    reduced = max(reduced, float(done.max())) + clock.reduce
    grads = sim.problem.worker_gradients(at, step)
    at = sim.w - sim.lr * grads
    sim.apply(sim.w - sim.lr * grads.mean(axis=0), reduced, int(step > 0))
  return np.array(starts).T.tolist()


def _mean_interval(starts: list[float]) -> float:
  """Mean gap between consecutive starts, the first (warm-up) gap left out when there are more."""
  gaps = np.diff(starts)
  if not len(gaps):
    return math.nan
  return float(gaps[1:].mean() if len(gaps) > 1 else gaps[0])
