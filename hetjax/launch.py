"""Runs one command as N local hetjax workers and exits with the job's status.

  python -m hetjax.launch --workers 4 --devices-per-worker 2 --slowdown static:1,1,2,4 \\
      --timeout 600 -- python experiments/train.py --config=mlp
  python -m hetjax.launch --devices 2,1,1 --timeout 600 -- python experiments/train.py ...

``--devices 2,1,1`` gives each worker its own device count (a 2-device host beside two
1-device hosts): it sets the number of workers too. ``--servers K`` adds K parameter-server
processes after the workers (`hetjax.ps`; their lines come out as ``[s{j}]``); ``--network
link:LATENCY_MS:BANDWIDTH_MB_S[:exchange=ring|server]`` emulates each worker's link, one value
for all or one per worker (`hetjax.emulation.parse_links`): under ``exchange=server`` a worker's
step is its compute plus its own push and pull, which LB-BSP balances
(``--network link:1:1000,1000,1000,20:exchange=server``: worker 3 gets fewer rows).

  python -m hetjax.launch --workers 4 --servers 1 --network link:2:50 --timeout 600 \\
      -- python -m experiments.bench_comm --role=job ...

Every worker line comes out on stdout as ``[w{i}] line`` while the job is healthy, except
chatter that the launch log keeps alone (Gloo's ``[Gloo] Rank N is connected to …`` at start-up,
`hetjax.runtime._console`). If a worker fails, the others are stopped and the launcher exits
with that worker's status; 124 on ``--timeout``, 130 on Ctrl-C. The peers' tracebacks and
runtime errors do not flood the console: stderr gets the cause, one line per worker and the path
of the launch log, which keeps every line of every worker (long lines wrapped here)::

  launch: worker 1 raised ValueError: boom; its peers failed after it (worker 0 was killed by
    SIGABRT)
  launch:   worker 0: was killed by SIGABRT (Terminating process because the JAX distributed
    service detected fatal errors.)
  launch:   worker 1: was killed by SIGABRT (ValueError: boom)
  launch:   worker 2: was killed by SIGABRT (ValueError: UNKNOWN: Gloo AllGather failed: …)
  launch: the full output of every worker: runs/gpt/launch.log

The log is ``launch.log`` in ``--log-dir``, by default the ``--workdir`` the command carries,
else a temporary directory (kept only when the job failed). The worker named is the one to
blame: a worker stopped by SIGSTOP, named by the stall watchdog, or that raised while its peers
still ran, rather than the peers that failed after it. Bad input prints ``launch: error: …``
and exits with 2.

Elastic runs: ``--max-restarts N`` relaunches a failed job (``experiments/train.py`` resumes
from its last complete checkpoint on its own); ``--min-workers M`` leaves out a worker that
fails twice in a row, down to M workers; ``--stall-timeout S`` is how long a worker may make no
progress (default: five times the step time measured from the first step on, at least 10 s;
`hetjax.runtime.ProgressWatchdog`).

  python -m hetjax.launch --workers 4 --max-restarts 3 --min-workers 3 --timeout 900 \\
      -- python experiments/train.py --config=mlp --workdir=runs/elastic

The work is done by `hetjax.runtime.launch_elastic` and `launch_local`; this file only parses
arguments.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from hetjax._errors import ConfigError
from hetjax.emulation import parse_links, parse_trace
from hetjax.runtime import launch_elastic


def parse_port_range(text: str) -> tuple[int, int]:
  """``'20000-20100'`` -> ``(20000, 20100)``; anything else is a `ConfigError`."""
  match = re.fullmatch(r'\s*(\d+)\s*-\s*(\d+)\s*', text)
  if not match:
    raise ConfigError(f'port range {text!r} is not LOW-HIGH, e.g. 20000-20100')
  return int(match[1]), int(match[2])


def _fail(message: str) -> NoReturn:
  print(f'launch: error: {message}', file=sys.stderr)
  sys.exit(2)


class _Parser(argparse.ArgumentParser):
  def error(self, message: str) -> NoReturn:  # one line instead of argparse's usage block
    _fail(message)


def _parser() -> argparse.ArgumentParser:
  parser = _Parser(prog='python -m hetjax.launch',
                   usage='%(prog)s --workers N [options] -- COMMAND [ARG ...]',
                   description='Start N local hetjax worker processes running COMMAND.')
  parser.add_argument('--workers', type=int, metavar='N',
                      help='number of worker processes (1..1024)')
  parser.add_argument('--devices-per-worker', type=int, metavar='D',
                      help='virtual CPU devices per worker (JAX_NUM_CPU_DEVICES; default 1)')
  parser.add_argument('--devices', metavar='D0,D1,…',
                      help='each worker\'s own device count, e.g. 2,1,1 (sets the workers)')
  parser.add_argument('--slowdown', metavar='SPEC',
                      help='slowdown spec, passed on as HETJAX_SLOWDOWN')
  parser.add_argument('--timeout', type=float, metavar='SECONDS',
                      help='seconds before the whole job is stopped (exit 124; default: none)')
  parser.add_argument('--init-timeout', type=float, metavar='SECONDS',
                      help='seconds for workers to join, passed on as HETJAX_INIT_TIMEOUT')
  parser.add_argument('--port-range', metavar='LOW-HIGH',
                      help='take the coordinator and transfer ports from this range')
  parser.add_argument('--servers', type=int, default=0, metavar='K',
                      help='parameter-server processes after the workers (default 0)')
  parser.add_argument('--network', metavar='SPEC',
                      help='emulated links: none or link:LATENCY_MS:BANDWIDTH_MB_S'
                           '[:exchange=ring|server] (one value or one per worker each), passed '
                           'on as HETJAX_NETWORK')
  parser.add_argument('--max-restarts', type=int, default=0, metavar='N',
                      help='relaunch a failed job up to N times; it resumes from its last '
                           'checkpoint (default 0)')
  parser.add_argument('--min-workers', type=int, metavar='M',
                      help='leave out a worker that fails twice in a row while more than M '
                           'remain (default: all workers)')
  parser.add_argument('--stall-timeout', type=float, metavar='SECONDS',
                      help='seconds without progress before a worker is named stuck and the '
                           'job ended (default: 5x the measured step time, at least 10 s)')
  parser.add_argument('--log-dir', metavar='DIR',
                      help='where launch.log keeps every line of every worker (default: the '
                           "command's --workdir, else a temporary directory)")
  parser.add_argument('--pin-cores', action='store_true',
                      help='run each worker on one CPU, round robin (Linux): emulated hosts '
                           'hold with more workers than cores')
  return parser


def _workers_and_devices(args) -> tuple[int, int | tuple[int, ...]]:
  """(workers, devices per worker or per-worker counts) from ``--workers``,
  ``--devices-per-worker`` and ``--devices``."""
  if args.devices is None:
    if args.workers is None:
      raise ConfigError('give --workers N (or --devices D0,D1,… with one count per worker)')
    return args.workers, 1 if args.devices_per_worker is None else args.devices_per_worker
  if args.devices_per_worker is not None:
    raise ConfigError('give --devices-per-worker or --devices, not both')
  try:
    counts = tuple(int(c) for c in args.devices.split(','))
  except ValueError:
    raise ConfigError(f'--devices {args.devices!r} is not comma-separated integers, '
                      'e.g. 2,1,1') from None
  if args.workers is not None and args.workers != len(counts):
    raise ConfigError(f'--workers {args.workers} but --devices lists {len(counts)} workers')
  return len(counts), counts


def log_dir(given: str | None, command: Sequence[str]) -> str | None:
  """``--log-dir``, else the run directory the command names (its last ``--workdir=X`` or
  ``--workdir X``), else None (a temporary directory)."""
  if given is not None:
    if not given.strip():
      raise ConfigError('--log-dir is empty')
    return given
  workdir = None
  for k, arg in enumerate(command):
    if arg.startswith('--workdir='):
      workdir = arg.partition('=')[2]
    elif arg == '--workdir' and k + 1 < len(command):
      workdir = command[k + 1]
  return workdir or None


def main(argv: Sequence[str] | None = None) -> int:
  """Parses ``argv`` (default: ``sys.argv[1:]``), runs the job and returns its exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  split = argv.index('--') if '--' in argv else len(argv)
  args = _parser().parse_args(argv[:split])
  try:
    workers, devices = _workers_and_devices(args)
    port_range = None if args.port_range is None else parse_port_range(args.port_range)
    command = argv[split + 1:]
    result = launch_elastic(command, workers, devices, log_dir=log_dir(args.log_dir, command),
                            max_restarts=args.max_restarts, min_workers=args.min_workers,
                            stall_timeout=args.stall_timeout,
                            slowdown=args.slowdown, timeout=args.timeout,
                            init_timeout=args.init_timeout, port_range=port_range,
                            validate_slowdown=lambda spec: parse_trace(spec, workers),
                            pin_cores=args.pin_cores, servers=args.servers,
                            network=args.network,
                            validate_network=lambda spec: parse_links(spec, workers))
  except ConfigError as e:
    _fail(str(e))
  if result.returncode != 0:
    for line in result.verdict():
      print(f'launch: {line}', file=sys.stderr, flush=True)
  return result.returncode


if __name__ == '__main__':
  sys.exit(main())
