r"""Elastic fault tolerance: workers killed, stopped and lost, and a corrupt latest checkpoint,
against the same run uninterrupted.

Every scenario launches ``experiments/train.py`` as 4 workers on hosts of known speed (one
device each, ``--slowdown static:1,1,1,1``), exact data-parallel training (shares mode, uniform
BSP shares) of the digits mlp with momentum SGD, checkpoints every `CHECKPOINT_EVERY` steps
(each complete before the next step: ``checkpoint_async=False``, except in ``async-kills``,
whose saves are written in the background while the next step runs) and metrics at every step,
under `hetjax.runtime.launch_elastic` (what ``python -m hetjax.launch --max-restarts`` runs).
Faults come from outside, as an operator or the OOM killer would send them: SIGKILL of a
random worker at random steps (several in one run), SIGSTOP of a worker, a latest checkpoint
with one flipped bit that changes what it reads back (then a kill, so the restart has to read
it; ``corrupt_checkpoint_skipped`` says whether the restart resumed from an older one), and a
worker killed twice in a row (left out: the run finishes on 3 workers with ``--min-workers
3``).

Rows (one per fault): ``scenario``, ``fault``, ``worker``, ``at_step``, ``detect_s`` (the fault
to the launcher seeing it), ``recover_s`` (the fault to the next completed step), ``named``
(the launcher blamed the worker hit), ``steps_lost`` (steps logged past the checkpoint resumed
from), ``checkpoint_every``, ``checkpoint_async``, ``orphans`` (processes of the job alive after the launcher
returned), ``final_params_equal_uninterrupted`` (bit for bit; None where the workers changed),
``final_params_close_uninterrupted`` (within the strategies' tolerance, rtol 1e-4 and atol
1e-6: for a run that changed workers, whose sums run in another order),
``loss_max_abs_diff`` (over every logged step), ``workers_after``, ``restarts``. All times are
measured wall time.

Goals: detection ≤ 15 s for a kill and ≤ the stall timeout + 5 s for a stop; recovery ≤ 30 s;
steps lost ≤ the checkpoint interval; zero orphans; final parameters equal the uninterrupted
run's; a run that lost a worker finishes on the others with the same global batch's losses.

  .venv/bin/python -m experiments.bench_faults --quick --json runs/bench_faults.json
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import signal
import sys
import threading
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

from absl import flags

from experiments import _faults, _harness
from hetjax import ConfigError, runtime

FLAGS = _harness.define_flags('2 kills instead of 3 and 60 steps instead of 120: under 5 '
                              'minutes')
_SEED = flags.DEFINE_integer('seed', 0, 'picks the workers and steps the faults hit')
_TIMEOUT = flags.DEFINE_float('timeout', 600, 'seconds before a launched job is stopped')
SCENARIOS = ('kills', 'stop', 'corrupt', 'lost-worker', 'async-kills')
_SCENARIOS = flags.DEFINE_list('scenarios', list(SCENARIOS),
                               f'the scenarios to run (after the uninterrupted one), of {SCENARIOS}')
TRAIN = pathlib.Path(__file__).with_name('train.py')
WORKERS = 4
CHECKPOINT_EVERY = 10
STALL_TIMEOUT = 10.0
ASYNC = 'async-kills'  # the scenario whose checkpoints are written in the background


@dataclasses.dataclass(frozen=True)
class Fault:
  """``kind``: kill, stop, corrupt (flip a bit of the latest checkpoint, then kill), or again
  (kill the same worker as soon as the restarted job has it)."""

  kind: str
  worker: int
  at_step: int = 0


def _command(workdir: pathlib.Path, steps: int, asynchronous: bool) -> list[str]:
  return [sys.executable, str(TRAIN), '--config=mlp', '--mesh=1x1', f'--steps={steps}',
          '--policy=uniform', '--set', f'checkpoint_every={CHECKPOINT_EVERY}',
          '--set', f'checkpoint_async={asynchronous}', '--set', 'optimizer=momentum',
          '--set', 'learning_rate=0.05', '--set', 'log_every=1', f'--workdir={workdir}']


def _inject(watch: _faults.RunWatch, faults: list[Fault], results: list, out: dict) -> None:
  """Runs in a thread: each fault once its launch is running (and at its step), then waits for
  the job to complete a step past the checkpoint it resumed from."""
  me = os.getpid()
  try:
    for i, fault in enumerate(faults):
      launched = lambda i=i: len(results) == i and (  # noqa: E731
          i == 0 or any(r['restart'] == i for r in watch.restarts()))
      if fault.kind == 'again':
        watch.wait(lambda i=i: len(results) == i, 120, f'launch {i}')
      else:
        watch.wait(lambda f=fault, ok=launched: ok() and watch.last_step() >= f.at_step, 300,
                   f'step {fault.at_step}')
      if fault.kind == 'corrupt':
        out.setdefault('corrupted', []).append(_faults.corrupt_latest(watch.workdir / 'checkpoints'))
      sig = signal.SIGSTOP if fault.kind == 'stop' else signal.SIGKILL
      out.setdefault('at', []).append(_faults.signal_worker(me, fault.worker, sig))
      if i + 1 < len(faults) and faults[i + 1].kind == 'again':
        out.setdefault('recovered', []).append(None)
        continue
      def resumed(i=i):
        rows = [r for r in watch.restarts() if r['restart'] == i + 1]
        return bool(rows) and watch.last_step() > rows[0]['resumed_from']
      out.setdefault('recovered', []).append(watch.wait(resumed, 300, f'recovery {i + 1}'))
  except Exception as e:  # reported by the main thread
    out['error'] = f'{type(e).__name__}: {e}'


def _scenario(root: pathlib.Path, name: str, steps: int, faults: list[Fault],
              min_workers: int | None = None, asynchronous: bool = False) -> dict:
  workdir = root / name
  watch, results, out = _faults.RunWatch(workdir), [], {}
  thread = threading.Thread(target=_inject, args=(watch, faults, results, out), daemon=True)
  thread.start()
  with open(root / f'{name}.log', 'w') as log:
    result = runtime.launch_elastic(
        _command(workdir, steps, asynchronous), WORKERS, max_restarts=len(faults) + 1, min_workers=min_workers,
        stall_timeout=STALL_TIMEOUT, timeout=_TIMEOUT.value, slowdown='static:1,1,1,1',
        init_timeout=120, stdout=log, log=lambda line: print(f'  {name}: {line}', flush=True),
        on_result=lambda _, r: results.append(r))
  thread.join(timeout=5)
  if result.returncode != 0 or 'error' in out:
    raise RuntimeError(f'{name}: {out.get("error") or result.cause} (see {root / name}.log)')
  return {'workdir': workdir, 'faults': faults, 'results': results, 'out': out,
          'orphans': _faults.orphans(os.getpid()), 'watch': watch, 'steps': steps,
          'asynchronous': asynchronous}


def _rows(run: dict, baseline: dict) -> list[dict]:
  watch, out, steps = run['watch'], run['out'], run['steps']
  final = _faults.final_state(run['workdir'] / 'checkpoints', steps)
  reference = _faults.final_state(baseline['workdir'] / 'checkpoints', steps)
  workers_after = watch.restarts()[-1]['workers'] if watch.restarts() else WORKERS
  same_workers = workers_after == WORKERS
  losses, ref_losses = watch.losses(), baseline['watch'].losses()
  rows = []
  for i, fault in enumerate(run['faults']):
    at, launch = out['at'][i], run['results'][i]
    restart = next((r for r in watch.restarts() if r['restart'] == i + 1), None)
    recovered = out['recovered'][i]
    rows.append({
        'scenario': run['workdir'].name, 'fault': fault.kind, 'worker': fault.worker,
        'at_step': fault.at_step if fault.kind != 'again' else None,
        'detect_goal_s': STALL_TIMEOUT + 5 if fault.kind == 'stop' else 15.0,
        'detect_s': round(launch.detected_at - at, 2) if launch.detected_at else None,
        'recover_s': None if recovered is None else round(recovered - at, 2),
        'named': launch.failed_worker == fault.worker or
                 f'worker {fault.worker} ' in launch.cause,
        'cause': launch.cause,
        'steps_lost': None if restart is None or recovered is None else restart['steps_lost'],
        'resumed_from': None if restart is None else restart['resumed_from'],
        'checkpoint_every': CHECKPOINT_EVERY, 'checkpoint_async': run['asynchronous'],
        'orphans': run['orphans'],
        'final_params_equal_uninterrupted':
            _faults.states_equal(final, reference) if same_workers else None,
        'final_params_close_uninterrupted': _faults.states_close(final, reference),
        'loss_max_abs_diff': max(abs(losses[s] - ref_losses[s]) for s in ref_losses),
        'workers_after': workers_after, 'restarts': len(run['results']) - 1,
        'logged_steps_complete': sorted(losses) == list(range(1, steps + 1)),
        'corrupted_step': (out.get('corrupted') or [None])[0] if fault.kind == 'corrupt' else None,
        'corrupt_checkpoint_skipped': None if fault.kind != 'corrupt' or restart is None else
                                      restart['resumed_from'] < out['corrupted'][0],
    })
  return rows


def main() -> None:
  quick, start = FLAGS.quick.value, time.perf_counter()
  steps = 60 if quick else 120
  rng = random.Random(_SEED.value)
  kills = sorted(rng.sample(range(15, steps - 10), 2 if quick else 3))
  scenarios = {
      'kills': [Fault('kill', rng.randrange(WORKERS), s) for s in kills],
      'stop': [Fault('stop', rng.randrange(1, WORKERS), rng.randrange(15, steps - 15))],
      'corrupt': [Fault('corrupt', rng.randrange(WORKERS), rng.randrange(25, steps - 10))],
      'lost-worker': [Fault('kill', WORKERS - 1, rng.randrange(15, steps - 15)),
                      Fault('again', WORKERS - 1)],
      # Background saves, each killed a step after a checkpoint: while that save may still
      # be written (the next step's hook waits for it to commit).
      ASYNC: [Fault('kill', rng.randrange(WORKERS), CHECKPOINT_EVERY * k + 1)
              for k in ((2, 4) if quick else (2, 5, 8))],
  }
  unknown = sorted(set(_SCENARIOS.value) - set(scenarios))
  if unknown or not _SCENARIOS.value:
    raise ConfigError(f'--scenarios: unknown {unknown}; choose from {list(scenarios)}')
  scenarios = {name: faults for name, faults in scenarios.items() if name in _SCENARIOS.value}
  rows = []
  with _harness.run_directory(FLAGS.keep.value) as root:
    print(f'uninterrupted: {steps} steps on {WORKERS} workers', flush=True)
    baseline = _scenario(root, 'uninterrupted', steps, [])
    for name, faults in scenarios.items():
      print(f'{name}: ' + ', '.join(f'{f.kind} worker {f.worker}' +
                                    (f' at step {f.at_step}' if f.kind != 'again' else '')
                                    for f in faults), flush=True)
      run = _scenario(root, name, steps, faults,
                      min_workers=WORKERS - 1 if name == 'lost-worker' else None,
                      asynchronous=name == ASYNC)
      rows += _rows(run, baseline)
  columns = ('scenario', 'fault', 'worker', 'at_step', 'detect_s', 'recover_s', 'named',
             'steps_lost', 'orphans', 'final_params_equal_uninterrupted',
             'final_params_close_uninterrupted', 'loss_max_abs_diff', 'workers_after')
  print(' | '.join(columns))
  for row in rows:
    print(' | '.join(str(row[c]) for c in columns))
  print(f'baseline orphans {baseline["orphans"]}; total {time.perf_counter() - start:.0f} s')
  _harness.finish(rows, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_faults.py', main)
