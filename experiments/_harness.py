"""What every benchmark does the same way: flags, run directories, JSON, reading a job's
telemetry by block, calibrating the virtual clock, and interleaving in-process rounds.

A benchmark is a thin entry point: it defines its own flags beside the common ones
(`define_flags`), launches jobs (`experiments._bench_launch.launch_workers`) or times blocks in
process (`interleave`), reads each job back as a `JobRun` (telemetry rows by policy or scenario
block), turns them into rows with the pure functions of `experiments._analysis`, prints a table
whose rows say ``measured`` or ``virtual`` (modelled), and ends with `finish`.

Example::

  FLAGS = _harness.define_flags('3 rounds instead of 6')
  def main():
    with _harness.run_directory(FLAGS.keep.value) as root:
      job = _harness.JobRun.load(root / 'static')
      idx = job.rows('uniform', skip=1)
      print(job.iteration_s(idx).mean())
  _harness.run_main('bench_x.py', main)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from absl import flags

from experiments import _analysis
from hetjax import ConfigError, cli, simulation
from hetjax.report import Telemetry, load_telemetry


@dataclasses.dataclass(frozen=True)
class CommonFlags:
  """The flags every benchmark has: ``--quick``, ``--json`` and (for launched jobs) ``--keep``."""

  quick: flags.FlagHolder
  json: flags.FlagHolder
  keep: flags.FlagHolder | None


def define_flags(quick_help: str, keep: bool = True) -> CommonFlags:
  """Defines ``--quick`` (with this benchmark's meaning), ``--json`` and, if ``keep``,
  ``--keep`` (keep run directories there instead of a temporary directory)."""
  return CommonFlags(
      flags.DEFINE_bool('quick', False, quick_help),
      flags.DEFINE_string('json', None, 'write the rows as JSON here'),
      flags.DEFINE_string('keep', None, 'keep run directories under this directory')
      if keep else None)


def run_main(script: str, main: Callable[[], None], cpu_devices: int | None = None) -> None:
  """Runs ``main`` as an absl program (`hetjax.cli.run_main`: a bad flag or `ConfigError`
  is one line and exit 2); a failed job (`RuntimeError`) is one line and exit 1."""
  def guarded() -> None:
    try:
      main()
    except RuntimeError as e:
      print(f'{script}: error: {e}', file=sys.stderr)
      sys.exit(1)

  cli.run_main(script, guarded, cpu_devices)


@contextlib.contextmanager
def run_directory(keep: str | None) -> Iterator[pathlib.Path]:
  """``keep`` (created) if given, else a temporary directory removed afterwards."""
  if keep:
    path = pathlib.Path(keep)
    path.mkdir(parents=True, exist_ok=True)
    yield path
  else:
    with tempfile.TemporaryDirectory() as tmp:
      yield pathlib.Path(tmp)


@contextlib.contextmanager
def compilation_cache() -> Iterator[pathlib.Path]:
  """A persistent compilation cache, empty at the start, shared by the jobs of one bench run
  (as a relaunched job would share it), removed afterwards."""
  with tempfile.TemporaryDirectory() as tmp:
    yield pathlib.Path(tmp)


def finish(rows: list[dict], json_path: str | None) -> None:
  """Writes ``rows`` to ``json_path`` (if given) as an indented JSON list."""
  if json_path:
    try:
      pathlib.Path(json_path).write_text(json.dumps(rows, indent=2) + '\n')
    except OSError as e:
      raise ConfigError(f'cannot write --json {json_path}: {e}') from None


def interleave(blocks: Mapping[str, Callable[[], Any]], rounds: int,
               rotate: bool = True) -> dict[str, list[Any]]:
  """Runs every block once per round, ``rounds`` rounds, the order rotating by one each round
  (`_analysis.round_order`) so that machine drift hits all alike; returns each block's results
  in round order."""
  names = list(blocks)
  results: dict[str, list[Any]] = {name: [] for name in names}
  for r in range(rounds):
    for name in _analysis.round_order(names, r, rotate):
      results[name].append(blocks[name]())
  return results


@dataclasses.dataclass(frozen=True)
class JobRun:
  """What one launched job's chief wrote: ``telemetry.jsonl`` (as `hetjax.report.Telemetry`),
  ``schedule.json`` (its interleaved blocks) and ``run.json`` (``info``), indexed by block."""

  directory: pathlib.Path
  telemetry: Telemetry
  schedule: list[dict]
  info: dict

  @classmethod
  def load(cls, directory: pathlib.Path) -> JobRun:
    schedule_path = directory / 'schedule.json'
    if not schedule_path.is_file():
      raise ConfigError(f'no schedule.json in {directory}')
    return cls(directory, load_telemetry(directory), json.loads(schedule_path.read_text()),
               json.loads((directory / 'run.json').read_text()))

  def names(self, key: str = 'policy') -> list[str]:
    """The blocks' names (policies or scenarios), in order of first appearance."""
    return list(dict.fromkeys(b[key] for b in self.schedule))

  def rows(self, name: str, key: str = 'policy', skip: int = 0, after_step: int = 0) -> np.ndarray:
    """Telemetry row indices of ``name``'s steps (`_analysis.block_rows`)."""
    return _analysis.block_rows(self.schedule, self.telemetry.steps, name, key, skip, after_step)

  def busy_s(self, idx: np.ndarray) -> np.ndarray:
    """[step, worker] seconds of the host: the real compute and the padding to its time."""
    return self.telemetry.compute_s[idx] + self.telemetry.dilation_s[idx]

  @property
  def transfer_s(self) -> np.ndarray:
    """Each worker's declared own transfer a step (``run.json``'s ``transfer_s``, the server
    exchange's push and pull); zeros when the job had none."""
    return np.asarray(self.info.get('transfer_s') or np.zeros(len(self.telemetry.workers)))

  def sync_s(self, idx: np.ndarray) -> np.ndarray:
    """Per step, the measured time outside the slowest host's busy time (plus its declared
    transfer): batch preparation, all-reduce, update and dispatch (what no share policy can
    balance away)."""
    return self.iteration_s(idx) - (self.busy_s(idx) + self.transfer_s).max(axis=1)

  def iteration_s(self, idx: np.ndarray, without_compile: bool = False) -> np.ndarray:
    """Per step, the slowest worker's step time (less the time it waited for a compile)."""
    t = self.telemetry
    return (t.step_s[idx] - (t.compile_s[idx] if without_compile else 0.0)).max(axis=1)

  def idle_fraction(self, idx: np.ndarray) -> np.ndarray:
    """[step, worker] share of a step spent waiting at the barrier."""
    return self.telemetry.wait_s[idx] / self.telemetry.step_s[idx]

  def limit_s(self, idx: np.ndarray) -> np.ndarray:
    """Per step, the measured balanced limit given fixed costs: the hosts' calibrated
    ``fixed_s + rows × row_s`` at each worker's measured slowdown (`_analysis.
    effective_slowdown`: the trace's factor where the host held), balanced exactly
    (`_analysis.balanced_time_s`, each worker's declared transfer included), plus the step's
    measured time outside compute and transfer (`sync_s`)."""
    row_s, fixed_s = self.info['host_row_s'], self.info['host_fixed_s']
    share = self.telemetry.share[idx]
    slow = _analysis.effective_slowdown(self.busy_s(idx), share, row_s, fixed_s)
    x = share.sum(axis=1)
    transfer = tuple(self.transfer_s.tolist()) if self.transfer_s.any() else ()
    return np.array([_analysis.balanced_time_s(int(x[i]), slow[i], row_s, fixed_s, transfer)
                     for i in range(len(idx))]) + self.sync_s(idx)

  def host_line(self) -> str:
    """One line on the job's emulated hosts: their calibrated cost, and how often and by how
    much the real compute ran past a host's time (an overrun: that step was slower than
    emulated)."""
    overrun = self.telemetry.overrun_s
    late = overrun > 0
    worst = f', max {1e3 * overrun.max():.1f} ms' if late.any() else ''
    return (f'hosts {1e3 * self.info["host_row_s"]:.4f} ms/row + '
            f'{1e3 * self.info["host_fixed_s"]:.2f} ms/step; overruns: {int(late.sum())} of '
            f'{late.size} worker-steps{worst} (per worker '
            f'{" ".join(str(int(n)) for n in late.sum(axis=0))}{self._late_by_policy(late)})')

  def _late_by_policy(self, late: np.ndarray) -> str:
    if not all('policy' in b for b in self.schedule):
      return ''
    return '; per policy ' + ', '.join(f'{name} {int(late[self.rows(name)].sum())}'
                                        for name in self.names())


def network(info: Mapping) -> dict:
  """The all-reduce terms of `hetjax.simulation.ClockCosts` from a job's ``run.json``."""
  fit = info['allreduce']
  return {'alpha_s': fit['alpha_s'], 'beta_bytes_per_s': fit['beta_bytes_per_s'],
          'grad_bytes': info['grad_bytes']}


def host_time_s(job: JobRun, idx: np.ndarray, per_sample_s: float | Sequence[float]) -> float:
  """The per-step work no slowdown stretches (batch slicing, dispatch, update): the mean of
  iteration − slowest busy time over ``idx``, less the modelled all-reduce, at least 0."""
  allreduce = simulation.ClockCosts(per_sample_s, **network(job.info)).allreduce_s(
      job.telemetry.share.shape[1])
  return max(float(job.sync_s(idx).mean()) - allreduce, 0.0)


def host_costs(job: JobRun, idx: np.ndarray) -> simulation.ClockCosts:
  """The virtual clock of a job of hosts of known speed: their calibrated ``row_s`` and
  ``fixed_s`` (circular: the clock agrees with the hosts by construction, so agreement checks
  the policies, collectives and step model, not the calibration), the fitted all-reduce, and
  the host time measured on ``idx``."""
  row_s = job.info['host_row_s']
  return simulation.ClockCosts(row_s, fixed_s=job.info['host_fixed_s'],
                               host_s=host_time_s(job, idx, row_s), **network(job.info))


#: The fields of a share policy's row (`share_policy_rows`; ``bench_lbbsp.py --json`` keeps them).
SHARE_ROW_FIELDS = ('scenario', 'policy', 'workers', 'source', 'iter_s', 'limit_s',
                    'idle_fraction', 'compile_overhead_share', 'settle_iterations',
                    'reversals_after_settle', 'speedup_vs_uniform', 'ratio_to_limit',
                    'fraction_of_ideal_speedup')


def share_policy_rows(job: JobRun, scenario: str, after: int = 0) -> list[dict]:
  """One measured row per share policy of a job (`SHARE_ROW_FIELDS`): median iteration time
  without compile waits (a scheduler spike on the shared 2-core machine must not decide a
  comparison), median limit (`JobRun.limit_s`), mean idle fraction, the share of time waiting
  for compiles, settling from policy step ``after`` and reversals (`_analysis.settle`, on the
  shares the worker recorded in ``run.json``), and the speedups; the uniform policy must be
  one of them."""
  t, rows = job.telemetry, []
  for name in job.names():
    idx = job.rows(name)
    compile_share = t.compile_s[idx].max(axis=1).sum() / t.step_s[idx].max(axis=1).sum()
    settle, reversals = _analysis.settle(np.asarray(job.info['shares'][name]),
                                         job.info['bucket'], after)
    rows.append({'scenario': scenario, 'policy': name, 'workers': len(t.workers),
                 'source': 'measured',
                 'iter_s': float(np.median(job.iteration_s(idx, without_compile=True))),
                 'limit_s': float(np.median(job.limit_s(idx))),
                 'idle_fraction': float(job.idle_fraction(idx).mean()),
                 'compile_overhead_share': float(compile_share),
                 'settle_iterations': settle, 'reversals_after_settle': reversals})
  return _analysis.with_speedups(rows, ideal=True)
