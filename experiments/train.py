"""Trains a config — shipped, a file of yours, or ``module:function`` — in any mode.

The same program as the ``hetjax-train`` console entry (`hetjax.cli.train`); its flags and modes
are documented there (``--help`` lists them):

  python experiments/train.py --config=wide_deep --strategy=hybrid --mesh=4x2 \\
      --jax_num_cpu_devices=8 --steps=100 --workdir=runs/wd
  python -m hetjax.launch --workers 4 --slowdown static:1,1,1,3 -- \\
      python experiments/train.py --config=mlp --mesh=1x1 --policy=lbbsp --workdir=runs/bsp
"""

from __future__ import annotations

from hetjax.cli import train

if __name__ == '__main__':
  train.main()
