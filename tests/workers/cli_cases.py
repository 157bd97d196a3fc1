"""Runs ``experiments/train.py`` once per argument list, each in a forked child: one import of
JAX and the script for many command lines (tests/test_train_cli.py's bad-input cases).

  python tests/workers/cli_cases.py CASES.json RESULTS.json

CASES.json is a list of argument lists, each run by ``train.py``, or by ``schmp.py`` when its
first item is ``'schmp.py'``. Each child is the real entry point (`hetjax.cli.run_main`,
``sys.argv`` set, absl parsing, ``sys.exit``) forked before any JAX backend exists, so each one
starts its own. RESULTS.json gets, per case, ``{"returncode": int, "stdout": str, "stderr":
str}``. Every child is killed after 120 s (returncode -9).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import tempfile
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

TIMEOUT_S = 120


def _child(args: list[str], out: str, err: str) -> None:
  from hetjax.cli import run_main, schmp, train
  script, run = (('schmp.py', schmp.schmp_from_flags) if args[:1] == ['schmp.py']
                 else ('train.py', train.train_from_flags))
  args = args[1:] if script == 'schmp.py' else args
  for fd, path in ((1, out), (2, err)):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
  sys.argv = [script, *args]
  try:
    run_main(script, run)
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  else:
    code = 0
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def _run(args: list[str], scratch: pathlib.Path) -> dict:
  out, err = scratch / 'out', scratch / 'err'
  pid = os.fork()
  if pid == 0:
    try:
      _child(args, str(out), str(err))
    except BaseException:  # an escape from the entry point: keep its traceback for the test
      traceback.print_exc()
      sys.stderr.flush()
    finally:
      os._exit(70)  # only reached if the child did not exit through the entry point
  signal.alarm(TIMEOUT_S)
  try:
    _, status = os.waitpid(pid, 0)
  except InterruptedError:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
  finally:
    signal.alarm(0)
  return {'returncode': os.waitstatus_to_exitcode(status), 'stdout': out.read_text(),
          'stderr': err.read_text()}


def main(cases_path: str, results_path: str) -> None:
  from hetjax.cli import schmp, train  # noqa: F401  (imported once, before the forks)

  def on_alarm(signum, frame):
    raise InterruptedError
  signal.signal(signal.SIGALRM, on_alarm)
  cases = json.loads(pathlib.Path(cases_path).read_text())
  with tempfile.TemporaryDirectory() as scratch:
    results = [_run(args, pathlib.Path(scratch)) for args in cases]
  pathlib.Path(results_path).write_text(json.dumps(results))


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])
