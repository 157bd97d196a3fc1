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

**What it costs.** A pull is one round trip to the coordinator: a median 0.4 ms (p90 0.8 ms)
over loopback with 4 workers on the otherwise idle 2-core development machine, 2–8 ms when the
machine is loaded. A worker pulls once per token plus once to find the queue empty, so a step
makes ``tokens + workers`` pulls: with 16 tokens over 4 workers, about 5 per worker, 2 ms of a
~300 ms step. Each token also places its rows and launches the fixed ``token_rows`` program
(compiled once: the token shape never changes), so a step makes ``tokens`` gradient calls
where BSP makes one per worker. Measured with 4 workers on the 2 cores, calls back to back
(`WorkerTrainer.local_gradient`, no pulls): 4–12 ms for 128 rows against 16–30 ms for 512,
close to proportional. Inside the token benchmark (a pull, a dilation sleep between calls) a
128-row call costs nearly what a 512-row call costs in the BSP blocks beside it, for reasons
not pinned down (``experiments/_fela_tokens.py``), and that is where tokens lose there.
The end of an iteration is also quantised: workers wait up to one (slow worker's) token time.

**The end game.** Pure greedy pulling has a tail: a slow worker that frees up near the end takes
one of the last tokens and finishes it long after the others (4 workers, one 3× slow, 16 tokens:
6 token times where 5 suffice). With ``TokenRules.endgame`` (the default) a worker whose token
takes at least 1.5× the fastest other's first reads how many tokens are left
(``increment(key, 0)``, one more round trip) and leaves them when the others would finish them
all sooner than it finishes one (`hetjax.runtime._virtual_tokens.takes_token`, the rule the
virtual clock uses too). The speeds are everyone's busy seconds per token from the combine
(identical everywhere) and the worker's own latest token. Every worker takes its first token of
a step unconditionally, so its speed is measured every step, and the worker that did the most
tokens in the previous step (an exact integer every worker knows) never leaves, so every token
is still computed; the combine then checks that the rows done add up to the global batch.

Example (run in every worker)::

  rules = TokenRules(global_batch=2048, token_rows=128)
  for info in token_steps(trainer, trainer.init_state(), 100, rules, Channel('run0')):
    state = info.state          # info.stats.tokens: how many tokens this worker did
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

import jax
import numpy as np

from hetjax._errors import ConfigError
from hetjax.runtime import Channel, StepStats, TelemetryGatherer, TimeDilation, WorkerStepStats
from hetjax.runtime._virtual_tokens import may_leave, takes_token
from hetjax.train._loop import Hook, StepInfo, run_hooks
from hetjax.train._state import TrainState
from hetjax.train._worker_loop import host_load
from hetjax.train._workers import WorkerTrainer


@dataclasses.dataclass(frozen=True)
class TokenRules:
  """How a step's global batch is cut into tokens.

  Example::

    >>> TokenRules(global_batch=64, token_rows=8).tokens
    8

  Attributes:
    global_batch: X, the rows of every step.
    token_rows: rows per token; divides X, and is a multiple of ``local_batch_degree``.
    local_batch_degree: how many ways a worker splits its rows over its local devices
      (`WorkerTrainer.local_batch_degree`); `token_steps` checks it against the trainer.
    endgame: a slow worker leaves the last tokens to faster ones (see the module docstring);
      False is Fela's plain greedy pulling.

  Raises:
    ConfigError: one line, when ``token_rows`` is not a positive divisor of X or not a multiple
      of the local degree.
  """

  global_batch: int
  token_rows: int
  local_batch_degree: int = 1
  endgame: bool = True

  def __post_init__(self):
    x, rows, degree = self.global_batch, self.token_rows, self.local_batch_degree
    for name, value in (('global_batch', x), ('token_rows', rows), ('local_batch_degree', degree)):
      if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f'token rules: {name} must be an integer >= 1, got {value!r}')
    if x % rows:
      raise ConfigError(f'token rules: token_rows {rows} does not divide the global batch {x}')
    if rows % degree:
      raise ConfigError(f'token rules: token_rows {rows} is not a multiple of the local '
                        f'data-parallel degree {degree}')

  @property
  def tokens(self) -> int:
    """Tokens per step: X / token_rows."""
    return self.global_batch // self.token_rows

  def rows(self, token: int) -> slice:
    """The global-batch rows of token ``token``."""
    return slice(token * self.token_rows, (token + 1) * self.token_rows)


