"""Goodput: the part of a run's wall time that trained the model, and where the rest went.

Read from what a run directory holds. ``metrics.jsonl`` (`hetjax.train.MetricsLogger`) gives
every step's interval: the time from the end of the step before to its own end, fetched
without syncing every step; its rows also say which step a compile held up
(``held_up_by_compile``), how long `MetricsLogger.timed` hooks took inside the interval
(``hooks_s``, e.g. a checkpoint's save), when each launch's logger started
(``start_unix_s``), and how and when each launch began (``launch``, a `Launch`, and
``launched_unix_s``). ``telemetry.jsonl`` (several workers) gives each worker's wait at the
barrier, and ``summary.json`` the logger's wall time up to the end of the run.

The wall time is split into:

* productive: the steps' time, less the rest of this list;
* ``startup``: from the job's start (``run.json``'s ``started_unix_s``: imports, building the
  programs, restoring a checkpoint) to its first logger's;
* ``compile``: the first step of every launch (it compiles; the runner's speed probe and
  warm-up run inside it too) and every step a compile held up, less one steady step's time
  each (the mean of the steps counted as productive), which they also trained;
* one entry per timed hook (``checkpoint``, ``eval``): its ``hooks_s``;
* ``barrier_wait``: of the productive time, the fraction that workers waited at the barrier
  for a slower one (their ``wait_s`` over their ``step_s``, summed over every worker of the
  steady steps); 0 without telemetry (one worker, or one SPMD program whose waits XLA hides);
* ``resume``, only when a launch was resumed by hand (``--resume``): from its start to its
  logger's (imports, building the programs, restoring the checkpoint). The time before, from
  the last step of the launch before (its closing included) until someone resumed it, nothing
  ran: it is outside the wall time;
* ``restart``, only when the launcher restarted the job after a failure: from the last kept
  step of the launch that failed to the next launch's logger (the steps lost past the
  checkpoint, noticing the failure, restarting, restoring). The launches of a run line up by
  ``start_unix_s``;
* ``other``: after the last step until the run's summary (closing: the last checkpoint's
  write, freeing the programs).

What is not in these files yet is named in ``unrecorded`` (and counted as productive, or left
out of the wall time, as each entry says).

Example::

  g = goodput('runs/lm')
  g['goodput'], g['badput_s']   # 0.91, {'compile': 4.2, 'checkpoint': 1.3, …}
  print(format_goodput(g))
"""

from __future__ import annotations

import enum
import json
import pathlib
from typing import Any

import numpy as np

from hetjax._errors import ConfigError
from hetjax.report._objective import METRICS_FILE
from hetjax.report._telemetry_table import TELEMETRY_FILE, load_telemetry

SUMMARY_FILE = 'summary.json'
RESTARTS_FILE = 'restarts.jsonl'
RUN_FILE = 'run.json'
_CATEGORIES = ('startup', 'compile', 'checkpoint', 'barrier_wait', 'resume', 'restart', 'other')
#: Categories a run has only when such a launch happened (`Launch`).
_LAUNCH_CATEGORIES = ('resume', 'restart')


class Launch(enum.Enum):
  """How a launch of a run began: its first ``metrics.jsonl`` line's ``launch``
  (`hetjax.train.MetricsLogger`), and what goodput calls the time before its first step.

  Example::

    Launch('resume')   # Launch.RESUME: badput 'resume', from the launch's own start
  """

  START = 'start'  # a new run: ``startup``, from the job's start (``run.json``)
  RESUME = 'resume'  # ``--resume`` by hand: ``resume``, from ``launched_unix_s``
  RESTART = 'restart'  # the launcher restarted a failed job: ``restart``, from the last kept step

#: What a run records too little of to split out, keyed by the fact that shows it.
NOT_TIMED_HOOKS = ('checkpoint saves: not timed (no hooks_s in metrics.jsonl; wrap the '
                   'checkpoint hook in MetricsLogger.timed(hook, "checkpoint")), counted as '
                   'productive')
BEFORE_LOGGER = ('start-up: before the first launch\'s MetricsLogger started (imports, build, '
                 'restore), outside the wall time: run.json lacks started_unix_s')
