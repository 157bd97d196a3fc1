"""A pipeline replica's emulated host: each step padded by sleep to what a `KnownSpeedHost` takes.

Replicas are slowed the way every other mode is (one emulator, one grammar): a `SlowdownTrace`
from `parse_trace` (``--slowdown``: ``persistent:W:F`` for SDPipe's persistent straggler,
``transient:H[:P][:seed=N]`` for its transient ones, and ``static``, ``step``, ``markov``,
``csv`` and products alike; `replica_trace` reads a spec or takes a trace) and a
`KnownSpeedHost` per replica. A replica's step always trains on the same rows (its batch), so
`HostPause` prices every step at those rows: the step is padded to ``(factor + delay) ×
(fixed_s + rows × row_s)``, and with ``row_s = step_s`` for one row (`HostPause.of_step`) to
``(factor + delay) × step_s``. The step number the host sees is the replica's step after the
update (1, 2, …): the transient draw for (seed, worker, step) is `TransientTrace`'s, so every
policy run with the same seed meets the same stragglers at the same steps, on real workers and
on the virtual clock (`hetjax.simulation.simulate_sync`). A compute longer than the target is
not padded (`hetjax.replicas.ReplicaStep.compute_s` shows it).
"""

from __future__ import annotations

import contextlib
import dataclasses

from hetjax._checks import integer, positive_int, positive_seconds
from hetjax._errors import ConfigError
from hetjax._links import Collective
from hetjax.emulation._grammar import parse_trace
from hetjax.emulation._hosts import KnownSpeedHost
from hetjax.emulation._traces import ComposedTrace, SlowdownTrace, TransientTrace


def replica_trace(slowdown: str | SlowdownTrace | None, workers: int,
                  seed: int | None = None) -> SlowdownTrace:
  """The slowdown of ``workers`` replicas: a `parse_trace` spec (None: 'none') or a trace.

  ``seed``, if given, seeds the transient draws of a spec that names no ``seed=`` itself (so a
  benchmark round can draw afresh with the spec left as written).

  Example::

    >>> replica_trace('transient:3', 4, seed=2) == TransientTrace(4, 3.0, 0.1, seed=2)
    True

  Raises:
    ConfigError: a bad spec, a trace of another size, or a bad seed, in one line.
  """
  if isinstance(slowdown, str) or slowdown is None:
    trace = parse_trace(slowdown or 'none', workers)
    named = 'seed=' in (slowdown or '')
  elif isinstance(slowdown, SlowdownTrace):
    trace, named = slowdown, True
    if trace.workers != workers:
      raise ConfigError(f'slowdown trace is for {trace.workers} workers, the job has {workers}')
  else:
    raise ConfigError(f'slowdown must be a trace spec or a SlowdownTrace, got '
                      f'{type(slowdown).__name__}')
  if seed is None or named:
    return trace
  return _reseed(trace, integer(seed, 'seed'))


def _reseed(trace: SlowdownTrace, seed: int) -> SlowdownTrace:
  if isinstance(trace, TransientTrace):
    return dataclasses.replace(trace, seed=seed)
  if isinstance(trace, ComposedTrace):
    return ComposedTrace(tuple(_reseed(part, seed) for part in trace.parts))
  return trace


@dataclasses.dataclass(frozen=True)
class HostPause:
  """A replica's host priced per step (module docstring): a `hetjax.core.Pace` whose every
  compute phase is a step of ``rows`` rows, padded to ``host.target_s(step, rows)``, whatever
  rows the program reports (a replica's steps all train its one batch).

  Example::

    pause = HostPause.of_step('persistent:1:3', workers=4, worker=1, step_s=0.06)
    slept, _ = pause.pad(step, rows=8, measured_s=0.012)   # 0.168 s: 3 × 60 ms in all

  Attributes:
    host: this replica's emulated host.
    rows: the rows of each of its steps (its batch).
  """

  host: KnownSpeedHost
  rows: int

  def __post_init__(self):
    positive_int(self.rows, 'rows')

  @classmethod
  def of_step(cls, slowdown: str | SlowdownTrace | None, workers: int, worker: int,
              step_s: float, seed: int | None = None, **host_options) -> HostPause:
    """A replica whose undisturbed step takes ``step_s`` seconds (one row of ``step_s``).

    ``host_options`` go to `KnownSpeedHost` (``sleep``, ``clock``: fakes for tests)."""
    step_s = positive_seconds(step_s, 'step_s')
    trace = replica_trace(slowdown, workers, seed)
    return cls(KnownSpeedHost(trace, worker, row_s=step_s, **host_options), 1)

  def target_s(self, step: int) -> float:
    """How long ``step`` takes in all on this host."""
    return self.host.target_s(_step(step), self.rows)

  def factor(self, step: int) -> float:
    """The host's slowdown at ``step``."""
    return self.host.factor(_step(step))

  def load(self, step: int) -> float:
    """The host-load input of ``step``: its slowdown (`hetjax.core.Pace.load`)."""
    return self.factor(step)

  def pad(self, step: int, rows: int, measured_s: float) -> tuple[float, float]:
    """Sleeps the rest of `target_s` after a step's compute of ``measured_s`` (``rows`` is
    the replica's batch: every step is priced at `rows`); (slept, overrun) seconds."""
    return self.host.pad(_step(step), self.rows, measured_s)

  def pad_action(self, step: int, stage: int, kind: str, measured_s: float
                 ) -> tuple[float, float]:
    """Refused in one line, as `KnownSpeedHost.pad_action`."""
    return self.host.pad_action(step, stage, kind, measured_s)

  def exchange(self, nbytes: int, collective: Collective = Collective.GRADIENT
               ) -> contextlib.AbstractContextManager[None]:
    """No links: a replica's averaging takes the machine's time."""
    return contextlib.nullcontext()


def _step(step: object) -> int:
  return integer(step, 'step')
