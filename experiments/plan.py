"""Plans a config's model on a cluster and prints the plan as a table, without training.

The same program as the ``hetjax-plan`` console entry (`hetjax.cli.plan`, where its flags are
documented; ``--help`` lists them):

  python experiments/plan.py --config=wide_deep                       # this machine, measured
  python experiments/plan.py --config=transformer --cluster=cluster.json --json=plan.json
"""

from __future__ import annotations

from hetjax.cli import plan

if __name__ == '__main__':
  plan.main()