RESTORE_IN_STARTUP = ('checkpoint restore: inside the resume or restart time, not timed on its '
                      'own (needs restore_s per launch)')
NO_LAUNCH_CLOCK = ('gaps between launches: rows lack start_unix_s (written before it existed), '
                   'resume and restart time unknown and outside the wall time')
NO_RESUME_CLOCK = ('resumed launches\' start: rows lack launched_unix_s (written before it '
                   'existed), the time the run stood still before each resume counted as resume')
NO_SUMMARY = 'closing: no summary.json wall_s, the time after the last step unknown'


def goodput(run_dir: str | pathlib.Path) -> dict[str, Any]:
  """The run's goodput: productive seconds over wall seconds, and the badput by cause (module
  docstring).

  Returns:
    ``{'goodput': fraction, 'wall_s', 'productive_s', 'badput_s': {cause: seconds or None
    (not recorded)}, 'launches', 'steps', 'resumes', 'restarts', 'steps_lost', 'unrecorded':
    [what the run's files lack, each a sentence]}``. ``badput_s`` has ``resume`` and
    ``restart`` only when the run was resumed or restarted; ``unrecorded`` names the checkpoint
    restore only then.

  Raises:
    ConfigError: no ``metrics.jsonl``, a malformed line, or rows without ``time_s``.
  """
  directory = pathlib.Path(run_dir)
  launches = _launches(_rows(directory / METRICS_FILE))
  summary = _summary(directory)
  timed = {k for launch in launches for r in launch for k in r.get('hooks_s') or {}}
  timed |= set((summary or {}).get('hooks_s') or {})
  restarts = _restarts(directory)
  kinds = _kinds(launches, restarts)
  happened = {k.value for k in kinds[1:]}  # 'resume', 'restart': what the run went through
  if kinds[0] is Launch.RESTART:  # restarted before its first checkpoint: its steps dropped
    happened.add(Launch.RESTART.value)
  unrecorded = [RESTORE_IN_STARTUP] if len(launches) > 1 else []
  unrecorded += [] if 'checkpoint' in timed else [NOT_TIMED_HOOKS]
  steps = [_intervals(rows, last=i == len(launches) - 1) for i, rows in enumerate(launches)]
  steady = [s['seconds'] - sum(s['hooks'].values())
            for launch in steps for s in launch if s['kind'] == 'steady']
  mean_step = float(np.mean(steady)) if steady else 0.0
  categories = [c for c in _CATEGORIES if c not in _LAUNCH_CATEGORIES or c in happened]
  badput: dict[str, float | None] = dict.fromkeys(categories, 0.0) | dict.fromkeys(timed, 0.0)
  if 'checkpoint' not in timed:
    badput['checkpoint'] = None
  productive = 0.0
  for s in (s for launch in steps for s in launch):
    for name, seconds in s['hooks'].items():
      badput[name] += seconds
    work = max(s['seconds'] - sum(s['hooks'].values()), 0.0)
    trained = work if s['kind'] == 'steady' else min(work, mean_step)
    badput['compile'] += work - trained
    productive += trained
  badput['barrier_wait'] = productive * _barrier_fraction(directory, steps)
  productive -= badput['barrier_wait']
  wall = sum(launch[-1]['end'] for launch in steps)
  badput['startup'], scratch = _startup(directory, launches[0][0], kinds[0])
  if badput['startup'] is None:
    unrecorded.insert(0, BEFORE_LOGGER)
  else:
    wall += badput['startup']
  gaps = _gaps(launches, steps, kinds)
  if gaps is None:
    badput |= dict.fromkeys(happened, None)
    unrecorded.append(NO_LAUNCH_CLOCK)
  else:
    gaps['restart'] += scratch
    badput |= {k: v for k, v in gaps.items() if k in happened}
    wall += sum(gaps.values())
    if any(k is Launch.RESUME and 'launched_unix_s' not in launch[0]
           for k, launch in zip(kinds[1:], launches[1:], strict=True)):
      unrecorded.append(NO_RESUME_CLOCK)
  tail = None if summary is None else _tail(summary, steps[-1][-1]['end'], launches[-1])
  if tail is None:
    badput['other'] = None
    unrecorded.append(NO_SUMMARY)
  else:
    for name, seconds in tail.items():
      badput[name] += seconds
    wall += sum(tail.values())
  return {
      'goodput': round(productive / wall, 4) if wall > 0 else None,
      'wall_s': round(wall, 3),
      'productive_s': round(productive, 3),
      'badput_s': {k: None if v is None else round(v, 3) for k, v in badput.items()},
      'launches': len(launches),
      'steps': sum(len(launch) for launch in launches),
      'resumes': kinds[1:].count(Launch.RESUME),
      'restarts': len(restarts),
      'steps_lost': sum(int(r.get('steps_lost') or 0) for r in restarts),
      'unrecorded': unrecorded,
  }


