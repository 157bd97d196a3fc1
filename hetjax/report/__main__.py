"""Prints a run's per-worker time table and writes its timeline and throughput plots; given
several runs, prints and plots them side by side.

  python -m hetjax.report runs/het4 [--skip N] [--no-plots]
  python -m hetjax.report runs/uniform runs/lbbsp [--out compare.png]

A run without per-worker telemetry (one process, or SchMP rounds) gets its curve instead: the
first and last training loss by step (a SchMP run's objective, by round), the first and last
evaluation loss when it evaluated, and ``objective.png``, against steps and against time.

Either way, a run with a ``metrics.jsonl`` gets its goodput line (`hetjax.report.goodput`: the
part of the wall time that trained, and compile, checkpoint, barrier wait, restart and other
time) and ``loss.png``, the training loss with the evaluation loss where the run evaluated
(for a run without telemetry only then: ``objective.png`` already shows its loss).

The means and the throughput cover the steps after the ``--skip`` warm-up ones that no compile
held up (none waited for one or ran beside one: the footer names those left out), the figure
``summary.json`` gives as ``steady_samples_per_s``. A run too short for any such step (every
one met a compile) gets its means over all the steps after the warm-up, and no throughput:
the footer says so.

A run that emulated hosts (a slowdown) names them: their cost per row and per step, and
whether they were calibrated at start, declared (``emulation.host_row_s``) or reused from
another run (``--hosts=RUN_DIR``).

Several runs (`hetjax.report.compare_runs`): one row each (mode, policy, slowdown, steady
samples/s, step time, goodput, hosts), each run's samples/s over the first's, one warning line
when their hosts differ (then they compare two clusters, not two policies), and
``compare.png`` (``--out``; default beside the first run directory): samples/s per step and each
worker's mean step, of every run with telemetry.

Bad input (no such directory, a malformed telemetry line, an incomplete steps × workers grid, a
``--skip`` that leaves no steps) prints one line ``report: error: …`` and exits with 2.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import NoReturn

from hetjax import balance, report
from hetjax._errors import ConfigError

PROG = 'report'


class _Parser(argparse.ArgumentParser):
  """An argparse parser whose usage errors are one stderr line, like every hetjax entry point."""

  def error(self, message: str) -> NoReturn:
    _fail(message)


def _parser() -> argparse.ArgumentParser:
  parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument('run_dirs', metavar='RUN_DIR', nargs='+',
                      help='directory holding telemetry.jsonl (or metrics.jsonl); several: '
                      'side by side')
  parser.add_argument('--skip', type=int, default=1,
                      help='leading warm-up steps to leave out of the means (steps that waited '
                      'for a compile or ran beside one are left out too); default 1')
  parser.add_argument('--no-plots', action='store_true', help='print the table only')
  parser.add_argument('--out', metavar='PNG', default=None,
                      help='several runs: where their plot goes (default: compare.png beside '
                      'the first run directory)')
  return parser


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  if len(args.run_dirs) > 1:
    return _compare(args)
  if args.out is not None:
    _fail('--out names the plot of several runs compared: give two or more RUN_DIRs')
  args.run_dir = args.run_dirs[0]
  run_dir = pathlib.Path(args.run_dir)
  if not (run_dir / 'telemetry.jsonl').is_file() and (run_dir / report.METRICS_FILE).is_file():
    return _objective(args)
  try:
    t = report.load_telemetry(args.run_dir)
    table = report.format_table(report.summarise(t, args.skip),
                                report.iteration_summary(t, args.skip))
    paths = [] if args.no_plots else report.write_plots(t, args.skip)
  except (ConfigError, OSError) as e:  # OSError: an unreadable file, an unwritable directory
    _fail(str(e))
  words = {'policy': balance.describe_policy}  # a policy's name, said in words
  header = ', '.join(f'{k} {words.get(k, str)(t.run[k])}'
                     for k in ('model', 'policy', 'slowdown') if t.run.get(k))
  if header:
    print(header)
  if hosts := report.describe_hosts(t.run):
    print(hosts)
  print(table)
  _print_goodput(run_dir)
  for path in paths:
    print(f'wrote {path}')
  return 0


def _objective(args) -> int:
  try:
    curve = report.load_objective(args.run_dir)
    paths = [] if args.no_plots else [
        report.plot_objective(curve, f'{args.run_dir}/objective.png')]
    losses = None if args.no_plots else report.load_loss(args.run_dir)
    if losses is not None and losses.eval_steps.size:
      paths.append(report.plot_loss(losses, f'{args.run_dir}/loss.png'))
  except (ConfigError, OSError) as e:
    _fail(str(e))
  if hosts := report.describe_hosts(_run(args.run_dir)):
    print(hosts)
  # A SchMP run's loss is its objective, by round; any other run's is its training loss.
  what, unit = ('objective', 'round') if _mode(args.run_dir) == 'schmp' else ('loss', 'step')
  print(f'{what}: {curve.objective[0]:.6g} at {unit} {curve.rounds[0]} → '
        f'{curve.objective[-1]:.6g} at {unit} {curve.rounds[-1]} ({curve.seconds[-1]:.1f} s; '
        f'{len(curve.rounds)} {"evaluations" if unit == "round" else "steps"})'
        + (f'; not finite at {unit} {curve.diverged_by}: diverged' if curve.diverged_by else ''))
  if losses is not None and losses.eval_steps.size:
    print(f'eval_loss: {losses.eval_loss[0]:.6g} at step {losses.eval_steps[0]} → '
          f'{losses.eval_loss[-1]:.6g} at step {losses.eval_steps[-1]} '
          f'({losses.eval_steps.size} evaluations)')
  _print_goodput(pathlib.Path(args.run_dir))
  for path in paths:
    print(f'wrote {path}')
  return 0


def _compare(args) -> int:
  """Several runs side by side (module docstring)."""
  try:
    runs = report.compare_runs(args.run_dirs, args.skip)
    path = None
    if not args.no_plots and any(r.telemetry is not None for r in runs):
      out = args.out or pathlib.Path(args.run_dirs[0]).parent / 'compare.png'
      path = report.plot_comparison(runs, out, args.skip)
  except (ConfigError, OSError) as e:
    _fail(str(e))
  print(report.format_comparison(runs))
  if warning := report.hosts_warning(runs):
    print(warning)
  if path is not None:
    print(f'wrote {path}')
  elif not args.no_plots:
    print('no plot: none of these runs has telemetry.jsonl (several workers)')
  return 0


def _run(run_dir: str) -> dict:
  """``run.json``'s fields, or none (no run.json: a run of an older version, or written by
  hand)."""
  try:
    run = json.loads((pathlib.Path(run_dir) / 'run.json').read_text())
  except (OSError, ValueError):
    return {}
  return run if isinstance(run, dict) else {}


def _mode(run_dir: str) -> str | None:
  """The mode ``run.json`` names, or None (no run.json: a run of an older version, or
  written by hand)."""
  return _run(run_dir).get('mode')


def _print_goodput(run_dir: pathlib.Path) -> None:
  """The goodput line of a run with a ``metrics.jsonl``; a line saying why not when its rows
  cannot be split (written before they had times), never a failed report."""
  if not (run_dir / report.METRICS_FILE).is_file():
    return
  try:
    print(report.format_goodput(report.goodput(run_dir)))
  except ConfigError as e:
    print(f'goodput: n/a ({e})')


def _fail(message: str) -> NoReturn:
  print(f'{PROG}: error: {message}', file=sys.stderr)
  sys.exit(2)


if __name__ == '__main__':
  sys.exit(main())
