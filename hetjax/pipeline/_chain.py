"""`HasChain`: a model written as a chain of links, each one a sub-model and the step it runs.

A pipeline cuts a model between sub-models, so it needs more than the model's ``__call__``: the
order of the parts, what flows between them and which parameters each one owns. A model says so
with two methods:

* ``chain()`` returns its `Link`s in forward order. Link i runs
  ``carry = link.apply(link.module, carry, batch)``: the first link gets ``carry=None`` and reads
  the batch; every carry after it is a pytree of float arrays whose leading dimension is the
  batch's (the executor splits it over a stage's devices and sends it to the next stage).
* ``chain_loss(carry, batch)`` turns the last link's carry into the per-example losses
  (``float32[B]``), exactly what the task's ``loss(model, batch)`` returns. It must not read
  parameters: every parameter belongs to exactly one link's module.

``apply`` receives the module to use (the executor rebuilds it from a stage's parameters), so it
must be a plain function of its arguments, never a closure over the model. The model's own
``__call__`` and loss stay as they are; the chain is a second view of the same computation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import jax
from flax import nnx, traverse_util

from hetjax._errors import ConfigError

PyTree = Any
Batch = Mapping[str, Any]
Path = tuple[Any, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Link:
  """One step of a model's chain.

  Attributes:
    name: the sub-model's name (the model's ``submodels()`` key when it has one, e.g.
      ``'block_0'``); it also scopes the link's activation constraints.
    module: the sub-model; it owns the link's parameters and no other link's.
    apply: ``apply(module, carry, batch) -> carry``; the first link gets ``carry=None``.
  """

  name: str
  module: nnx.Module
  apply: Callable[[nnx.Module, Any, Batch], Any]


@runtime_checkable
class HasChain(Protocol):
  """A model that can be run link by link (see the module docstring for the contract)."""

  def chain(self) -> tuple[Link, ...]:
    """The links in forward order; together they own every parameter exactly once."""
    ...

  def chain_loss(self, carry: PyTree, batch: Batch) -> jax.Array:
    """Per-example losses ``float32[B]`` from the last link's carry (reads no parameters)."""
    ...


def check_chain(model: nnx.Module) -> tuple[tuple[Link, ...], tuple[Path, ...]]:
  """The model's links and the path of each link's module in the model's graph.

  The paths say where a link's parameters sit in ``nnx.to_pure_dict(nnx.state(model))``, e.g.
  ``('blocks', 0)`` for the transformer's ``'block_0'``.

  Raises:
    ConfigError: if the model has no chain, names repeat, a link's module is not part of the
      model, or the links do not own every parameter exactly once.
  """
  if not isinstance(model, HasChain):
    raise ConfigError(f'{type(model).__name__} has no chain() and chain_loss(), so it cannot be '
                      'pipelined')
  links = tuple(model.chain())
  if not links:
    raise ConfigError(f'{type(model).__name__}.chain() returned no links')
  names = [link.name for link in links]
  if len(set(names)) != len(names):
    raise ConfigError(f'{type(model).__name__}.chain() repeats link names: {names}')
  found = {id(node): path for path, node in nnx.iter_graph(model)}
  paths = []
  for link in links:
    if id(link.module) not in found:
      raise ConfigError(f'link {link.name!r} is not a sub-module of {type(model).__name__}')
    paths.append(tuple(found[id(link.module)]))
  owned = sum(len(_flat(nnx.to_pure_dict(nnx.state(link.module)))) for link in links)
  every = _flat(nnx.to_pure_dict(nnx.state(model)))
  uncovered = [k for k in every if not any(k[:len(p)] == p for p in paths)]
  if uncovered or owned != len(every):
    where = f'parameter {"/".join(map(str, uncovered[0]))} is in no link' if uncovered else (
        f'links own {owned} parameters, the model has {len(every)} (links overlap or share)')
    raise ConfigError(f'{type(model).__name__}.chain() does not partition the parameters: {where}')
  return links, tuple(paths)


def assemble(trees: Mapping[str, PyTree], paths: Mapping[str, Path]) -> dict:
  """The model's nested pure dict from one pure dict per link (placed at the link's path)."""
  flat = {}
  for name, tree in trees.items():
    flat.update({paths[name] + key: leaf for key, leaf in _flat(tree).items()})
  return traverse_util.unflatten_dict(flat)


def _flat(tree: dict) -> dict[Path, Any]:
  return traverse_util.flatten_dict(tree) if tree else {}