def format_goodput(g: dict[str, Any]) -> str:
  """One line: ``goodput 82.4% of 120.5 s | compile 9.1 s | checkpoint n/a | …``, then what
  was not recorded on a second line when anything was not.

  Example::

    print(format_goodput(goodput('runs/lm')))
  """
  share = 'n/a' if not g['wall_s'] else f'{g["productive_s"] / g["wall_s"]:.1%}'
  parts = [f'goodput {share} of {g["wall_s"]:.1f} s ({g["launches"]} launch'
           + ('es' if g['launches'] != 1 else '') + ')']
  parts += [f'{name.replace("_", " ")} ' + ('n/a' if s is None else f'{s:.1f} s')
            for name, s in g['badput_s'].items()]
  line = ' | '.join(parts)
  missing = [u.split(':')[0] for u in g['unrecorded']]
  return line + (f'\ngoodput: not split out: {"; ".join(missing)}' if missing else '')


def _rows(path: pathlib.Path) -> list[dict[str, Any]]:
  if not path.is_file():
    raise ConfigError(f'no {path.name} in {path.parent}: goodput reads the steps\' times from it')
  rows = []
  for n, line in enumerate(path.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      step, fetched, returned = int(row['step']), float(row['time_s']), float(row['returned_s'])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
      raise ConfigError(f'{path}:{n}: not a metrics line with time_s and returned_s '
                        f'({type(e).__name__}: {e})') from None
    rows.append(row | {'step': step, 'time_s': fetched, 'returned_s': returned})
  if not rows:
    raise ConfigError(f'{path} is empty')
  return rows


def _launches(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
  """The rows cut where a launch's logger started: a row with ``start_unix_s`` (the logger's
  first), or, in files written before it, a fetch time below the row before's."""
  launches: list[list[dict[str, Any]]] = []
  for row in rows:
    new = not launches or 'start_unix_s' in row or row['time_s'] < launches[-1][-1]['time_s']
    if new:
      launches.append([])
    launches[-1].append(row)
  return launches


def _intervals(rows: list[dict[str, Any]], last: bool) -> list[dict[str, Any]]:
  """Each step's interval as `hetjax.train.MetricsLogger` measured it: from the end of the step
  before (the launch's start for its first) to its return, or to its fetch for the last step
  of a fetch. A launch's last kept row that a later launch followed ends at its return: the
  steps fetched with it were dropped as lost."""
  out, begin = [], 0.0
  for i, row in enumerate(rows):
    closes_fetch = i == len(rows) - 1 or rows[i + 1]['time_s'] != row['time_s']
    cut = i == len(rows) - 1 and not last
    end = row['time_s'] if closes_fetch and not cut else max(row['returned_s'], begin)
    kind = 'warm-up' if i == 0 else 'compiling' if row.get('held_up_by_compile') else 'steady'
    out.append({'step': row['step'], 'seconds': end - begin, 'end': end, 'kind': kind,
                'hooks': {k: float(v) for k, v in (row.get('hooks_s') or {}).items()}})
    begin = end
  return out


def _barrier_fraction(directory: pathlib.Path, steps: list[list[dict[str, Any]]]) -> float:
  """Of the steady steps' worker time, the part spent waiting at the barrier: Σ wait_s / Σ
  step_s over every worker of the steps that telemetry and metrics both count as steady."""
  if not (directory / TELEMETRY_FILE).is_file():
    return 0.0
  t = load_telemetry(directory)
  steady = {s['step'] for launch in steps for s in launch if s['kind'] == 'steady'}
  clean = (t.compile_s.max(axis=1) == 0) & t.sampled.all(axis=1)
  rows = [i for i, step in enumerate(t.steps) if step in steady and clean[i]]
  total = float(t.step_s[rows].sum())
  return float(t.wait_s[rows].sum()) / total if total > 0 else 0.0


def _startup(directory: pathlib.Path, first: dict[str, Any], kind: Launch
             ) -> tuple[float | None, float]:
  """``(startup, restart)``: seconds from the job's start (``run.json``'s ``started_unix_s``)
  to its first logger's (``start_unix_s`` of the first row), None when either is not
  recorded. When the launcher restarted that first launch (the one before failed ahead of any
  checkpoint, and its steps were dropped), the part before it began (``launched_unix_s``) is
  restart."""
  path = directory / RUN_FILE
  try:
    started = float(json.loads(path.read_text())['started_unix_s'])
    total = max(float(first['start_unix_s']) - started, 0.0)
  except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
    return None, 0.0
  if kind is not Launch.RESTART or 'launched_unix_s' not in first:
    return total, 0.0
  own = min(max(float(first['start_unix_s']) - float(first['launched_unix_s']), 0.0), total)
  return own, total - own


def _kinds(launches: list[list[dict[str, Any]]], restarts: list[dict[str, Any]]
           ) -> list[Launch]:
  """How each launch began: its first row's ``launch``; in rows written before it, a restart
  when ``restarts.jsonl`` has rows (the launcher restarted the job), else a resume."""
  guess = Launch.RESTART if restarts else Launch.RESUME
  kinds = []
  for i, launch in enumerate(launches):
    try:
      kind = Launch(launch[0]['launch'])
    except (KeyError, ValueError):
      kind = Launch.START if i == 0 else guess
    kinds.append(Launch.RESUME if i > 0 and kind is Launch.START else kind)
  return kinds


def _gaps(launches, steps, kinds: list[Launch]) -> dict[str, float] | None:
  """The seconds from each launch's last kept step to the next launch's logger, as ``resume``
  and ``restart`` (a resume's from its own start: the time before it, when nothing ran, in
  neither); None when a launch's start is not recorded."""
  out = dict.fromkeys(_LAUNCH_CATEGORIES, 0.0)
  starts = [launch[0].get('start_unix_s') for launch in launches]
  if len(launches) > 1 and any(s is None for s in starts):
    return None
  for i in range(1, len(launches)):
    ended, start = float(starts[i - 1]) + steps[i - 1][-1]['end'], float(starts[i])
    if kinds[i] is Launch.RESUME:
      ended = max(ended, float(launches[i][0].get('launched_unix_s', ended)))
    out[kinds[i].value] += max(start - ended, 0.0)
  return out


def _summary(directory: pathlib.Path) -> dict[str, Any] | None:
  """The run's ``summary.json`` when it holds the logger's ``wall_s``; else None."""
  path = directory / SUMMARY_FILE
  try:
    summary = json.loads(path.read_text())
    float(summary['wall_s'])
  except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
    return None
  return summary


def _tail(summary: dict[str, Any], end: float, launch: list[dict[str, Any]]
          ) -> dict[str, float] | None:
  """The last launch's time after its last step (``summary.json``'s ``wall_s`` runs until the
  summary): its timed hooks' totals less what its rows hold, the rest as ``other``; None when
  the summary ends before the last step (an earlier launch's)."""
  tail = float(summary['wall_s']) - end
  if tail < -0.01:  # wall_s is rounded to 10 ms
    return None
  tail = max(tail, 0.0)
  out = {}
  for name, total in (summary.get('hooks_s') or {}).items():
    inside = sum(float((r.get('hooks_s') or {}).get(name, 0.0)) for r in launch)
    out[name] = min(max(float(total) - inside, 0.0), tail)
    tail -= out[name]
  out['other'] = tail
  return out


def _restarts(directory: pathlib.Path) -> list[dict[str, Any]]:
  path = directory / RESTARTS_FILE
  if not path.is_file():
    return []
  rows = []
  for line in path.read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      continue  # a line cut short by a failure
  return rows
