"""Fela's token scheduling: each iteration's batch cut into tokens that workers pull as they go.

Instead of deciding shares before an iteration (BSP, LB-BSP), the global batch of step ``t`` is
cut into ``tokens = X / token_rows`` fixed-size pieces, and every worker pulls the next piece
whenever it is free, so a fast worker does more pieces and a worker that slows down mid-run does
fewer at once, with no prediction. The iteration ends when the last token is done; then the
usual fused all-reduce and optimizer update (`WorkerTrainer.combine`) run once.

**The queue is a counter.** Token ids of step ``t`` come from one key of the coordination
service, ``tokens/t``: `Channel.increment` adds 1 and returns the new value atomically (the
service applies increments one at a time), so worker pulls get 1, 2, 3, … each exactly once,
whichever order they arrive in. Id ``v − 1 < tokens`` names rows ``[id·token_rows,
(id + 1)·token_rows)`` of the step's global batch; a larger id says the queue is empty. Every
token is therefore computed exactly once, by exactly one worker, and no token is lost.

**Why the result is BSP's.** Each worker's program returns Σ ∇loss / X over its rows, the worker
adds its tokens' partial sums, and the all-reduce adds the workers': the total is Σ over all X
rows / X whatever the split — "combine weighted by tokens done" is this sum. Only float rounding
order differs from one device computing the batch.

**What it costs.** A pull is one round trip to the coordinator: cheap over an idle loopback,
several times dearer when the machine is loaded. A worker pulls once per token plus once to
find the queue empty, so a step makes ``tokens + workers`` pulls: with 16 tokens over 4
workers, about 5 per worker, a small part of a step. Each token also places its rows and
launches the fixed ``token_rows`` program (compiled once: the token shape never changes), so a
step makes ``tokens`` gradient calls where BSP makes one per worker. Timed back to back
(`WorkerTrainer.local_gradient`, no pulls), a call's time is close to proportional to its rows.
Inside the token benchmark (a pull, a dilation sleep between calls) a
128-row call costs nearly what a 512-row call costs in the BSP blocks beside it, for reasons
not pinned down (``experiments/_fela_tokens.py``), and that is where tokens lose there.
The end of an iteration is also quantised: workers wait up to one (slow worker's) token time.

**The end game.** Pure greedy pulling has a tail: a slow worker that frees up near the end takes
one of the last tokens and finishes it long after the others (4 workers, one 3× slow, 16 tokens:
6 token times where 5 suffice). With ``TokenRules.endgame`` (the default) a worker whose token
takes at least 1.5× the fastest other's first reads how many tokens are left
(``increment(key, 0)``, one more round trip) and leaves them when the others would finish them
all sooner than it finishes one (`hetjax.train.takes_token`, the rule the
virtual clock uses too). The speeds are everyone's busy seconds per token from the combine
(identical everywhere) and the worker's own latest token. Every worker takes its first token of
a step unconditionally, so its speed is measured every step, and the worker that did the most
tokens in the previous step (an exact integer every worker knows) never leaves, so every token
is still computed; the combine then checks that the rows done add up to the global batch.

**Prefetch.** Once every speed is known, a worker the end game keeps (the leader, or one whose
token time is too short to ever leave, `may_leave`) pulls its next token and places its rows
right after launching the current one's gradient, so both run while the device computes
(``TokenRules.prefetch``, on by default). It starts with its second token of a step, once that
step's speed is measured: under changing speeds a host that has just turned slow would
otherwise commit to two tokens on its old speed. A worker that may leave still decides after
each token. A prefetched token is always computed, so the queue's exactly-once holds.

Example (run in every worker)::

  rules = TokenRules(global_batch=2048, token_rows=128)
  trainer = TokenTrainer(task, optax.adam(1e-3), 2048, rules, Channel('run0'))
  for info in training_steps(trainer, trainer.init_state(), 100, policy=rules):
    state = info.state          # info.stats.tokens: how many tokens each worker did
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from hetjax._checks import positive_int
from hetjax._errors import ConfigError
from hetjax.core import Pace, StepStats, Work, WorkerTiming, host_load
from hetjax.data import take_rows
from hetjax.runtime import Channel
from hetjax.train._endgame import may_leave, takes_token
from hetjax.train._state import TrainState
from hetjax.train._task import Task
from hetjax.train._workers import WorkerTrainer


@dataclasses.dataclass(frozen=True)
class TokenRules:
  """How a step's global batch is cut into tokens, and the token policy (a value).

  As a policy (`hetjax.core.Policy`), its state is every worker's busy seconds per token as the
  combines report them, and which worker never leaves tokens to the others (the one that did
  the most rows in the latest step; -1 until every worker's speed is known): the end game's
  inputs. They are saved in checkpoints like any policy state.

  Example::

    >>> TokenRules(global_batch=64, token_rows=8).tokens
    8

  Attributes:
    global_batch: X, the rows of every step.
    token_rows: rows per token; divides X, and is a multiple of ``local_batch_degree``.
    local_batch_degree: how many ways a worker splits its rows over its local devices
      (`WorkerTrainer.local_batch_degree`); `TokenTrainer` checks it.
    endgame: a slow worker leaves the last tokens to faster ones (see the module docstring);
      False is Fela's plain greedy pulling.
    prefetch: under the end game, a worker it keeps pulls its next token while the current
      one computes (the round trip off the critical path; see the module docstring).

  Raises:
    ConfigError: one line, when ``token_rows`` is not a positive divisor of X or not a multiple
      of the local degree.
  """

  global_batch: int
  token_rows: int
  local_batch_degree: int = 1
  endgame: bool = True
  prefetch: bool = True

  def __post_init__(self):
    x, rows, degree = self.global_batch, self.token_rows, self.local_batch_degree
    for name, value in (('global_batch', x), ('token_rows', rows), ('local_batch_degree', degree)):
      positive_int(value, f'token rules: {name}')
    if x % rows:
      raise ConfigError(f'token rules: token_rows {rows} does not divide the global batch {x}')
    if rows % degree:
      raise ConfigError(f'token rules: token_rows {rows} is not a multiple of the local '
                        f'data-parallel degree {degree}')

  @property
  def name(self) -> str:
    return 'tokens' if self.endgame else 'tokens-greedy'

  @property
  def tokens(self) -> int:
    """Tokens per step: X / token_rows."""
    return self.global_batch // self.token_rows

  def rows(self, token: int) -> slice:
    """The global-batch rows of token ``token``."""
    return slice(token * self.token_rows, (token + 1) * self.token_rows)

  # -- the policy ------------------------------------------------------------------------------

  def init(self) -> dict[str, Any]:
    return {'per_token_s': np.zeros(0), 'leader': -1}

  def update(self, state: dict[str, Any], stats: StepStats | None
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Learns each worker's seconds per token from a finished step; the decision is the state."""
    if stats is None:
      return state, state
    busy = np.asarray(stats.compute_s, np.float64)
    rows = np.asarray(stats.rows, np.float64)
    per_token = np.asarray(state['per_token_s'], np.float64)
    if per_token.shape != busy.shape:
      per_token = np.full(busy.shape, np.nan)
    worked = rows > 0
    per_token = per_token.copy()
    per_token[worked] = busy[worked] * self.token_rows / rows[worked]
    known = bool(np.isfinite(per_token).all())
    state = {'per_token_s': per_token, 'leader': int(np.argmax(rows)) if known else -1}
    return state, state  # exact integers in, the same leader on every worker

  def prefetches(self, decision: dict[str, Any] | None) -> bool:
    """Whether a worker may pull its next token while one computes: with ``prefetch``, under
    the end game, once every speed is known (`TokenTrainer` then prefetches only while the end
    game keeps the worker, so greedy pulling never does)."""
    return self.endgame and self.prefetch and decision is not None and decision['leader'] != -1

  def others(self, decision: dict[str, Any] | None, worker: int) -> np.ndarray | None:
    """The other workers' seconds per token, or None if ``worker`` must never leave tokens."""
    if not self.endgame or decision is None or decision['leader'] in (-1, worker):
      return None
    return np.delete(np.asarray(decision['per_token_s']), worker)


@dataclasses.dataclass(frozen=True)
class _Pulled:
  """What one worker did in one token step."""

  packed: Any
  done: int
  pulls: int
  pull_s: float
  compute_s: float
  slept: float
  overrun: float
  compile_s: float
  data_s: float
  left: int


class TokenTrainer(WorkerTrainer):
  """Token-scheduled steps (the `StepProgram` shape): the same SGD as `WorkerTrainer`, with the
  split decided by who is free.

  Args:
    task, optimizer, global_batch: as for `WorkerTrainer`.
    tokens: the token size and whether to play the end game (its global batch must be this
      trainer's).
    channel: the coordination-service channel holding the counters (keys ``tokens/STEP``); the
      same prefix on every worker.
    local_shape, rules, seed, host, accumulate: as for `WorkerTrainer` (a token of more rows
      than a micro-batch is computed in several).
  """

  def __init__(
      self,
      task: Task,
      optimizer,
      global_batch: int,
      tokens: TokenRules,
      channel: Channel,
      local_shape: tuple[int, int] | None = None,
      rules=None,
      seed: int = 0,
      host: Pace | None = None,
      *,
      accumulate: int = 1,
  ):
    super().__init__(task, optimizer, global_batch, local_shape, rules, seed, host=host,
                     accumulate=accumulate)
    if tokens.global_batch != global_batch:
      raise ConfigError(f'token rules are for a global batch of {tokens.global_batch}, the '
                        f'trainer trains {global_batch}')
    if tokens.token_rows % self.local_batch_degree:
      raise ConfigError(f'token_rows {tokens.token_rows} is not a multiple of the local '
                        f'data-parallel degree {self.local_batch_degree}')
    self.tokens, self.channel = tokens, channel
    self._warm = False

  def _warm_up(self, state: TrainState, host_batch) -> None:
    """Compiles the token program, the sum and the zero gradient before any pull, so no worker
    drains the queue while another compiles, and no token's time includes a compile."""
    jax.block_until_ready(self.accumulate(self.zero_gradient(), self.zero_gradient()))
    if self.tokens.token_rows not in self.programs.sizes:
      rows = self.tokens.rows(0)
      batch = self.place(take_rows(host_batch, rows.start, rows.stop))
      jax.block_until_ready(self.local_gradient(state, batch))
      self.programs.wait()
    self._warm = True

  def _pull(self, state: TrainState, work: Work, others: np.ndarray | None,
            prefetch: bool = False) -> _Pulled:
    """Pulls and computes tokens until the queue is empty or the end game says leave.

    With ``prefetch``, from its second token of the step on (once its speed this step is
    measured: a host that has just slowed down must not commit to two tokens at once), a worker
    the end game keeps (``others`` None: the leader; or its latest token too short to ever
    leave, `may_leave`) pulls its next token and places its rows while the current one
    computes, so both are off its critical path; a worker that may leave decides after each
    token, as without. A prefetched token is always computed: none is lost.
    """
    rules, key, step = self.tokens, f'tokens/{work.step}', work.step
    packed, done, pulls, pull_s, compute_s, slept, late, compile_s, data_s = (
        None, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    own_s, overhead, left, token, batch = 0.0, 0.0, 0, None, None

    def pull() -> int:
      nonlocal pulls, pull_s
      pulling = time.perf_counter()
      got = self.channel.increment(key) - 1
      pulls, pull_s = pulls + 1, pull_s + time.perf_counter() - pulling
      return got

    def place(token: int):
      nonlocal data_s
      placing = time.perf_counter()
      rows = rules.rows(token)
      placed = jax.block_until_ready(self.place(take_rows(work.batch, rows.start, rows.stop)))
      data_s += time.perf_counter() - placing
      return placed

    while True:
      started = time.perf_counter()
      if token is None:
        if done and others is not None and may_leave(own_s, others + overhead):
          reading = time.perf_counter()
          remaining = rules.tokens - self.channel.increment(key, 0)
          pulls, pull_s = pulls + 1, pull_s + time.perf_counter() - reading
          if not takes_token(own_s, others + overhead, remaining):
            left = max(remaining, 0)
            break
        started = time.perf_counter()
        token = pull()
      if token >= rules.tokens:
        break
      if batch is None:
        batch = place(token)
      computing = time.perf_counter()
      grad = self.local_gradient(state, batch)  # dispatched: it runs while this thread pulls
      token, batch = None, None
      if prefetch and done and (others is None or not may_leave(own_s, others + overhead)):
        token = pull()
        batch = place(token) if token < rules.tokens else None
      grad = jax.block_until_ready(grad)
      compile_s += self.last_compile_s
      seconds = time.perf_counter() - computing - self.last_compile_s
      # The host's clock runs over the step, not per call: a token whose compute ran past its
      # time is made up by the next one's padding (the host sleeps that much less). ``late`` is
      # what is still owed; left after the last token, it is the step's overrun.
      sleep, late = (self.pace.pad(step, rules.token_rows, seconds + late) if self.pace
                     else (0.0, 0.0))
      compute_s, slept = compute_s + seconds, slept + sleep
      packed = grad if packed is None else self.accumulate(packed, grad)
      done += 1
      own_s = time.perf_counter() - started - self.last_compile_s
      overhead = own_s - seconds - sleep  # the pull and placing the rows
    return _Pulled(packed, done, pulls, pull_s, compute_s, slept, late, compile_s, data_s,
                   left)

  def step(self, state: TrainState, work: Work, decision: dict[str, Any] | None
           ) -> tuple[TrainState, StepStats]:
    """One token-scheduled step: pull tokens until the queue is empty (or the end game says
    leave them to faster workers), then join the combine (a worker that got no token adds
    `WorkerTrainer.zero_gradient`). Worker 0 deletes the step's counter once the combine
    returns: a combine cannot return before every worker joined it, and a worker joins only
    after its last pull, so no pull of that step can come later.

    Raises:
      RuntimeError: if the rows the workers did do not add up to the global batch (a bug; the
        counter makes it impossible).
    """
    if not self._warm:
      self._warm_up(state, work.batch)
    start = time.perf_counter()
    compiling = self.programs.compiling
    got = self._pull(state, work, self.tokens.others(decision, self.worker),
                     self.tokens.prefetches(decision))
    compiled_s = self.programs.take_compiled()
    sampled = not (compiling or self.programs.compiling or compiled_s > 0)
    rows = got.done * self.tokens.token_rows
    load = host_load(self.pace, work.step)
    combine = time.perf_counter()
    state, head = jax.block_until_ready(self.combine(
        state, self.zero_gradient() if got.packed is None else got.packed,
        busy_s=got.compute_s + got.slept, load=load, sampled=sampled, rows=rows,
        compile_s=compiled_s))
    end = time.perf_counter()
    if self.worker == 0:
      self.channel.delete(f'tokens/{work.step}')
    head = self.read_head(head)
    done = np.rint(head['rows']).astype(int)
    if done.sum() != self.global_batch:
      raise RuntimeError(f'step {work.step}: the workers computed {done.tolist()} rows, not the '
                         f'global batch {self.global_batch}: the token queue lost tokens')
    local = WorkerTiming(
        step=work.step + 1, worker=self.worker, share=rows,
        slowdown=self.pace.factor(work.step) if self.pace else 1.0,
        data_s=got.data_s + got.pull_s, compute_s=got.compute_s, dilation_s=got.slept,
        collective_s=end - combine, step_s=end - start, compile_s=got.compile_s, load=load,
        overrun_s=got.overrun, pulls=got.pulls, pull_s=got.pull_s, left=got.left,
        sampled=sampled)
    tokens = tuple(int(r) // self.tokens.token_rows for r in done)
    return state, self.stats(work.step, head, end - start, got.compile_s, local, tokens)
