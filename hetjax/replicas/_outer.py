"""Local SGD (DiLoCo) over pipeline replicas: an outer step at each round's end.

Under local SGD (``steps_per_round`` H, ``local.inner_steps``) the replicas sync on the
periodic-average schedule, every H steps (`hetjax.replicas.SyncPolicy` ``'periodic-average'``
with ``every`` H), and a stage's group mean θ̄ is not taken as the new parameters: it makes the
round's outer step, as `hetjax.train.LocalTrainer` does under mode shares,

    θ ← outer(θ_start, θ_start − θ̄)          θ_start ← θ

where θ_start is the stage's parameters at the round's start, which the replica keeps. Every
replica trains the same rows a step, so the plain mean θ̄ is the rows-weighted one. Every
replica applies the same outer step to the same θ_start and θ̄, so after it they agree again,
the outer optimizer's state included (a replica dropped from a round by the scheduler's
time-out steps from its own parameters alone, and drifts, as under periodic averaging).
Outer SGD at rate 1 is periodic averaging itself: θ_start − (θ_start − θ̄) = θ̄, up to the
rounding of the subtraction.

**State.** `LocalReplicaState` is a `hetjax.pipeline.PipelineState` with each stage's outer
optimizer state (``outer``), so a replica's checkpoint (`hetjax.replicas.ReplicaCheckpointer`)
saves and restores it with the rest. θ_start is not saved: the run's steps and checkpoints fall
on a round's end, where θ_start is the parameters themselves, and a resume starts its first
round from the restored parameters (`OuterSteps.begin` refuses a start inside a round).

Example (what `hetjax.replicas.ReplicaDriver` does with ``outer=`` and ``steps_per_round=``)::

  rounds = OuterSteps(trainer, optax.sgd(0.7, momentum=0.9, nesterov=True), steps_per_round=4)
  state = rounds.init(trainer.init_state())
  rounds.begin(state)                     # at a round's start: keeps θ_start
  ...                                     # 4 steps, the last one's parameters averaged
  state = rounds.apply(state)             # at its end: the outer step
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from hetjax._checks import positive_int
from hetjax._errors import ConfigError
from hetjax.pipeline import PipelineState, PipelineTrainer

PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LocalReplicaState(PipelineState):
  """A replica's state under local SGD: its pipeline's, and the outer optimizer's.

  Attributes:
    outer: per stage, the outer optimizer's state of that stage's parameters, on the stage's
      devices (the same in every replica).
  """

  outer: tuple[PyTree, ...] = ()


class OuterSteps:
  """The outer steps of local SGD over one replica's stages (module docstring).

  Args:
    trainer: the replica's pipeline (its stages' meshes).
    outer: the outer optimizer, an optax transformation of the pseudo-gradient
      (`hetjax.train.outer_optimizer`).
    steps_per_round: H, the steps between outer steps.

  Raises:
    ConfigError: a ``steps_per_round`` that is not a positive integer.
  """

  def __init__(self, trainer: PipelineTrainer, outer: optax.GradientTransformation,
               steps_per_round: int):
    self.outer = outer
    self.steps_per_round = positive_int(steps_per_round, 'steps_per_round')
    self.meshes = trainer.meshes
    self._start: tuple[PyTree, ...] | None = None  # θ_start, per stage, of the round under way
    self._programs: dict[int, Any] = {}

  def _outer_shardings(self, stage: int, params: PyTree) -> PyTree:
    """The outer state's shardings: a parameter's own for its leaves (optax's
    ``tree_map_params``), replicated on the stage's mesh for the others (counts)."""
    abstract = jax.eval_shape(self.outer.init, params)
    replicated = NamedSharding(self.meshes[stage], PartitionSpec())
    return optax.tree_map_params(
        self.outer, lambda _, sharding: sharding, abstract,
        jax.tree.map(lambda a: a.sharding, params),
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))

  def init(self, state: PipelineState) -> LocalReplicaState:
    """``state`` with a fresh outer optimizer state for each stage."""
    outer = tuple(jax.jit(self.outer.init, out_shardings=self._outer_shardings(s, p))(p)
                  for s, p in enumerate(state.params))
    return LocalReplicaState(state.step, state.params, state.opt_state, outer)

  def abstract(self, state: PipelineState) -> LocalReplicaState:
    """``state`` (abstract: shapes, dtypes, shardings) with its outer state's, a restore
    target."""
    outer = tuple(jax.tree.map(lambda a, sharding: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                                         sharding=sharding),
                               jax.eval_shape(self.outer.init, p), self._outer_shardings(s, p))
                  for s, p in enumerate(state.params))
    return LocalReplicaState(state.step, state.params, state.opt_state, outer)

  def begin(self, state: LocalReplicaState) -> None:
    """Before a step: at a round's start, keeps a copy of ``state``'s parameters (θ_start;
    the step donates its own).

    Raises:
      ConfigError: the first step of a run inside a round (no θ_start to step from).
    """
    if state.step % self.steps_per_round == 0:
      self._start = jax.tree.map(jnp.copy, state.params)
    elif self._start is None:
      raise ConfigError(f'local SGD resumes at a round\'s start: step {state.step} is not a '
                        f'multiple of local.inner_steps {self.steps_per_round}')

  def ends(self, step: int) -> bool:
    """Whether step ``step`` (the steps taken after it) ends a round."""
    return step % self.steps_per_round == 0

  def apply(self, state: LocalReplicaState) -> LocalReplicaState:
    """At a round's end, once ``state``'s parameters are the round's mean θ̄: every stage's
    outer step from θ_start."""
    params, outer = [], []
    for s, (start, mean, opt_state) in enumerate(zip(self._start, state.params, state.outer,
                                                     strict=True)):
      p, o = self._program(s, mean)(start, mean, opt_state)
      params.append(p)
      outer.append(o)
    self._start = None
    return dataclasses.replace(state, params=tuple(params), outer=tuple(outer))

  def warm_up(self, state: LocalReplicaState) -> None:
    """Compiles and runs each stage's outer step once, on ``state`` (which it leaves as is)."""
    for s, (p, o) in enumerate(zip(state.params, state.outer, strict=True)):
      jax.block_until_ready(self._program(s, p)(p, p, o))

  def _program(self, stage: int, params: PyTree):
    if stage not in self._programs:
      shardings = jax.tree.map(lambda a: a.sharding, params)
      self._programs[stage] = jax.jit(
          self._update, out_shardings=(shardings, self._outer_shardings(stage, params)))
    return self._programs[stage]

  def _update(self, start: PyTree, mean: PyTree, opt_state: PyTree) -> tuple[PyTree, PyTree]:
    """θ_start stepped by the outer optimizer along the pseudo-gradient θ_start − θ̄ (taken
    in float32)."""
    delta = jax.tree.map(lambda a, b: (a.astype(jnp.float32) - b.astype(jnp.float32)
                                       ).astype(a.dtype), start, mean)
    updates, opt_state = self.outer.update(delta, opt_state, start)
    return optax.apply_updates(start, updates), opt_state
