"""Makes a token dataset from a folder of text files (`hetjax.data.prepare_text`), offline.

The same program as the ``hetjax-prepare-text`` console entry (`hetjax.cli.prepare_text`); its flags are
documented there (``--help`` lists them).
"""

from __future__ import annotations

from hetjax.cli import prepare_text

if __name__ == '__main__':
  prepare_text.main()
