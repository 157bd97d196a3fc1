"""What every experiment entry point does the same way: bad input is one line and exit 2."""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Callable

import jax
from absl import app, flags, logging

from hetjax import ConfigError


def fail(script: str, message: str) -> None:
  """Prints ``script: error: message`` to stderr and exits with status 2.

  In a job of several processes the exit is immediate (``os._exit``): JAX's shutdown barrier
  would otherwise hold this process until its peers' waits time out and then abort it, and the
  launcher would name a SIGABRT instead of this line's status 2.
  """
  print(f'{script}: error: {message}', file=sys.stderr, flush=True)
  if jax.distributed.is_initialized():
    sys.stdout.flush()
    os._exit(2)
  sys.exit(2)


def program_name(default: str) -> str:
  """The name errors start with: the console entry's (``hetjax-train``) or the script's
  (``train.py``) as the command line ran it, else ``default``."""
  return pathlib.Path(sys.argv[0]).name if sys.argv and sys.argv[0] else default


def run_main(script: str, run: Callable[[], object], cpu_devices: int | None = None) -> None:
  """Runs ``run()`` as an absl program: flags parsed (a bad flag is one line, exit 2), JAX's
  flags honoured, INFO logs quiet unless ``--verbosity`` is given (orbax logs every save, JAX
  its backend search), and a `ConfigError` from ``run`` one line with exit 2.

  Args:
    script: the name errors start with, e.g. ``'train.py'``.
    run: the program.
    cpu_devices: on a CPU-only machine, this many devices unless ``--jax_num_cpu_devices`` is
      given.
  """
  def parse(argv: list[str]) -> list[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      fail(script, str(e))

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(script, f'unexpected arguments: {" ".join(argv[1:])}')
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)
    try:
      run()
    except ConfigError as e:
      fail(script, str(e))

  jax.config.config_with_absl()
  if cpu_devices is not None and '--jax_num_cpu_devices' not in ' '.join(sys.argv):
    jax.config.update('jax_num_cpu_devices', cpu_devices)
  app.run(main, flags_parser=parse)
