"""Command-line entry points: ``hetjax-train``, ``hetjax-plan`` (and ``hetjax-report``, in
`hetjax.report`), and `run_main`, how each of them (and the benchmarks) runs as an absl program:
bad input is one line and exit 2."""

from hetjax.cli._main import fail as fail
from hetjax.cli._main import run_main as run_main

__all__ = ['fail', 'run_main']
