"""Evaluates a finished run's model on its held-out split (`hetjax.run.evaluate`).

The same program as the ``hetjax-evaluate`` console entry (`hetjax.cli.evaluate`); its flags are
documented there (``--help`` lists them).
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ''):  # run as a script from a checkout: its packages first
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hetjax.cli import evaluate

if __name__ == '__main__':
  evaluate.main()
