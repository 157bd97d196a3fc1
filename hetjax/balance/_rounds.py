"""`RoundPolicy`: a share policy consulted once a round of local SGD (`hetjax.train.LocalTrainer`).

Local SGD exchanges nothing between its outer steps, so no worker learns the others' times
inside a round, and a decision made there would differ from worker to worker. The round's
shares are held for all of its steps, and the policy learns from the round's last step only:
the outer exchange's `StepStats`, whose rows and busy times are each worker's means per inner
step over the round, the same numbers a BSP step gives it. With ``steps_per_round`` 1 it is the
policy itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from hetjax.balance._policy import shares_array, shares_of
from hetjax.core import Policy, StepStats


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundState:
  """The wrapped policy's state and the round's shares (int64, one a worker)."""

  inner: Any
  shares: np.ndarray


@dataclasses.dataclass(frozen=True)
class RoundPolicy:
  """Holds ``policy``'s shares for ``steps_per_round`` steps; it learns at each round's end, or
  ``offset`` steps later where the round's exchange lands then (``local.overlap_steps``).

  Example::

    policy = RoundPolicy(make_policy('lbbsp', ShareRules(256, 4, 16)), steps_per_round=50)
  """

  policy: Policy
  steps_per_round: int
  offset: int = 0

  @property
  def name(self) -> str:
    return self.policy.name

  @property
  def rules(self):
    return self.policy.rules

  def init(self) -> RoundState:
    return RoundState(self.policy.init(), np.zeros(self.policy.rules.workers, np.int64))

  def update(self, state: RoundState, stats: StepStats | None):
    if stats is not None and not self._closes_a_round(stats.step):
      return shares_of(state.shares, self.policy.rules), state
    shares, inner = self.policy.update(state.inner, stats)
    return shares, RoundState(inner, shares_array(shares))

  def _closes_a_round(self, step: int) -> bool:
    """Whether step ``step``'s stats carry a round's exchange: its last step, or with
    ``offset`` (an exchange that lands that many steps into the next round) the step it lands
    at, from the second round on."""
    done = step + 1 - self.offset
    return done > 0 and done % self.steps_per_round == 0
