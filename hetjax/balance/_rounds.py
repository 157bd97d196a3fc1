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
  """Holds ``policy``'s shares for ``steps_per_round`` steps; it learns at each round's end.

  Example::

    policy = RoundPolicy(make_policy('lbbsp', ShareRules(256, 4, 16)), steps_per_round=50)
  """

  policy: Policy
  steps_per_round: int

  @property
  def name(self) -> str:
    return self.policy.name

  @property
  def rules(self):
    return self.policy.rules

  def init(self) -> RoundState:
    return RoundState(self.policy.init(), np.zeros(self.policy.rules.workers, np.int64))

  def update(self, state: RoundState, stats: StepStats | None):
    if stats is not None and (stats.step + 1) % self.steps_per_round:
      return shares_of(state.shares, self.policy.rules), state
    shares, inner = self.policy.update(state.inner, stats)
    return shares, RoundState(inner, shares_array(shares))
