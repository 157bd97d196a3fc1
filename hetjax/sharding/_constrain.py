"""Activation sharding constraints written with logical names.

Models call `constrain(x, ('batch', None, 'embed'))`; the trainer decides what that means by
tracing the model inside `activation_rules(mesh, rules)`. Outside such a context (a model used on
its own, a single device) `constrain` returns its input unchanged. A model marks where each of
its sub-models runs with `scope('tower')`, so a plan can lay out each sub-model differently
(`LogicalRules.scopes`); without scoped rules, a scope changes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import Mesh, NamedSharding

from hetjax.sharding._rules import LogicalRules

_SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar('hetjax_scope', default=None)
_ACTIVE: contextvars.ContextVar[tuple[Mesh, LogicalRules] | None] = contextvars.ContextVar(
    'hetjax_activation_rules', default=None)


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules: LogicalRules) -> Iterator[None]:
  """Makes `constrain` map logical names with ``rules`` onto ``mesh`` while tracing."""
  token = _ACTIVE.set((mesh, rules))
  try:
    yield
  finally:
    _ACTIVE.reset(token)


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
  """Marks the code inside as sub-model ``name`` (a key of the model's ``submodels()``).

  Example::

    def __call__(self, ids, dense):
      with scope('embedding'):
        emb = self.embedding(ids)
      ...
  """
  token = _SCOPE.set(name)
  try:
    yield
  finally:
    _SCOPE.reset(token)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Constrains ``x``'s sharding by the logical names of its dimensions (no-op without rules)."""
  active = _ACTIVE.get()
  if active is None:
    return x
  mesh, rules = active
  rules = rules.in_scope(_SCOPE.get())
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, rules.spec_for(names, x.shape,
                                                                               mesh)))
