"""Injecting faults into a launched job from outside, and watching it recover (bench_faults.py,
tests): the workers are found by their environment, signalled like an operator or the OOM
killer would, checkpoints are corrupted on disk, and progress is read from the run directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from hetjax import checkpoint
from hetjax.bench import ENV_LAUNCHER_PID, ENV_WORKER_ID, proc_stat


def _environ(pid: int) -> dict[str, str]:
  try:
    raw = pathlib.Path(f'/proc/{pid}/environ').read_bytes()
  except OSError:
    return {}
  pairs = (item.split(b'=', 1) for item in raw.split(b'\0') if b'=' in item)
  return {k.decode(errors='replace'): v.decode(errors='replace') for k, v in pairs}


def job_processes(launcher_pid: int) -> dict[int, int]:
  """``{worker index: pid}`` of the live processes a launcher (``launcher_pid``) started: its
  children (Linux: read from ``/proc``), not the processes they started."""
  found = {}
  for entry in pathlib.Path('/proc').iterdir():
    if entry.name.isdigit() and proc_stat(int(entry.name))[1:2] == [str(launcher_pid).encode()]:
      env = _environ(int(entry.name))
      if env.get(ENV_LAUNCHER_PID) == str(launcher_pid):
        found[int(env.get(ENV_WORKER_ID, -1))] = int(entry.name)
  return found


def orphans(launcher_pid: int) -> int:
  """How many processes started under ``launcher_pid`` are still alive (after it returned)."""
  count = 0
  for entry in pathlib.Path('/proc').iterdir():
    if entry.name.isdigit() and int(entry.name) != os.getpid() and \
        _environ(int(entry.name)).get(ENV_LAUNCHER_PID) == str(launcher_pid):
      count += 1
  return count


def signal_worker(launcher_pid: int, worker: int, sig: int, timeout_s: float = 60.0) -> float:
  """Sends ``sig`` to worker ``worker`` of the current launch once it exists; returns when
  (`time.time`)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    pid = job_processes(launcher_pid).get(worker)
    if pid is not None:
      os.kill(pid, sig)
      return time.time()
    time.sleep(0.05)
  raise RuntimeError(f'worker {worker} did not start within {timeout_s:g} s')


def corrupt_latest(checkpoints: pathlib.Path, tries: int = 256) -> int:
  """Flips one bit of the largest data file of the latest complete checkpoint, at the first
  place from its middle where the state then reads back different (or not at all): orbax
  compresses the data, and a flip in some bytes changes no value. Returns that step.

  Raises:
    RuntimeError: no such place among ``tries`` bytes.
  """
  step = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
  files = [p for p in (checkpoints / str(step) / 'state').rglob('*') if p.is_file()]
  target = max(files, key=lambda p: p.stat().st_size)
  original, before = target.read_bytes(), final_state(checkpoints, step)
  for at in range(len(original) // 2, min(len(original), len(original) // 2 + tries)):
    data = bytearray(original)
    data[at] ^= 0x10
    target.write_bytes(bytes(data))
    try:
      if not states_equal(final_state(checkpoints, step), before):
        return step
    except Exception:  # does not decode: corrupt too
      return step
  target.write_bytes(original)
  raise RuntimeError(f'no single-bit flip near the middle of {target} changes the state')


def final_state(checkpoints: pathlib.Path, step: int) -> dict:
  """The state saved at ``step`` as numpy arrays, read in this process."""
  path = checkpoints / str(step) / 'state'
  reader = ocp.PyTreeCheckpointer()  # (orbax warns that the item has no metadata file)
  tree = reader.metadata(path).item_metadata.tree
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  with checkpoint.draining_event_loops():  # a corrupt file's failed read: no threads left behind
    return reader.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))


def states_equal(a, b) -> bool:
  """Whether two states have the same leaves, bit for bit."""
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
      np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)
      for x, y in zip(leaves_a, leaves_b, strict=True))


def states_close(a, b, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
  """Whether every leaf of ``a`` is within ``atol + rtol·|b|`` of ``b``'s (`numpy.allclose`)."""
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
      np.allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)
      for x, y in zip(leaves_a, leaves_b, strict=True))


@dataclasses.dataclass
class RunWatch:
  """Reads a train.py run directory's progress: logged steps and restart rows."""

  workdir: pathlib.Path

  def steps(self) -> list[int]:
    return [row['step'] for row in self._rows('metrics.jsonl')]

  def losses(self) -> dict[int, float]:
    return {row['step']: row['loss'] for row in self._rows('metrics.jsonl')}

  def restarts(self) -> list[dict]:
    return self._rows('restarts.jsonl')

  def last_step(self) -> int:
    return max(self.steps(), default=0)

  def wait(self, ready: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Polls ``ready`` every 20 ms; returns when it held (`time.time`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if ready():
        return time.time()
      time.sleep(0.02)
    raise RuntimeError(f'timed out after {timeout_s:g} s waiting for {what}')

  def _rows(self, name: str) -> list[dict]:
    try:
      text = (self.workdir / name).read_text()
    except OSError:
      return []
    rows = []
    for line in text.splitlines():
      try:
        rows.append(json.loads(line))
      except ValueError:
        continue  # a line being written
    return rows
