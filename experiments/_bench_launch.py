"""Launching a benchmark's local worker job and reading what its chief wrote."""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Sequence

from hetjax import runtime


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
