"""A worker's gradient programs, one per share size, compiled so that a step never waits for one.

LB-BSP changes a worker's share between iterations, and each new share size is a new XLA
program. Compiling it on the spot stalls the whole job at the barrier (a compile costs many
steps of a small model). With a ``bucket`` this keeps, besides the programs of sizes already
seen, a binary ladder of *piece* programs (bucket × 1, 2, 4, …), compiled when the first new
size comes (a run whose shares never move compiles one program, as fixed shares do). A share
size without its own program yet runs as a sum of pieces — the gradient is a sum over rows, so
``Σ pieces = whole`` to float rounding — while its own program compiles on a background thread
and takes over once ready (pieces cost more compute than one program, so they are a stopgap).
What a step waits for counts as compile time: the ladder, and a size without pieces. A new
size's lowering (tracing, Python) and its XLA compile both run on the background thread: the
main thread spends most of a step in calls that release the GIL (a computation, a collective,
a host's sleep), so the lowering takes the GIL in those gaps.
Lowered on the main thread it took a noticeable part of the step time of policies whose shares
move every step.

That is granularity ``compile``. Where one compile costs more than a few steps (a model whose
step is short next to its compile: a small model on a loaded CPU, where one compile of a new
size lasts tens of steps and starves the other workers' steps while it runs; a 124M GPT on a
GPU, whose compile lasts hundreds of its steps), a new program per size cannot pay for
itself. Granularity ``micro`` never compiles one: shares are whole micro-batches of
``bucket`` rows, and a share runs as gradient accumulation over the programs of two sizes, the
first size it ran (a uniform share's, as the run starts) and one micro-batch, each compiled
once (the micro-batch when first needed): 20 rows beside a uniform 16 are 16 + 4 (two calls).
Those pieces are then the steady state, not a stopgap. ``auto`` (the config's default) picks
``micro`` at the first new size when the first program's compile took more than
`AUTO_CALLS` of its own calls, else ``compile``.
"""

from __future__ import annotations

import concurrent.futures
import enum
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

PyTree = Any
Batch = dict[str, jax.Array]

#: ``auto`` picks ``micro`` when the first program compiled in more than this many of its calls.
AUTO_CALLS = 5


class Granularity(enum.Enum):
  """How a worker computes a share size it has no program of (module docstring)."""

  COMPILE = 'compile'  # its own program, compiled in the background while pieces stand in
  MICRO = 'micro'      # whole micro-batches: the first size's program plus one micro-batch's
  AUTO = 'auto'        # micro when a compile costs more than AUTO_CALLS calls, else compile


def decompose(rows: int, sizes: list[int]) -> list[int] | None:
  """``rows`` as a sum of ``sizes`` (repeats allowed), largest first; None if greedy fails."""
  pieces, left = [], rows
  for size in sorted(set(sizes), reverse=True):
    while size <= left:
      pieces.append(size)
      left -= size
  return pieces if left == 0 else None


