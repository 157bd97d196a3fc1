"""`SchmpProgram`: a round of scheduled model parallelism as one SPMD program, a `StepProgram`.

Every device of the job holds an equal share of the data's rows (mesh axis ``'rows'``, across
processes too) and the parameters as the app lays them out. A round is one jitted
`jax.shard_map` of `App.round`: each device computes partial sums over its rows, one collective
combines them (or `lax.ppermute` rotates blocks), the update is applied and its result is on
every device that needs it. The schedule has a fixed number of slots, so the round compiles once.

Scheduling overlaps the update (bounded staleness). JAX dispatches a round and returns; the
program hands the loop's scheduler the `RoundInfo` of round t − ``staleness``, whose values are
ready or nearly (fetching them waits for that round only), so the host picks round t + 1's
blocks while the devices still run round t. ``staleness=0`` waits for round t itself: exact,
no overlap. What a round computes never depends on the staleness — only which blocks the
scheduler picks, from information that many rounds old. The rounds not yet reported are part
of the state (`SchmpState.pending`, one device entry per round, each the output of its own
round), so a checkpoint holds them and a resumed run tells its scheduler exactly what the
uninterrupted run would have.

Hosts of known speed (``host``, `hetjax.emulation.KnownSpeedHost`): each round then runs to its
end and is padded by sleep to the host's time for this worker's work: its rows, or, for an app
with ``round_work(offset)`` (the real work units — ratings, tokens — of each device in a round
of that offset, padding excluded), the sum over this worker's devices, so an app that gives a
fast worker a larger block (MF's ``row_shares``, LDA's ``doc_shares``) is timed for it. The
overlap is lost.

Example::

  program = SchmpProgram(lasso, schedule_size=16, staleness=1)
  scheduler = lasso.policy(16, seed=0)                  # a DynamicScheduler
  for info in training_steps(program, program.init_state(), 200, policy=scheduler):
    pass                                # info.stats.loss: the objective; .local: a RoundInfo
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hetjax._checks import integer, positive_int
from hetjax._errors import ConfigError
from hetjax.core import Pace, StepStats, Work
from hetjax.schmp._app import App
from hetjax.schmp._schedule import RoundInfo, Schedule

PyTree = Any
AXIS = 'rows'


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SchmpState:
  """Rounds done (a device scalar, replicated), the app's parameters, and the last
  ``staleness`` rounds not yet reported to the scheduler (oldest first; each a dict of
  replicated device values ``round`` (-1 before the first rounds), ``blocks``, ``mask``,
  ``offset`` and ``delta``, the round's report: Δ per slot, or ``{'delta', 'priority'}``)."""

  step: jax.Array
  params: PyTree
  pending: tuple[dict[str, jax.Array], ...] = ()


class SchmpProgram:
  """Runs an `App`'s rounds over every device of the job (module docstring).

  Args:
    app: the model, its data and its round.
    schedule_size: slots per round (the most blocks a scheduler may pick).
    devices: the devices (default: all, of every process); each gets an equal share of rows.
    seed: the rounds' randomness (`jax.random.fold_in(key(seed), round)`).
    staleness: how many rounds old the information a scheduler decides from is (>= 0).
    objective_every: rounds between objective evaluations (``stats.loss`` is NaN between).
    last_round: a round whose objective is evaluated whatever ``objective_every`` says (the
      run's last, so that it ends with its objective), or None.
    host: the pace of this worker's emulated host (`hetjax.core.Pace`, module docstring), or
      None.

  Raises:
    ConfigError: a schedule size below 1, a negative staleness, data the app cannot split.
  """

  def __init__(self, app: App, schedule_size: int, devices: Sequence[jax.Device] | None = None,
               *, seed: int = 0, staleness: int = 1, objective_every: int = 1,
               last_round: int | None = None, host: Pace | None = None):
    schedule_size = positive_int(schedule_size, 'schedule size')
    staleness = integer(staleness, 'staleness', note=' (0: exact)')
    objective_every = positive_int(objective_every, 'objective_every')
    self.app, self.schedule_size, self.seed = app, schedule_size, seed
    self.staleness, self.objective_every, self.pace = staleness, objective_every, host
    self.last_round = last_round
    self.task = app  # what train.py reads for checkpoints: .name and .config
    devices = list(jax.devices() if devices is None else devices)
    self.mesh = Mesh(np.array(devices, dtype=object), (AXIS,), axis_types=(AxisType.Auto,))
    host_data = app.host_data(len(devices))
    rows = {len(v) for v in host_data.values()}
    if len(rows) != 1 or next(iter(rows)) % len(devices):
      raise ConfigError(f'app {app.name!r}: data of {sorted(rows)} rows cannot be split evenly '
                        f'over {len(devices)} devices')
    self.global_batch = next(iter(rows))
    self._local = np.array([d.process_index == jax.process_index() for d in devices])
    self._workers = len({d.process_index for d in devices})
    self.local_rows = self.global_batch // len(devices) * int(self._local.sum())
    row_sharding = NamedSharding(self.mesh, PartitionSpec(AXIS))
    self.data = {k: jax.make_array_from_callback(v.shape, row_sharding,
                                                 lambda index, v=v: v[index])
                 for k, v in host_data.items()}
    data_specs = {k: PartitionSpec(AXIS) for k in host_data}
    param_specs = app.param_specs(AXIS)
    self._param_sharding = jax.tree.map(lambda s: NamedSharding(self.mesh, s), param_specs,
                                        is_leaf=lambda x: isinstance(x, PartitionSpec))
    self._replicated = NamedSharding(self.mesh, PartitionSpec())
    self._init = jax.jit(jax.shard_map(lambda data: app.init_params(data, AXIS), mesh=self.mesh,
                                       in_specs=(data_specs,), out_specs=param_specs),
                         out_shardings=self._param_sharding)

    def round_(params, data, blocks, mask, offset, step):
      key = jax.random.fold_in(jax.random.key(seed), step)
      return app.round(params, data, blocks, mask, offset, key, AXIS)

    scalar = PartitionSpec()
    self._round = jax.jit(
        jax.shard_map(round_, mesh=self.mesh,
                      in_specs=(param_specs, data_specs, scalar, scalar, scalar, scalar),
                      out_specs=(param_specs, scalar)),
        out_shardings=(self._param_sharding, self._replicated), donate_argnums=0)
    self._objective = jax.jit(
        jax.shard_map(lambda p, d: app.objective(p, d, AXIS), mesh=self.mesh,
                      in_specs=(param_specs, data_specs), out_specs=scalar),
        out_shardings=self._replicated)
    self._last_return: float | None = None

  # -- state ------------------------------------------------------------------------------------

  def close(self) -> None:
    """Nothing to release: the program holds only compiled functions and arrays."""

  def evaluate(self, state: SchmpState, batch) -> dict[str, float] | None:
    """A SchMP app has no held-out split: its objective is its metric (``objective_every``)."""
    raise ConfigError(f'{self.app.name} reports its objective each round; it has no held-out '
                      'evaluation')

  def use_host(self, host: Pace | None) -> None:
    """Pads each round to ``host`` (`hetjax.core.Pace.pad`): this worker's units of work
    (`local_work`) take its time."""
    self.pace = host

  def init_state(self) -> SchmpState:
    step = jax.device_put(np.int32(0), self._replicated)
    params = self._init(self.data)
    empty = self._entry(-1, Schedule.of([], self.schedule_size),
                        jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), self._report_shape))
    return SchmpState(step, params, (empty,) * self.staleness)

  @functools.cached_property
  def _report_shape(self) -> PyTree:
    """The structure of what a round reports: Δ per slot, or ``{'delta', 'priority'}``."""
    params = jax.eval_shape(self._init, self.data)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    slots = jax.ShapeDtypeStruct((self.schedule_size,), jnp.int32)
    mask = jax.ShapeDtypeStruct((self.schedule_size,), jnp.bool_)
    return jax.eval_shape(self._round, params, self.data, slots, mask, scalar, scalar)[1]

  def abstract_state(self) -> SchmpState:
    shapes = jax.eval_shape(self._init, self.data)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          shapes, self._param_sharding)
    entry = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                         self.init_state().pending[0]) if self.staleness else None
    return SchmpState(jax.ShapeDtypeStruct((), jnp.int32, sharding=self._replicated), params,
                      (entry,) * self.staleness)

  def _entry(self, round_: int, schedule: Schedule, delta=None) -> dict[str, Any]:
    """A pending round's record, on the devices; its report ``delta`` (Δ per slot, or a dict
    with the priorities) is the round's own output, still computing, or given here."""
    entry = {'round': np.int32(round_), 'blocks': schedule.blocks, 'mask': schedule.mask,
             'offset': np.int32(schedule.offset)}
    if delta is not None:
      entry['delta'] = delta
    return jax.device_put(entry, self._replicated)  # one call for the whole record

  @staticmethod
  def _info(entry: dict[str, jax.Array]) -> RoundInfo | None:
    """The `RoundInfo` of a pending entry (fetched: waits for its round only), or None for an
    entry from before the first round."""
    values = jax.device_get(entry)
    if int(values['round']) < 0:
      return None
    schedule = Schedule(np.asarray(values['blocks']), np.asarray(values['mask']),
                        int(values['offset']))
    report = values['delta']
    if isinstance(report, dict):
      return RoundInfo(int(values['round']), schedule, np.asarray(report['delta']),
                       np.asarray(report['priority']))
    return RoundInfo(int(values['round']), schedule, np.asarray(report))

  def local_work(self, offset: int) -> int:
    """This worker's work units in a round of ``offset``: the app's ``round_work`` summed over
    this process's devices, else its rows (module docstring)."""
    work = getattr(self.app, 'round_work', None)
    if work is None:
      return self.local_rows
    return int(np.asarray(work(offset))[self._local].sum())

  def mean_work(self, offset: int) -> float:
    """The work units of a round of ``offset`` per worker, on average over the workers (what a
    host of known speed is calibrated by: every device runs the same padded program, so the
    time a round takes says what the average worker's work costs, not a small share's)."""
    work = getattr(self.app, 'round_work', None)
    total = self.global_batch if work is None else int(np.asarray(work(offset)).sum())
    return total / self._workers

  def global_batch_at(self, step: int) -> dict:
    """Nothing per step: every round reads all the data, already on the devices."""
    del step
    return {}

  def time_rounds(self, schedule: Schedule, repeats: int) -> list[float]:
    """Seconds of ``repeats`` rounds on ``schedule``, each run to its end, on a fresh state
    after one untimed (compiling) round; the run's own state and records are untouched."""
    state, times = self.init_state(), []
    rep = self._replicated
    args = [jax.device_put(a, rep) for a in (schedule.blocks, schedule.mask,
                                            np.int32(schedule.offset), np.int32(0))]
    for r in range(repeats + 1):
      start = time.perf_counter()
      params, delta = self._round(state.params, self.data, *args)
      jax.block_until_ready((params, delta))
      state = dataclasses.replace(state, params=params)
      if r:
        times.append(time.perf_counter() - start)
    return times

  def objective(self, state: SchmpState) -> jax.Array:
    """The app's objective at ``state`` (a device scalar, replicated)."""
    return self._objective(state.params, self.data)

  # -- a round ----------------------------------------------------------------------------------

  def step(self, state: SchmpState, work: Work, decision: Schedule
           ) -> tuple[SchmpState, StepStats]:
    """Round ``work.step`` on the blocks ``decision`` names (``state`` is donated)."""
    if not isinstance(decision, Schedule):
      raise ConfigError(f'a SchMP round needs a Schedule, got {type(decision).__name__}')
    if decision.size != self.schedule_size:
      raise ConfigError(f'schedule of {decision.size} slots for a program of '
                        f'{self.schedule_size}')
    start = time.perf_counter()
    entry = self._entry(work.step, decision)
    params, delta = self._round(state.params, self.data, entry['blocks'], entry['mask'],
                                entry['offset'], entry['round'])
    entry['delta'] = delta
    if self.pace is not None:  # the round runs to its end, then sleeps to its host's time
      jax.block_until_ready(delta)
      self.pace.pad(work.step, self.local_work(decision.offset), time.perf_counter() - start)
    pending = (*state.pending, entry)
    info, pending = self._info(pending[0]), pending[1:]
    evaluate = (work.step + 1) % self.objective_every == 0 or work.step == self.last_round
    loss = self._objective(params, self.data) if evaluate else math.nan
    end = time.perf_counter()
    iter_s = end - (start if self._last_return is None else self._last_return)
    self._last_return = end
    workers = self._workers
    rows = (self.global_batch // workers,) * workers
    return (SchmpState(state.step + 1, params, pending),
            StepStats(work.step, rows, (iter_s,) * workers, iter_s=iter_s,
                      sampled=(False,) * workers, loss=loss, local=info))
