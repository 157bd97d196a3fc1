"""Launching a benchmark's local worker job, and what its workers share: policies that see the
trace from their own step count, and the interleaved blocks they train in (each on its emulated
host: `hetjax.run.emulated_host` builds it, the program takes it: `StepProgram.use_host`).

The launcher side (`launch_workers`) runs in the benchmark's process; everything else runs in a
worker of the job (after `hetjax.runtime.initialize`). The analysis of what the chief wrote is
`experiments/_harness.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hetjax import emulation, runtime
from hetjax.core import Policy, StepStats


def launch_workers(out: pathlib.Path, script: str, args: Sequence[object], workers: int,
                   timeout: float, slowdown: str | None = None,
                   cache: pathlib.Path | None = None, devices_per_worker: int = 1,
                   pin_cores: bool = False) -> dict:
  """Runs ``python -m experiments.SCRIPT OUT ARGS…`` (``SCRIPT`` a module of this folder, from
  the checkout: the workers inherit this process's directory) on ``workers`` local workers and
  returns the chief's
  ``OUT/run.json``; each worker has ``devices_per_worker`` CPU devices and, with ``pin_cores``,
  one core, dealt round robin (`hetjax.runtime._affinity`): for jobs whose shapes stay fixed
  (tokens). A job that compiles new share sizes in the background must not pin: the compile
  thread would share the worker's one core (under Markov, pinned, 88 of 420 worker-steps ran
  past their host's time, against at most 23 of 840 unpinned).

  The workers' output goes to ``OUT/workers.log``; ``cache`` (if given) is their persistent
  compilation cache (``HETJAX_COMPILATION_CACHE``), shared between the jobs of one bench run.

  Raises:
    RuntimeError: the job failed or timed out (the message names the cause and the log).
  """
  out.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, **({'HETJAX_COMPILATION_CACHE': str(cache)} if cache else {}))
  command = [sys.executable, '-m', f'{__package__}.{script}', str(out), *map(str, args)]
  with open(out / 'workers.log', 'w') as log:
    result = runtime.launch_local(command,
                                  workers, slowdown=slowdown, timeout=timeout, init_timeout=120,
                                  stdout=log, env=env, devices_per_worker=devices_per_worker,
                                  pin_cores=pin_cores)
  if result.returncode:
    where = f'{slowdown}: ' if slowdown else ''
    raise RuntimeError(f'{where}{result.cause} (see {out / "workers.log"})')
  return json.loads((out / 'run.json').read_text())


@dataclasses.dataclass(frozen=True)
class Shifted:
  """A trace seen from a policy's own step count: global step s ↦ policy step s + shift."""

  trace: emulation.SlowdownTrace
  shift: int

  @property
  def workers(self) -> int:
    return self.trace.workers

  def factors(self, step: int) -> np.ndarray:
    return self.trace.factors(step + self.shift)

  def factor(self, worker: int, step: int) -> float:
    return self.trace.factor(worker, step + self.shift)

  def delays(self, step: int) -> np.ndarray:
    return self.trace.delays(step + self.shift)

  def delay(self, worker: int, step: int) -> float:
    return self.trace.delay(worker, step + self.shift)

  def describe(self) -> str:
    return self.trace.describe()


@dataclasses.dataclass(frozen=True)
class Local:
  """``policy`` learning each step as its own step count: global step s is policy step
  s + shift (the oracle plans from the step's index; the others ignore it)."""

  policy: Policy
  shift: int

  @property
  def name(self) -> str:
    return self.policy.name

  def init(self) -> Any:
    return self.policy.init()

  def update(self, state: Any, stats: StepStats | None) -> tuple[Any, Any]:
    if stats is not None:
      stats = dataclasses.replace(stats, step=stats.step + self.shift)
    return self.policy.update(state, stats)


def interleaved_blocks(state, names: Sequence[str], rounds: int, block: int, *,
                       program: Callable[[str], Any], policy: Callable[[str], Policy],
                       host: Callable[[str, int], Any], hooks: Sequence = (),
                       on_step: Callable[[str, Any], None] | None = None,
                       after_block: Callable[[str], None] | None = None,
                       key: str = 'policy') -> tuple[Any, list[dict]]:
  """Trains ``state`` in blocks of ``block`` steps, every name once per round, ``rounds`` rounds.

  Name p's k-th step (counting its own steps only) runs on ``host(p, shift)`` and teaches its
  policy as step k (`Local`), where shift = k − the global step: so every name meets the same
  slowdown sequence (`Shifted`) although their blocks alternate in time, and each name's policy
  state carries over from one of its blocks to the next. Every step runs through
  `hetjax.train.training_steps` with ``hooks``.

  Returns:
    (the state after the last block, the schedule: one ``{key: name, 'first_step',
    'last_step', 'policy_step'}`` per block, global steps inclusive), as ``schedule.json``.
  """
  from hetjax.train import training_steps

  policy_states = dict.fromkeys(names)
  schedule, step = [], int(state.step)
  for r in range(rounds):
    for name in names:
      start, local = step, r * block
      shift = local - start
      trainer = program(name)
      trainer.use_host(host(name, shift))
      for info in training_steps(trainer, state, start + block, hooks,
                                 Local(policy(name), shift), policy_states[name]):
        state, policy_states[name], step = info.state, info.policy_state, info.step
        if on_step is not None:
          on_step(name, info)
      if after_block is not None:
        after_block(name)
      schedule.append({key: name, 'first_step': start + 1, 'last_step': step,
                       'policy_step': local})
  return state, schedule
