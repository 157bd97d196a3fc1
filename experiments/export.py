"""Writes a trained ``llama`` run as a Hugging Face model directory (`hetjax.run.save_hf`).

The same program as the ``hetjax-export`` console entry (`hetjax.cli.export`); its flags are
documented there (``--help`` lists them).
"""

from __future__ import annotations

from hetjax.cli import export

if __name__ == '__main__':
  export.main()
