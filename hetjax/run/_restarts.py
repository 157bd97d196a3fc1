"""What train.py does when `hetjax.launch --max-restarts` restarted it: resume on its own, keep
``metrics.jsonl`` and ``telemetry.jsonl`` free of the lost steps, and count what each restart
cost (``restarts.jsonl``, summed in ``summary.json``)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from hetjax import planner, runtime, sharding
from hetjax.core import StepStats, decode_state, encode_state

RESTARTS_FILE = 'restarts.jsonl'
REPLAYED_STEPS = 8  # the survivors' last steps before the checkpoint that seed a resized policy
_TRIMMED = ('metrics.jsonl', 'telemetry.jsonl')


def auto_resume(resume_flag: bool, workdir: pathlib.Path) -> bool:
  """Whether to resume: ``--resume``, or a restarted launch whose run dir holds a checkpoint
  (a restart before the first checkpoint starts over)."""
  if resume_flag:
    return True
  return runtime.restart_attempt() > 0 and has_checkpoint(workdir)


def has_checkpoint(workdir: pathlib.Path) -> bool:
  """Whether the run dir holds a complete checkpoint: a step directory (orbax and the stage
  checkpointer rename one into place when complete), or one in a replica's directory."""
  directory = workdir / 'checkpoints'
  if not directory.is_dir():
    return False
  return any(p.name.isdigit() or (p.name.startswith('replica-') and p.is_dir() and any(
      q.name.isdigit() for q in p.iterdir())) for p in directory.iterdir())


def trim_after(workdir: pathlib.Path, step: int) -> int | None:
  """Drops the rows of steps after ``step`` (lost with the failed launch) from the metrics and
  telemetry files, atomically; returns the last step ``metrics.jsonl`` had logged, or None."""
  last = None
  for name in _TRIMMED:
    path = workdir / name
    if not path.exists():
      continue
    kept = []
    for line in path.read_text().splitlines():
      try:
        row_step = int(json.loads(line)['step'])
      except (ValueError, KeyError, TypeError):
        continue  # a line cut short by the failure
      if name == 'metrics.jsonl':
        last = row_step if last is None else max(last, row_step)
      if row_step <= step:
        kept.append(line + '\n')
    tmp = path.with_suffix('.tmp')
    tmp.write_text(''.join(kept))
    os.replace(tmp, path)
  return last


def _archive_other_workers(workdir: pathlib.Path, workers: int) -> None:
  """Moves telemetry written by another number of workers to ``telemetry-upto-STEP.jsonl``:
  ``telemetry.jsonl`` holds one set of workers, as `hetjax.report` reads it."""
  path = workdir / 'telemetry.jsonl'
  if not path.exists():
    return
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  if rows and max(int(r['worker']) for r in rows) + 1 != workers:
    os.replace(path, workdir / f'telemetry-upto-{max(int(r["step"]) for r in rows)}.jsonl')


def record_restart(workdir: pathlib.Path, resumed_from: int, workers: int) -> dict[str, Any]:
  """Trims the lost steps and appends this restart's row to ``restarts.jsonl``: which restart,
  its cause, the step resumed from, the last step logged before the failure and the steps lost
  (the logged steps past the checkpoint: a lower bound when ``log_every`` > 1)."""
  last = trim_after(workdir, resumed_from)
  _archive_other_workers(workdir, workers)
  row = {'restart': runtime.restart_attempt(), 'cause': runtime.restart_cause(),
         'resumed_from': resumed_from, 'last_logged_step': last,
         'steps_lost': max(0, (last or 0) - resumed_from), 'workers': workers,
         'hosts': list(runtime.hosts(workers))}
  with open(workdir / RESTARTS_FILE, 'a') as f:
    f.write(json.dumps(row) + '\n')
  print(f'restart {row["restart"]}: resumed from step {resumed_from} on {workers} workers '
        f'({row["steps_lost"]} logged steps lost; cause: {row["cause"]})', flush=True)
  return row


def watchdog(channel, worker: int, workers: int) -> runtime.ProgressWatchdog:
  """Worker ``worker``'s side of the job's stall watchdog over its ``workers`` training
  processes (worker 0 also watches; a parameter server reports nothing), with the timeout and
  verdict directory the launcher gave."""
  names = [f'worker {h}' for h in runtime.hosts(workers)]
  return runtime.ProgressWatchdog(channel, worker, workers, timeout_s=runtime.stall_timeout(),
                                  verdict_dir=runtime.verdict_dir(), names=names)


