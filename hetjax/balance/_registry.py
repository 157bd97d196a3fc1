"""Balance policies by name, as ``--balance`` flags and benchmark tables spell them, and what
each name means to a reader (`describe_policy`).

Example::

  >>> rules = ShareRules(global_batch=4096, workers=4, bucket=64)
  >>> make_policy('lbbsp-ar', rules).name
  'lbbsp-ar'
  >>> describe_policy('lbbsp-ar')
  "lbbsp-ar (LB-BSP: each worker's speed predicted by an autoregressive model of its recent speeds)"
"""

from __future__ import annotations

import enum

from hetjax._errors import ConfigError, parse_choice
from hetjax.balance._gpu import LBBSPGpu
from hetjax.balance._known_costs import KnownCosts
from hetjax.balance._lbbsp import LBBSP
from hetjax.balance._narx import NARX
from hetjax.balance._policy import BalancePolicy
from hetjax.balance._predictors import AR, EWMA, LastValue
from hetjax.balance._regime import Regime
from hetjax.balance._simple import Oracle, Proportional, Uniform
from hetjax.core import ShareRules
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


#: What a policy's name means, in words: a policy's ``name`` (`describe_policy`), as a run's
#: ``run.json`` and the report give it. ``lbbsp`` runs as ``lbbsp-ewma``: LB-BSP with its
#: default predictor. ``fixed`` is `Fixed` (``balance.shares``), which has no `PolicyName`.
_MEANINGS = {
    PolicyName.UNIFORM.value: 'plain BSP: equal shares every step',
    'fixed': 'the shares balance.shares gives, every step',
    PolicyName.PROPORTIONAL.value: "shares in proportion to each worker's speed at the last step",
    PolicyName.ORACLE.value: ("each step's best shares from every worker's true speed in the "
                              'slowdown trace: a bound for benchmarks'),
    PolicyName.LBBSP.value: ("LB-BSP: each worker's speed predicted by an exponentially "
                             'weighted moving average'),
    PolicyName.LBBSP_LAST.value: "LB-BSP: each worker's speed predicted by its last one",
    PolicyName.LBBSP_EWMA.value: ("LB-BSP: each worker's speed predicted by an exponentially "
                                  'weighted moving average'),
    PolicyName.LBBSP_AR.value: ("LB-BSP: each worker's speed predicted by an autoregressive "
                                'model of its recent speeds'),
    PolicyName.LBBSP_NARX.value: ("LB-BSP: each worker's speed predicted by a small recurrent "
                                  'network of its recent speeds and host load (NARX)'),
    PolicyName.LBBSP_REGIME.value: ("LB-BSP: each worker's speed predicted by a learned model "
                                    'of the speed levels it switches between'),
    PolicyName.LBBSP_GPU.value: ("LB-BSP's GPU mode: a time curve fitted per worker, finish "
                                 'times equalised, within memory caps'),
}


def describe_policy(name: str) -> str:
  """A policy's name and, in brackets, what it means: for lines people read (the report's
  header, the run's start-up line); files and JSON keep the short name. A name this module
  does not know (a policy of your own) comes back as it is.

  Example::

    describe_policy('lbbsp-ewma')
    # "lbbsp-ewma (LB-BSP: each worker's speed predicted by an exponentially weighted moving
    # average)"
  """
  meaning = _MEANINGS.get(name)
  return name if meaning is None else f'{name} ({meaning})'


_PREDICTORS = {PolicyName.LBBSP: EWMA, PolicyName.LBBSP_LAST: LastValue,
               PolicyName.LBBSP_EWMA: EWMA, PolicyName.LBBSP_AR: AR, PolicyName.LBBSP_NARX: NARX,
               PolicyName.LBBSP_REGIME: Regime}


def make_policy(name: str | PolicyName, rules: ShareRules, trace: SlowdownTrace | None = None,
                known: KnownCosts | None = None) -> BalancePolicy:
  """A policy from its name, with default settings; ``policy.init()`` is its untrained state.

  What is known in advance reaches the policies that use it through their constructors:
  'oracle' plans from every worker's costs (``known.worker_row_s()``, ``fixed_s``,
  ``transfer_s``), LB-BSP (every 'lbbsp-…' but the GPU mode) starts φ at
  ``known.fixed_fraction(rules)`` and balances each worker's ``transfer_s``; the others learn
  everything from the steps.

  Example: the oracle of hosts of 1 ms a row and 5 ms a step::

    policy = make_policy('oracle', rules, trace, KnownCosts(row_s=1e-3, fixed_s=5e-3))

  Args:
    name: one of `PolicyName`'s values, e.g. 'uniform' or 'lbbsp-narx'.
    rules: the job's share rules.
    trace: the run's slowdown trace; only 'oracle' uses it, and needs it.
    known: what the hosts and links are known to cost (None: nothing; the oracle then plans
      from the trace alone, at one second a row).

  Raises:
    ConfigError: an unknown name (the message lists the known ones), or 'oracle' without a
      trace.
  """
  choice = parse_choice(PolicyName, name, 'balance policy')
  known = known or KnownCosts()
  if choice is PolicyName.UNIFORM:
    return Uniform(rules)
  if choice is PolicyName.PROPORTIONAL:
    return Proportional(rules)
  if choice is PolicyName.ORACLE:
    if trace is None:
      raise ConfigError("balance policy 'oracle' needs the slowdown trace (it benchmarks "
                        'against known slowdowns)')
    row_s = known.worker_row_s()
    return Oracle(rules, trace, row_s=1.0 if row_s is None else row_s, fixed_s=known.fixed_s,
                  transfer_s=known.transfer_s)
  if choice is PolicyName.LBBSP_GPU:
    return LBBSPGpu(rules)
  return LBBSP(rules, _PREDICTORS[choice](), transfer_s=known.transfer_s,
               fixed_fraction=known.fixed_fraction(rules))