@dataclasses.dataclass(frozen=True)
class TokenStepStats(WorkerStepStats):
  """`WorkerStepStats` (``share`` = rows done) plus what the queue cost this worker.

  ``data_s`` includes the pulls. Telemetry gets the `WorkerStepStats` part (`base`), so reports
  read token runs like any other.

  Attributes:
    tokens: tokens this worker computed in the step.
    pulls: round trips to the counter: one per token, plus the one that found the queue
      empty or the end game's read.
    pull_s: seconds those round trips took.
    left: tokens still queued when this worker left them to faster ones (end game); 0 when it
      found the queue empty.
  """

  tokens: int = 0
  pulls: int = 0
  pull_s: float = 0.0
  left: int = 0

  def base(self) -> WorkerStepStats:
    return WorkerStepStats(**{f.name: getattr(self, f.name)
                              for f in dataclasses.fields(WorkerStepStats)})


class _Speeds:
  """Every worker's busy seconds per token, as the combines report them, and which worker never
  leaves tokens to the others (the one that did the most rows in the latest step)."""

  def __init__(self, workers: int, token_rows: int, history: Sequence[StepStats]):
    self.per_token, self.token_rows, self.leader = np.full(workers, np.nan), token_rows, None
    for stats in history[-5:]:
      self.update(np.asarray(stats.compute_s), np.asarray(stats.shares))

  def update(self, busy: np.ndarray, rows: np.ndarray) -> None:
    worked = rows > 0
    self.per_token[worked] = busy[worked] * self.token_rows / rows[worked]
    known = np.isfinite(self.per_token).all()
    self.leader = int(np.argmax(rows)) if known else None  # exact integers: the same everywhere

  def others(self, worker: int) -> np.ndarray | None:
    """The other workers' seconds per token, or None if ``worker`` must never leave."""
    return None if self.leader in (None, worker) else np.delete(self.per_token, worker)


def _check(rules: TokenRules, trainer: WorkerTrainer) -> None:
  if rules.global_batch != trainer.global_batch:
    raise ConfigError(f'token rules are for a global batch of {rules.global_batch}, the trainer '
                      f'trains {trainer.global_batch}')
  if rules.token_rows % trainer.local_batch_degree:
    raise ConfigError(f'token_rows {rules.token_rows} is not a multiple of the local '
                      f'data-parallel degree {trainer.local_batch_degree}')


def _warm_up(trainer: WorkerTrainer, state: TrainState, rules: TokenRules, step: int) -> None:
  """Compiles the token program, the sum and the zero gradient before any pull, so no worker
  drains the queue while another compiles, and no token's time includes a compile."""
  jax.block_until_ready(trainer.accumulate(trainer.zero_gradient(), trainer.zero_gradient()))
  if rules.token_rows in trainer.programs.sizes:
    return
  host = trainer.task.data.global_batch(trainer.seed, step, trainer.global_batch)
  batch = trainer.place({k: a[rules.rows(0)] for k, a in host.items()})
  jax.block_until_ready(trainer.local_gradient(state, batch))
  trainer.programs.wait()  # a bucketed trainer may have run pieces while the size compiled


