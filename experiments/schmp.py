"""Trains a SchMP app (scheduled model parallelism): ``hetjax-train`` with the app's config.

The same program as the ``hetjax-schmp`` console entry (`hetjax.cli.schmp`); its flags are
documented there (``--help`` lists them).
"""

from __future__ import annotations

from hetjax.cli import schmp

if __name__ == '__main__':
  schmp.main()
