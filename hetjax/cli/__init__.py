"""Command-line entry points: ``hetjax-train``, ``hetjax-plan``, ``hetjax-prepare-text``,
``hetjax-evaluate``, ``hetjax-schmp`` (and ``hetjax-report``, in `hetjax.report`), and
`run_main`, how each of them (and the benchmarks) runs as an absl program: bad input is one line
and exit 2.

One console entry a command rather than one ``hetjax`` command with subcommands: each is an absl
program whose flags are its own (``--help`` lists only them), the README's commands keep their
names, and a script under ``experiments/`` is the same program run from a checkout."""

from hetjax.cli._main import fail as fail
from hetjax.cli._main import run_main as run_main

__all__ = ['fail', 'run_main']
