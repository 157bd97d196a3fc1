"""Launching a benchmark's local worker job, its workers' emulated hosts, and reading what its
chief wrote."""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Sequence

from hetjax import emulation, runtime


def launch_workers(out: pathlib.Path, script: str, args: Sequence[object], workers: int,
                   timeout: float, slowdown: str | None = None,
                   cache: pathlib.Path | None = None, devices_per_worker: int = 1) -> dict:
  """Runs ``experiments/SCRIPT OUT ARGS…`` on ``workers`` local workers and returns the chief's
  ``OUT/run.json``; each worker has ``devices_per_worker`` CPU devices.

  The workers' output goes to ``OUT/workers.log``; ``cache`` (if given) is their persistent
  compilation cache (``HETJAX_COMPILATION_CACHE``), shared between the jobs of one bench run.

  Raises:
    RuntimeError: the job failed or timed out (the message names the cause and the log).
  """
  out.mkdir(parents=True, exist_ok=True)
  worker = pathlib.Path(__file__).with_name(script)
  env = dict(os.environ, **({'HETJAX_COMPILATION_CACHE': str(cache)} if cache else {}))
  with open(out / 'workers.log', 'w') as log:
    result = runtime.launch_local([sys.executable, str(worker), str(out), *map(str, args)],
                                  workers, slowdown=slowdown, timeout=timeout, init_timeout=120,
                                  stdout=log, env=env, devices_per_worker=devices_per_worker)
  if result.returncode:
    where = f'{slowdown}: ' if slowdown else ''
    raise RuntimeError(f'{where}{result.cause} (see {out / "workers.log"})')
  return json.loads((out / 'run.json').read_text())


def known_speed_host(ctx: runtime.WorkerContext, trainer, trace: emulation.SlowdownTrace,
                     channel: runtime.Channel) -> emulation.KnownSpeedHost:
  """This worker as a host of known speed slowed by ``trace``, attached to ``trainer`` (in a
  worker of the job, once per job), calibrated as ``experiments/train.py`` does it
  (`experiments._programs.emulated_host`). A benchmark that changes the trace between blocks
  assigns ``trainer.host = dataclasses.replace(host, trace=…)``.
  """
  from experiments import _programs, configs  # the model zoo and the planner: worker side only

  config = configs.Config(model=trainer.task.name, global_batch=trainer.global_batch)
  return _programs.emulated_host(config, ctx, trainer, trace, channel)


def host_line(run_dir: pathlib.Path, run: dict) -> str:
  """One line on a job's emulated hosts: their calibrated cost, and how often and by how much
  the real compute ran past a host's time (an overrun: that step was slower than emulated)."""
  overruns = []
  with (run_dir / 'telemetry.jsonl').open() as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        overruns.append((row['worker'], row.get('overrun_s', 0.0)))
  late = [(w, s) for w, s in overruns if s > 0]
  per_worker = [sum(1 for w, _ in late if w == i) for i in range(run['workers'])]
  worst = f', max {1e3 * max(s for _, s in late):.1f} ms' if late else ''
  return (f'hosts {1e3 * run["host_row_s"]:.4f} ms/row + {1e3 * run["host_fixed_s"]:.2f} ms/step; '
          f'overruns: {len(late)} of {len(overruns)} worker-steps{worst} (per worker '
          f'{" ".join(map(str, per_worker))})')
