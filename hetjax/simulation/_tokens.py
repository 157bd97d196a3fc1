"""Fela's token scheduling on the virtual clock, and the end-game rule both clocks use.

The same cost model as `simulate_shares` (see `hetjax.simulation.ClockCosts`), applied per token: worker i
at step t spends

  token_i = factor_i(t) × (fixed_s + per_sample_s × token_rows)

on each token it takes, after a pull round trip of ``pull_s`` (not stretched by slowdown: it is
the coordinator's latency, as in `hetjax.train` where the counter lives on the coordination
service). Pulls are greedy: an event simulation keeps the workers in a heap by the time they
are next free, and the earliest-free worker (lowest id on ties) takes the next token. Every
worker makes one more pull that finds the queue empty; the iteration ends when the last worker
has made it, then the all-reduce and host work (`ClockCosts.sync_s`) follow, once.

**The end game.** Pure greedy pulling has a tail: a 3× slower worker that frees up near the end
takes a token and finishes it long after the others are done (4 workers, one 3× slow, 16
tokens: 6 token times, where 5 suffice). With ``endgame``, a worker about to pull near the end
first reads how many tokens are left (``increment(key, 0)``, one more round trip) and leaves
them to the others when they would finish them all sooner than it finishes one
(`takes_token`). Speeds come from earlier steps (every worker's busy time per token travels in
the combine) and the worker's own latest token. Every worker takes its first token of a step
unconditionally (so its speed is measured every step), and the worker that did the most tokens
in the previous step (an integer every worker knows exactly) never leaves, so every token is
still computed.

**Prefetch.** With ``prefetch`` (and the end game), from its second token of a step on, a
worker the end game keeps pulls its next token as the current one starts computing, so its
round trips overlap its compute; a worker that may leave reads and pulls after each token, as
without.

Example::

  >>> cost = ClockCosts(per_sample_s=1e-3)
  >>> run = simulate_tokens(StaticTrace((1, 1, 1, 3)), cost, 400, token_rows=25, steps=2)
  >>> run.shares[0].tolist(), round(run.mean_iter_s(), 9)   # vs 0.3 s for uniform BSP
  ([125, 125, 100, 50], 0.15)
  >>> run = simulate_tokens(StaticTrace((1, 1, 1, 3)), cost, 400, 25, steps=2, endgame=True)
  >>> run.shares[1].tolist(), round(float(run.iter_s[1]), 9)   # step 1 knows the speeds
  ([125, 125, 125, 25], 0.125)
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from hetjax._checks import number, positive_int
from hetjax._errors import ConfigError
from hetjax.core import StepStats
from hetjax.emulation import SlowdownTrace
from hetjax.simulation._shares import ClockCosts, VirtualRun
from hetjax.train import SURE_TAKE, takes_token


def simulate_tokens(trace: SlowdownTrace, cost: ClockCosts, global_batch: int, token_rows: int,
                    steps: int, pull_s: float = 0.0, endgame: bool = False,
                    noise_cv: float = 0.0, seed: int = 0, prefetch: bool = False) -> VirtualRun:
  """Runs ``steps`` token-scheduled iterations on the virtual clock.

  Worked case (2 workers, worker 1 3× slower, 8 rows in tokens of 2, 1 ms per row, 1 ms per
  pull): worker 0 takes tokens at 0, 3 and 6 ms (each pull + 2 ms), worker 1 one at 0 ms
  (pull + 6 ms, free at 7 ms, after the queue emptied at 6 ms); their empty pulls end at 10 and
  8 ms, so the step takes 10 ms + sync with shares (6, 2), where uniform BSP takes 12 ms.

  Args:
    trace: per-step slowdown factors; its worker count is the job's.
    cost: per-token compute is ``cost.compute_s`` of ``token_rows`` rows; ``cost.sync_s``
      once per iteration.
    global_batch: X, a multiple of ``token_rows``.
    token_rows: rows per token.
    steps: iterations to run.
    pull_s: seconds per pull round trip (per token, plus one empty pull per worker and step,
      plus the end game's reads).
    endgame: apply the end-game rule (see the module docstring) once every worker's speed is
      known; the worker that did the most tokens in the previous step is the one never to leave.
    noise_cv: each token's compute is multiplied by an independent log-normal factor with this
      coefficient of variation (as in `simulate_shares`).
    seed: seeds the noise.
    prefetch: with ``endgame``, once every speed is known, a worker the end game keeps (the
      leader, or one whose latest token is too short to ever leave) pulls its next token as
      the current one starts, from its second token of the step on: the round trip overlaps
      the compute (`hetjax.train.TokenRules`).

  Returns:
    a `VirtualRun`: ``shares`` are rows done, ``compute_s`` busy seconds (token compute, pulls
    excluded), ``idle_fraction`` each worker's wait between its last pull and the end of the
    slowest.

  Raises:
    ConfigError: bad sizes or costs.
  """
  n = trace.workers
  positive_int(steps, 'steps')
  rows = positive_int(token_rows, 'token_rows')
  x = positive_int(global_batch, 'global_batch')
  if x % rows:
    raise ConfigError(f'token_rows {rows} does not divide the global batch {x}')
  number(pull_s, 'pull_s')
  number(noise_cv, 'noise_cv')
  tokens, comm = x // rows, cost.sync_s(n)
  sigma = math.sqrt(math.log1p(noise_cv ** 2))
  rng = np.random.default_rng([seed, 0x70CE])
  shares = np.zeros((steps, n), dtype=np.int64)
  busy = np.zeros((steps, n))
  iter_s, limit, idle = np.empty(steps), np.empty(steps), np.empty((steps, n))
  history = []
  estimate = np.full(n, np.nan)  # every worker's seconds per token, from past steps
  for t in range(steps):
    factors = trace.factors(t)
    token_s = cost.compute_s(np.full(n, rows), factors)
    noise = rng.lognormal(-sigma ** 2 / 2, sigma, tokens) if sigma else np.ones(tokens)
    known = endgame and t > 0 and bool(np.isfinite(estimate).all())
    leader = int(np.argmax(shares[t - 1])) if known else None  # never leaves tokens to others
    fastest = int(np.argmin(estimate)) if known else 0
    lowest = np.partition(estimate, min(1, n - 1))[:2] if known else None  # min of the others
    own = estimate.copy()  # each worker's latest token time
    # (when the worker next pulls, worker, when it is free to compute, whether that pull is a
    # prefetch: made as its previous token started, so no end-game read comes before it)
    free = [(0.0, w, 0.0, False) for w in range(n)]
    done, left = np.empty(n), tokens
    while free:
      now, w, ready, ahead = heapq.heappop(free)
      may_leave = (leader is not None and w != leader
                   and own[w] >= SURE_TAKE * lowest[int(w == fastest)])  # in O(1)
      if left and not ahead and may_leave and shares[t, w]:
        now += pull_s  # reads how many tokens are left
        if not takes_token(own[w], np.delete(estimate, w), left):
          done[w] = max(now, ready)
          continue
      if not left:
        done[w] = max(now + pull_s, ready)  # the pull that finds the queue empty
        continue
      seconds = float(token_s[w] * noise[tokens - left])
      first = not shares[t, w]  # its speed this step is not measured yet: no prefetch
      busy[t, w] += seconds
      shares[t, w] += rows
      left -= 1
      start = max(now + pull_s, ready)
      own[w] = start + seconds - max(now, ready)
      if prefetch and leader is not None and not first and not may_leave:
        heapq.heappush(free, (start, w, start + seconds, True))  # pulls as this token starts
      else:
        heapq.heappush(free, (start + seconds, w, start + seconds, False))
    iter_s[t] = done.max() + comm
    idle[t] = (done.max() - done) / iter_s[t]
    limit[t] = cost.balanced_limit_s(x, factors)
    worked = shares[t] > 0
    estimate[worked] = busy[t, worked] / (shares[t, worked] / rows) + pull_s
    history.append(StepStats(t, rows=tuple(shares[t].tolist()), compute_s=tuple(busy[t].tolist()),
                             sync_s=comm, iter_s=float(iter_s[t]), load=tuple(factors.tolist())))
  arrays = [shares, busy, np.full(steps, comm), iter_s, limit, idle]
  for a in arrays:
    a.setflags(write=False)
  return VirtualRun(*arrays, history=tuple(history))
