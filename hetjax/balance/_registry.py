"""Balance policies by name, as ``--balance`` flags and benchmark tables spell them.

Example::

  >>> rules = ShareRules(global_batch=4096, workers=4, bucket=64)
  >>> make_policy('lbbsp-ar', rules).name
  'lbbsp-ar'
"""

from __future__ import annotations

import enum

from hetjax._errors import ConfigError, parse_choice
from hetjax.balance._gpu import LBBSPGpu
from hetjax.balance._lbbsp import LBBSP
from hetjax.balance._narx import NARX
from hetjax.balance._policy import BalancePolicy
from hetjax.balance._predictors import AR, EWMA, LastValue
from hetjax.balance._regime import Regime
from hetjax.balance._simple import Oracle, Proportional, Uniform
from hetjax.core._shares import ShareRules
from hetjax.emulation import SlowdownTrace


class PolicyName(enum.Enum):
  """The policies `make_policy` knows; 'lbbsp' is LB-BSP with its default (EWMA) predictor,
  'lbbsp-gpu' LB-BSP's GPU mode (a fitted time curve per worker, water-filling, memory caps),
  'lbbsp-regime' LB-BSP on a learned regime-switching model of each worker (`Regime`)."""

  UNIFORM = 'uniform'
  PROPORTIONAL = 'proportional'
  ORACLE = 'oracle'
  LBBSP = 'lbbsp'
  LBBSP_LAST = 'lbbsp-last'
  LBBSP_EWMA = 'lbbsp-ewma'
  LBBSP_AR = 'lbbsp-ar'
  LBBSP_NARX = 'lbbsp-narx'
  LBBSP_REGIME = 'lbbsp-regime'
  LBBSP_GPU = 'lbbsp-gpu'


_PREDICTORS = {PolicyName.LBBSP: EWMA, PolicyName.LBBSP_LAST: LastValue,
               PolicyName.LBBSP_EWMA: EWMA, PolicyName.LBBSP_AR: AR, PolicyName.LBBSP_NARX: NARX,
               PolicyName.LBBSP_REGIME: Regime}


def make_policy(name: str | PolicyName, rules: ShareRules,
                trace: SlowdownTrace | None = None) -> BalancePolicy:
  """A policy from its name, with default settings; ``policy.init()`` is its untrained state.

  Args:
    name: one of `PolicyName`'s values, e.g. 'uniform' or 'lbbsp-narx'.
    rules: the job's share rules.
    trace: the run's slowdown trace; only 'oracle' uses it, and needs it.

  Raises:
    ConfigError: an unknown name (the message lists the known ones), or 'oracle' without a
      trace.
  """
  choice = parse_choice(PolicyName, name, 'balance policy')
  if choice is PolicyName.UNIFORM:
    return Uniform(rules)
  if choice is PolicyName.PROPORTIONAL:
    return Proportional(rules)
  if choice is PolicyName.ORACLE:
    if trace is None:
      raise ConfigError("balance policy 'oracle' needs the slowdown trace (it benchmarks "
                        'against known slowdowns)')
    return Oracle(rules, trace)
  if choice is PolicyName.LBBSP_GPU:
    return LBBSPGpu(rules)
  return LBBSP(rules, _PREDICTORS[choice]())
