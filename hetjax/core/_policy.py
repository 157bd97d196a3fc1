"""Policies as values, the Optax way: ``init() -> state``, ``update(state, stats) -> (decision,
state)``.

A policy object holds only its settings; everything it learns lives in the state it returns,
a pytree of arrays and Python scalars whose *structure* never changes (no field that starts as
None and later holds an array: use an empty array instead). That is what lets the loop save the
state in every checkpoint (`encode_state` / `decode_state`) and a resumed run continue with the
shares and predictor history it had, and what lets the real run and the virtual clock feed one
policy the same way.

``update(state, None)`` is asked before the first step of a run segment (a fresh start or a
resume): it returns the decision in force without learning anything.

Example::

  policy = balance.LBBSP(rules, balance.EWMA())
  state = policy.init()
  shares, state = policy.update(state, None)        # step 0: uniform
  for t in range(steps):
    stats = run_step(t, shares)
    shares, state = policy.update(state, stats)     # the shares of step t + 1
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

from hetjax.core._stats import StepStats

State = TypeVar('State')
Decision = TypeVar('Decision', covariant=True)


@runtime_checkable
class Policy(Protocol[Decision]):
  """Decides each step from the steps before it; its learning lives in the returned state."""

  @property
  def name(self) -> str: ...

  def init(self) -> Any: ...

  def update(self, state: Any, stats: StepStats | None) -> tuple[Decision, Any]: ...