def reseed_policy(policy, saved: dict[str, Any], workdir: pathlib.Path,
                  ctx: runtime.WorkerContext, channel) -> Any:
  """The share policy's state for this launch's workers when the checkpoint was saved by other
  workers (some were left out): the survivors' telemetry of the last `REPLAYED_STEPS` steps up
  to the checkpoint, replayed through ``policy.update``, so the first shares already follow
  their measured speeds. Worker 0 reads ``telemetry.jsonl`` and sends the state to the others
  over ``channel`` (every worker must start from the same shares). None: no telemetry to
  replay (the policy starts fresh)."""
  if ctx.is_chief:
    state = _replay(policy, saved, workdir, runtime.hosts(ctx.workers))
    payload = None if state is None else encode_state(state)
    if channel is not None:
      channel.set('reseeded-policy', payload)
    print(f'resume: {ctx.workers} workers now, {saved["layout"]["workers"]} when saved: the '
          + ('shares start from the survivors\' last measured speeds' if state is not None
             else 'policy starts fresh (no telemetry to replay)'), flush=True)
    return state
  payload = channel.get('reseeded-policy', timeout_s=120.0)
  return None if payload is None else decode_state(policy.init(), payload)


def _replay(policy, saved: dict[str, Any], workdir: pathlib.Path,
            hosts: tuple[int, ...]) -> Any:
  layout = saved.get('layout', {})
  saved_hosts = list(layout.get('hosts') or range(layout.get('workers') or 0))
  path = workdir / 'telemetry.jsonl'
  if not path.exists() or any(h not in saved_hosts for h in hosts):
    return None
  keep = [saved_hosts.index(h) for h in hosts]
  by_step: dict[int, dict[int, dict]] = {}
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
      if int(row['step']) <= int(saved['step']):
        by_step.setdefault(int(row['step']), {})[int(row['worker'])] = row
    except (ValueError, KeyError, TypeError):
      continue
  steps = [s for s in sorted(by_step) if set(by_step[s]) == set(range(len(saved_hosts)))]
  if not steps:
    return None
  state = policy.init()
  for step in steps[-REPLAYED_STEPS:]:
    rows = [by_step[step][w] for w in keep]
    busy = tuple(float(r['compute_s']) + float(r['dilation_s']) for r in rows)
    stats = StepStats(step, tuple(int(r['share']) for r in rows), busy,
                      iter_s=max(float(r['step_s']) for r in rows),
                      load=tuple(float(r.get('load', 1.0)) for r in rows))
    _, state = policy.update(state, stats)
  return state


def replan(plan: planner.Plan, task, global_batch: int, ctx: runtime.WorkerContext,
           channel) -> planner.Plan:
  """A plan for this job's devices, re-searched when a restart left workers out and ``plan``
  (the run's plan file) is for more: the cluster measured anew (every worker takes part) and
  searched with the analytic cost model by worker 0, whose plan the others take over
  ``channel`` (every worker must build the same program)."""
  cluster = planner.measure_cluster()
  names = sharding.submodel_names(task.make_model)
  if not ctx.is_chief:
    return planner.Plan.from_json(channel.get('replanned', timeout_s=600.0), names)
  found = planner.search(planner.profile_submodels(task), cluster, global_batch,
                         planner.AnalyticCost())
  if channel is not None:
    channel.set('replanned', found.to_json())
  print(f'plan: {plan.name!r} is for {plan.devices} devices; re-searched for the '
        f'{cluster.devices} left: ' + ', '.join(
            f'{s.name} {s.layout.name(cluster.devices)}' for s in found.submodels), flush=True)
  return found


def summary_fields(workdir: pathlib.Path) -> dict[str, Any]:
  """``restarts`` (how many times the launcher restarted the job), and the ``steps_lost`` and
  causes of each restart that resumed (``restarts.jsonl``; a launch that failed before it
  resumed has no row)."""
  path = workdir / RESTARTS_FILE
  rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
  return {'restarts': runtime.restart_attempt(), 'steps_lost': [r['steps_lost'] for r in rows],
          'restart_causes': [r['cause'] for r in rows]}
