"""Evaluates a finished run's model on its held-out split (`hetjax.run.evaluate`).

The same program as the ``hetjax-evaluate`` console entry (`hetjax.cli.evaluate`); its flags are
documented there (``--help`` lists them).
"""

from __future__ import annotations

from hetjax.cli import evaluate

if __name__ == '__main__':
  evaluate.main()
