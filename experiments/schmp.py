"""Trains a SchMP app (scheduled model parallelism): ``hetjax-train`` with the app's config.

The same program as the ``hetjax-schmp`` console entry (`hetjax.cli.schmp`); its flags are
documented there (``--help`` lists them).
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ''):  # run as a script from a checkout: its packages first
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hetjax.cli import schmp

if __name__ == '__main__':
  schmp.main()