def token_steps(
    trainer: WorkerTrainer,
    state: TrainState,
    until: int,
    rules: TokenRules,
    channel: Channel,
    dilation: TimeDilation | None = None,
    telemetry: TelemetryGatherer | None = None,
    hooks: Sequence[Hook] = (),
    history: list[StepStats] | None = None,
) -> Iterator[StepInfo]:
  """Runs token-scheduled steps from ``state.step`` to ``until`` on every worker, yielding after
  each; the same SGD as `worker_steps`, with the split decided by who is free.

  Each step: build the step's global batch on the host, then until the queue is empty pull a
  token id (``channel.increment('tokens/STEP')``), place its rows, compute its packed gradient
  with the one ``token_rows`` program, sleep its time dilation (per token, so a slowed worker
  is slow on every token it takes) and add it to this worker's sum — or, with the end game,
  until the tokens left are better left to faster workers; then join the combine (a worker that
  got no token adds `WorkerTrainer.zero_gradient`). Worker 0 deletes the step's
  counter once the combine returns: a combine cannot return before every worker joined it, and
  a worker joins only after its last pull, so no pull of that step can come later.

  The combine's per-worker ``load`` slot carries the rows each worker did (token scheduling has
  no predictor to feed host loads to), so every worker appends the same `StepStats` — shares =
  rows done, ``compute_s`` = busy seconds — to ``history`` without another message.

  Args:
    trainer: the multi-worker trainer (its global batch must be ``rules.global_batch``).
    state: the state to start from (donated).
    until: the step to stop at.
    rules: the token size and whether to play the end game.
    channel: the coordination-service channel holding the counters (keys ``tokens/STEP``);
      the same prefix on every worker.
    dilation: this worker's slowdown emulation, if any.
    telemetry: where each step's `WorkerStepStats` go (share = rows this worker did).
    hooks: run on every worker after each step.
    history: the `StepStats` list to append to; pass one to keep it across calls (its last
      entries give the end game everyone's speed from the first step on).

  Yields:
    `StepInfo` with ``stats`` a `TokenStepStats`.

  Raises:
    ConfigError: rules that do not fit the trainer.
    RuntimeError: if the rows the workers did do not add up to the global batch (a bug; the
      counter makes it impossible).
  """
  _check(rules, trainer)
  history = [] if history is None else history
  speeds = _Speeds(trainer.workers, rules.token_rows, history)
  step = int(state.step)
  if step < until:
    _warm_up(trainer, state, rules, step)
  while step < until:
    key = f'tokens/{step}'
    start = time.perf_counter()
    host = trainer.task.data.global_batch(trainer.seed, step, trainer.global_batch)
    data_s = time.perf_counter() - start
    compiling = trainer.programs.compiling
    others = speeds.others(trainer.worker) if rules.endgame else None
    packed, done, pulls, pull_s, compute_s, slept, compile_s = None, 0, 0, 0.0, 0.0, 0.0, 0.0
    own_s, overhead, left = 0.0, 0.0, 0
    while True:
      if done and others is not None and may_leave(own_s, others + overhead):
        reading = time.perf_counter()
        remaining = rules.tokens - channel.increment(key, 0)
        pulls, pull_s = pulls + 1, pull_s + time.perf_counter() - reading
        if not takes_token(own_s, others + overhead, remaining):
          left = max(remaining, 0)
          break
      pulled = time.perf_counter()
      token = channel.increment(key) - 1
      placing = time.perf_counter()
      pulls, pull_s = pulls + 1, pull_s + placing - pulled
      if token >= rules.tokens:
        break
      batch = jax.block_until_ready(trainer.place({k: a[rules.rows(token)] for k, a in host.items()}))
      computing = time.perf_counter()
      data_s += computing - placing
      grad = jax.block_until_ready(trainer.local_gradient(state, batch))
      compile_s += trainer.last_compile_s
      seconds = time.perf_counter() - computing - trainer.last_compile_s
      sleep = dilation.apply(step, seconds, rows=rules.token_rows) if dilation else 0.0
      compute_s, slept = compute_s + seconds, slept + sleep
      packed = grad if packed is None else trainer.accumulate(packed, grad)
      done += 1
      own_s = time.perf_counter() - pulled - trainer.last_compile_s
      overhead = own_s - seconds - sleep  # the pull and placing the rows
    sampled = not (compiling or trainer.programs.compiling)
    combine = time.perf_counter()
    state, loss, busy, rows, samples = jax.block_until_ready(trainer.combine(
        state, trainer.zero_gradient() if packed is None else packed,
        busy_s=compute_s + slept, load=float(done * rules.token_rows), sampled=sampled))
    end = time.perf_counter()
    if trainer.worker == 0:
      channel.delete(key)
    busy, rows = np.asarray(busy, np.float64), np.rint(np.asarray(rows, np.float64)).astype(int)
    if rows.sum() != rules.global_batch:
      raise RuntimeError(f'step {step}: the workers computed {rows.tolist()} rows, not the '
                         f'global batch {rules.global_batch}: the token queue lost tokens')
    speeds.update(busy, rows)
    history.append(StepStats(step, tuple(rows.tolist()), tuple(busy.tolist()), 0.0,
                             float(busy.max()), (), tuple(np.asarray(samples).tolist())))
    stats = TokenStepStats(
        step=step + 1, worker=trainer.worker, share=done * rules.token_rows,
        slowdown=dilation.factor(step) if dilation else 1.0, data_s=data_s + pull_s,
        compute_s=compute_s, dilation_s=slept, collective_s=end - combine, step_s=end - start,
        compile_s=compile_s, load=host_load(dilation, step), tokens=done, pulls=pulls,
        pull_s=pull_s, left=left)
    step += 1
    if telemetry:
      telemetry.record(stats.base())
    info = StepInfo(step, state, {'loss': loss}, combine, stats)
    run_hooks(hooks, info, until)
    yield info