class SharePrograms:
  """Compiled gradient programs by share size: in memory, with optional background compiles.

  Args:
    lower: ``lower(params, batch)`` → a `jax.stages.Lowered` for the batch's row count; called
      with abstract arguments (shape, dtype and sharding).
    bucket: the granularity of share sizes; when given, pieces of bucket·2ᵏ up to ``max_rows``
      are compiled at the first call, and each new size compiles in the background.
    max_rows: the largest share this worker can get.
    granularity: with a bucket, how a new size runs (`Granularity`, module docstring); the
      bucket is then the micro-batch of ``micro``.

  Counters: ``compiles``/``compile_s`` are compiles the caller waited for
  (``last_compile_s`` for the latest call); ``background_compiles``/``background_compile_s``
  ran off the critical path; ``piece_steps`` counts calls that ran as a sum of pieces
  (``last_ran_pieces`` for the latest call).
  """

  def __init__(self, lower: Callable[[PyTree, Batch], Any], bucket: int | None = None,
               max_rows: int | None = None,
               granularity: Granularity | str = Granularity.COMPILE):
    self._lower, self.bucket, self.max_rows = lower, bucket, max_rows
    self.granularity = Granularity(granularity) if bucket else Granularity.COMPILE
    self._ready: dict[int, Any] = {}
    self._pending: dict[int, concurrent.futures.Future] = {}
    self._lock = threading.Lock()
    self._pool = None
    self.compiles, self.compile_s, self.last_compile_s = 0, 0.0, 0.0
    self.background_compiles, self.background_compile_s, self.piece_steps = 0, 0.0, 0
    self.last_ran_pieces = False
    self._calls: list[float] = []  # seconds of recent calls of the first size's program
    self._taken = 0.0  # compile seconds reported by `take_compiled`
    self._laddered = False
    self._template: tuple[PyTree, Batch] | None = None  # the first call's arguments (shapes)
    self._upcoming: int | None = None  # the rows `prepare` was last given
    self._failed: dict[int, BaseException] = {}  # background compiles that raised, by rows
    if bucket and self.granularity is Granularity.COMPILE:
      self._start_pool()

  def _start_pool(self) -> None:
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='hetjax-compile')

  def take_compiled(self) -> float:
    """Seconds compiled (waited for, or finished in the background) since the last call: a
    step's compile work, the compiles before the first step (a speed probe's) included."""
    total = self.compile_s + self.background_compile_s
    taken, self._taken = total - self._taken, total
    return taken

  def observe(self, rows: int, seconds: float) -> None:
    """Records a call of ``rows`` rows that took ``seconds`` with no compile beside it: what
    ``auto`` weighs a compile against."""
    if rows in self._ready and len(self._ready) == 1 and seconds > 0:
      self._calls = [*self._calls[-8:], seconds]

  def __call__(self, add: Callable, params: PyTree, batch: Batch):
    """The program's output for ``batch``: its own program, a sum of pieces, or a fresh compile."""
    rows = len(next(iter(batch.values())))
    self.last_compile_s, self.last_ran_pieces = 0.0, False
    self._collect()
    if self._template is None:
      self._template = (jax.tree.map(_abstract, params), dict(batch))
    if rows in self._ready:
      return self._ready[rows](params, batch)
    if self.granularity is Granularity.AUTO and self._ready:
      self._choose()
    compiling_each = self.granularity is Granularity.COMPILE and self.bucket
    if compiling_each and self._ready and not self._laddered and rows not in self._pending:
      self._compile_ladder(params, batch)  # at the first new size: a run that never moves
      self._laddered = True                # compiles one program, as fixed shares do
    if self.granularity is Granularity.MICRO and self._ready:
      if self.bucket not in self._ready:  # the micro-batch's program, once (waits counted)
        self._ready[self.bucket] = self._wait_or_compile(
            self.bucket, jax.tree.map(_abstract, params),
            {k: _abstract(v, self.bucket) for k, v in batch.items()})
      pieces = decompose(rows, list(self._ready))
      if pieces is not None:
        return self._run_pieces(add, pieces, params, batch, stopgap=False)
    pieces = None if rows in self._pending else self._pieces(rows)  # prepared: wait for it
    if pieces is None:
      self._ready[rows] = self._wait_or_compile(rows, params, batch)
      return self._ready[rows](params, batch)
    self._submit(rows, params, batch)
    return self._run_pieces(add, pieces, params, batch)

  def prepare(self, rows: int | None) -> None:
    """Starts compiling, in the background, what a share of ``rows`` will need, so that the
    step that runs it does not wait for it (`hetjax.core.Shares.upcoming`: a move a policy
    holds until every worker is `ready` for it): its own program (``compile``), or the
    micro-batch's (``micro``) where the programs ready do not make it up. Nothing before the
    first call (no shapes yet), nor without a bucket; None: no share is prepared."""
    self._upcoming = rows
    if not self.bucket or self._template is None or not rows or rows <= 0:
      return
    self._collect()
    if rows in self._ready or rows in self._pending:
      return
    if self.granularity is Granularity.AUTO:
      self._choose()
    if self.granularity is Granularity.MICRO and decompose(rows, list(self._ready)) is not None:
      return
    if self._pool is None:
      self._start_pool()
    size = rows if self.granularity is Granularity.COMPILE else self.bucket
    self._submit(size, *self._template)

  @property
  def ready(self) -> bool:
    """Whether the share last prepared (`prepare`) runs without waiting for a compile: its own
    program is compiled, or (``micro``) the programs compiled make it up. True when none is
    prepared, or where this worker cannot prepare one (no bucket, no call yet): a move then
    compiles when it comes, as it always did. A background compile of what it needs that
    raised is raised here (a held move would otherwise wait for it forever)."""
    rows = self._upcoming
    if not rows or rows <= 0 or not self.bucket or self._template is None:
      return True
    self._collect()
    needed = rows if self.granularity is Granularity.COMPILE else self.bucket
    if needed in self._failed:
      raise self._failed[needed]
    if rows in self._ready:
      return True
    return (self.granularity is Granularity.MICRO
            and decompose(rows, list(self._ready)) is not None)

  def wait(self) -> None:
    """Blocks until every queued background compile has finished (tests, warm-ups)."""
    # A future cancelled by `close` never reaches a finished state: waiting on it would hang.
    concurrent.futures.wait([f for f in self._pending.values() if not f.cancelled()])
    self._collect()

  @property
  def sizes(self) -> tuple[int, ...]:
    """Row counts with a compiled program ready."""
    self._collect()
    return tuple(sorted(self._ready))

  def close(self) -> None:
    """Drops queued background compiles (one already running finishes); later new sizes are
    compiled when needed."""
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)
      self._pool = None

  # -- internals -----------------------------------------------------------------------------------

  def _collect(self) -> None:
    """Moves finished background compiles into the ready set."""
    for rows, future in list(self._pending.items()):
      if future.done():
        del self._pending[rows]
        if future.cancelled():
          continue
        if future.exception() is None:
          self._ready.setdefault(rows, future.result())
        else:  # raised where it is needed: a run (compiled again there) or `ready`
          self._failed[rows] = future.exception()

  def _pieces(self, rows: int) -> list[int] | None:
    if self._pool is None or not self._ready:
      return None
    return decompose(rows, list(self._ready))

  def _wait_or_compile(self, rows: int, params: PyTree, batch: Batch):
    start = time.perf_counter()
    future = self._pending.pop(rows, None)
    executable = None
    if future is not None:
      try:
        executable = future.result()
      except Exception:  # compiled again below, where the error surfaces
        executable = None
    if executable is None:
      executable = self._lower(params, batch).compile()
    self._count(time.perf_counter() - start, compiles=1)
    return executable

  @property
  def compiling(self) -> bool:
    """Whether a background compile is queued or running (it competes for the cores)."""
    return any(not f.done() for f in self._pending.values())

  def _choose(self) -> None:
    """``auto`` decides, at the first new size: ``micro`` when the first program's compile
    took more than `AUTO_CALLS` of its calls (their median; with no call timed, ``micro``),
    else ``compile``."""
    call_s = statistics.median(self._calls) if self._calls else 0.0  # unknown: never compile
    if self.compile_s > AUTO_CALLS * call_s:
      self.granularity = Granularity.MICRO
    else:
      self.granularity = Granularity.COMPILE
      if self._pool is None:
        self._start_pool()

  def _run_pieces(self, add: Callable, pieces: list[int], params: PyTree, batch: Batch,
                  stopgap: bool = True):
    """The sum of ``pieces``' programs over consecutive rows of ``batch``; ``stopgap``: they
    stand in for a size still compiling (the step is then no speed sample)."""
    self.piece_steps += stopgap
    self.last_ran_pieces = stopgap
    out, start = None, 0
    for size in pieces:
      part = {k: jax.device_put(v[start:start + size], v.sharding) for k, v in batch.items()}
      result = self._ready[size](params, part)
      out = result if out is None else add(out, result)
      start += size
    return out

  def _submit(self, rows: int, params: PyTree, batch: Batch) -> None:
    """Lowers and compiles ``rows``'s program on the background thread, from abstract
    arguments taken here (shapes, dtypes and shardings only)."""
    if rows in self._ready or rows in self._pending:
      return
    abstract = (jax.tree.map(_abstract, params), {k: _abstract(v, rows) for k, v in batch.items()})

    def compile_one():
      start = time.perf_counter()
      executable = self._lower(*abstract).compile()
      with self._lock:
        self.background_compiles += 1
        self.background_compile_s += time.perf_counter() - start
      return executable

    self._pending[rows] = self._pool.submit(compile_one)

  def _compile_ladder(self, params: PyTree, batch: Batch) -> None:
    """Pieces bucket·2ᵏ up to ``max_rows``, compiled at the first new size (counted: the step
    waits for them); those already compiled are kept."""
    size = self.bucket
    while size <= (self.max_rows or size):
      if size in self._ready:
        size *= 2
        continue
      start = time.perf_counter()
      self._ready[size] = self._lower(jax.tree.map(_abstract, params),
                                      {k: _abstract(v, size) for k, v in batch.items()}).compile()
      self._count(time.perf_counter() - start, compiles=1)
      size *= 2

  def _count(self, seconds: float, compiles: int = 0) -> None:
    self.last_compile_s += seconds
    self.compile_s += seconds
    self.compiles += compiles


def _abstract(x: jax.Array, rows: int | None = None) -> jax.ShapeDtypeStruct:
  shape = x.shape if rows is None else (rows, *x.shape[1:])
  return jax.ShapeDtypeStruct(shape, x.dtype, sharding=x.sharding)
