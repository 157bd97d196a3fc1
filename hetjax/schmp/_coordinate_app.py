"""`CoordinateApp`: what the coordinate-descent apps (Lasso, L1 logistic regression, the SVM's
dual) share, and `PrimalCoordinateApp`: the round of the two whose coordinates are features.

Every coordinate app keeps its data's rows split evenly over the devices, picks coordinates
with the schedulers below, and avoids picking dependent ones by a correlation: of columns for
the primal apps, of rows for the SVM's dual (`CoordinateApp.correlations`, from the unit
vectors of the blocks, `block_vectors`). The primal apps (Lasso, L1 logistic regression) keep
β (d coefficients, one schedulable block each) replicated on every device and one float per
row sharded with the rows (Lasso: the residual y − Xβ; logistic regression: the
margin Xβ), so that a round needs only the picked columns of each device's own rows and one
`lax.psum` of two numbers per picked coordinate. The round is the same for both: for the
picked coordinates J,

  1. each device computes over its rows the loss's partial derivative gⱼ and a curvature hⱼ
     (a quadratic in βⱼ with this curvature lies on or above the loss along coordinate j);
     one `lax.psum` of the [2, |J|] array adds them over the devices;
  2. every device takes the same proximal coordinate step from the same β,
       βⱼ ← S(βⱼ hⱼ − gⱼ, λ) / hⱼ,   S(a, λ) = sign(a) max(|a| − λ, 0)
     (the minimiser of that quadratic plus λ|βⱼ|; 0 for an all-zero column, hⱼ = 0), so
     Δβ_J is replicated, and masked slots move nothing;
  3. each device updates its per-row state from Δβ_J (X_J Δβ_J of its rows).
  4. with SchMP's ``priority='current'`` (the default), every device computes gⱼ and hⱼ of
     every coordinate at the new state, one more `lax.psum` adds them, and the round reports
     |Δβⱼ| of the step each coordinate would take now (`RoundInfo.priority`): the dynamic
     scheduler's weights.

Every coordinate app shares the data (a `SparseDesign`, its rows split evenly over the
devices), the correlations the dynamic scheduler asks for, and the scheduler by name:

* ``'schmp'``: `DynamicScheduler` (priorities + dependency check);
* ``'shotgun'``: `Shotgun` (P uniform coordinates, no check);
* ``'cyclic'``: `Cyclic` (one coordinate a round, in order: sequential coordinate descent).

A primal subclass writes step 1's partial sums and step 3's update, the objective (on the
devices and, in float64, on the host) and the scikit-learn reference.

Example::

  app = make_lasso('shotgun', data='diabetes')
  program = SchmpProgram(app, app.default_schedule_size(2), jax.devices()[:2])
  policy = app.policy(program.schedule_size, seed=0)        # a Shotgun
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from hetjax._errors import ConfigError, parse_choice
from hetjax.data import (
    Response,
    SparseDesign,
    bundled_design,
    correlated_design,
    is_data_path,
    read_design,
)
from hetjax.schmp._cyclic import Cyclic
from hetjax.schmp._dynamic import DynamicScheduler, Priority
from hetjax.schmp._shotgun import Shotgun

PyTree = Any
#: the bundled data set of each kind of response
_BUNDLED = {Response.LINEAR: 'diabetes', Response.LOGISTIC: 'breast_cancer'}
#: the schedule size of the parallel schedulers when the config leaves it automatic (STRADS's)
DEFAULT_SCHEDULE_SIZE = 32


class CoordinateScheduler(enum.Enum):
  """The schedulers a coordinate-descent app runs with (module docstring)."""

  SCHMP = 'schmp'
  SHOTGUN = 'shotgun'
  CYCLIC = 'cyclic'


@dataclasses.dataclass(frozen=True)
class DynamicOptions:
  """`DynamicScheduler`'s settings, as an app is made with them (its docstring says what each
  does); the other schedulers ignore them."""

  theta: float = 0.1
  warmup: int | None = None
  candidates: int | None = None
  epsilon: float = 1e-4
  priority: str = Priority.CURRENT.value
  eta: float = 0.0

  def __post_init__(self):  # checked now, not when the first policy is made
    object.__setattr__(self, 'priority', parse_choice(Priority, self.priority, 'priority').value)
    if self.warmup is None:
      object.__setattr__(self, 'warmup', 0 if self.priority == Priority.CURRENT.value else 10)
    DynamicScheduler(1, 1, lambda b: np.zeros((b.size, b.size)), **self.settings())

  def settings(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def soft_threshold(a: jax.Array, lam: float) -> jax.Array:
  """S(a, λ) = sign(a) · max(|a| − λ, 0), the proximal step of λ|·|."""
  return jnp.sign(a) * jnp.maximum(jnp.abs(a) - lam, 0.0)


def coordinate_step(beta: jax.Array, grad: jax.Array, curv: jax.Array, lam: float
                    ) -> jax.Array:
  """argmin over b of g (b − β) + h (b − β)² / 2 + λ|b|, per coordinate: S(βh − g, λ) / h,
  and 0 where h = 0 (an all-zero column, whose loss is flat)."""
  safe = jnp.where(curv > 0, curv, 1.0)
  return jnp.where(curv > 0, soft_threshold(beta * curv - grad, lam) / safe, 0.0)


class CoordinateApp:
  """The shared part of a coordinate-descent `App` (module docstring): the data and its rows
  over the devices, the schedulers, the correlations, the scikit-learn reference.

  A subclass says what its blocks are (`blocks`, `block_vectors`) and writes the round, the
  objective and the reference solve.

  Attributes:
    design: the data.
    scheduler: its `CoordinateScheduler`'s name.
    options: the dynamic scheduler's settings.
    pad_rows: whether rows that do not divide over the devices are padded with zero rows.
    config: the arguments the app was made with (JSON), as resolved.
  """

  name: str

  def __init__(self, design: SparseDesign, scheduler: str, options: DynamicOptions,
               pad_rows: bool, config: dict):
    self.scheduler = parse_choice(CoordinateScheduler, scheduler, 'scheduler').value
    self.design, self.options, self.pad_rows, self.config = design, options, pad_rows, config
    self._reference: np.ndarray | None = None

  @property
  def blocks(self) -> int:
    raise NotImplementedError

  def block_vectors(self) -> np.ndarray:
    """float32[blocks, m]: the vector of each block whose |cosine| with another block's says
    how much updating them at once interferes (columns of X for the primal, rows for the dual)."""
    raise NotImplementedError

  # -- data and layout ---------------------------------------------------------------------------

  def host_data(self, shards: int) -> dict[str, np.ndarray]:
    """``{'x': float32[n, d], 'y': float32[n]}``, padded with zero rows to a multiple of
    ``shards`` if ``pad_rows``."""
    n = self.design.rows
    pad = -n % shards
    if pad and not self.pad_rows:
      raise ConfigError(f'app {self.name!r}: {n} rows do not divide over {shards} devices; '
                        'pad_rows=True pads them with zero rows, which change no update '
                        '(--set model_args.pad_rows=True)')
    if not pad:
      return {'x': self.design.x, 'y': self.design.y}
    return {'x': np.pad(self.design.x, ((0, pad), (0, 0))), 'y': np.pad(self.design.y, (0, pad))}

  def correlations(self, blocks: np.ndarray) -> np.ndarray:
    """|corr| of the blocks ``blocks`` pairwise (float32[c, c]; 0 for an all-zero vector),
    from unit-norm `block_vectors` kept row-major (a gather of c contiguous rows and one
    c × m × c product: several times cheaper than gathering X's columns)."""
    vectors = self._unit_vectors[np.asarray(blocks)]
    return np.abs(vectors @ vectors.T)

  @functools.cached_property
  def _unit_vectors(self) -> np.ndarray:
    """float32[blocks, m]: `block_vectors` scaled to unit norm (a zero one stays zero)."""
    vectors = np.ascontiguousarray(self.block_vectors())
    norms = np.sqrt(np.einsum('dn,dn->d', vectors, vectors, dtype=np.float64))
    return (vectors / np.where(norms > 0, norms, 1.0)[:, None]).astype(np.float32)

  # -- scheduling --------------------------------------------------------------------------------

  @property
  def reports_priority(self) -> bool:
    """Whether a round reports every coordinate's current priority: SchMP's scheduler with
    ``priority='current'`` (one more collective a round)."""
    return (self.scheduler == CoordinateScheduler.SCHMP.value
            and self.options.priority == Priority.CURRENT.value)

  def policy(self, schedule_size: int, seed: int) -> Any:
    """The scheduler named by ``scheduler`` for a program of ``schedule_size`` slots."""
    which = CoordinateScheduler(self.scheduler)
    if which is CoordinateScheduler.SCHMP:
      return DynamicScheduler(self.blocks, schedule_size, self.correlations, seed=seed,
                              **self.options.settings())
    if which is CoordinateScheduler.SHOTGUN:
      return Shotgun(self.blocks, schedule_size, seed=seed)
    return Cyclic(self.blocks, schedule_size)

  def default_schedule_size(self, devices: int) -> int:
    """1 for ``cyclic``; else STRADS's 32 (at most the blocks), whatever the device count."""
    del devices
    if self.scheduler == CoordinateScheduler.CYCLIC.value:
      return 1
    return min(self.blocks, DEFAULT_SCHEDULE_SIZE)

  # -- the reference ---------------------------------------------------------------------------

  def reference_coefficients(self) -> np.ndarray:
    """scikit-learn's solution of this problem (float64[d]), solved once."""
    if self._reference is None:
      self._reference = self._solve_reference()
    return self._reference

  def reference_objective(self) -> float:
    """This app's objective at scikit-learn's solution."""
    return self.objective_at(self.reference_coefficients())

  def objective_at(self, beta: np.ndarray) -> float:
    """The objective at the coefficients ``beta``, in float64 on the host."""
    raise NotImplementedError

  def _solve_reference(self) -> np.ndarray:
    raise NotImplementedError


class PrimalCoordinateApp(CoordinateApp):
  """The primal coordinate-descent apps' round (module docstring): β replicated, one float per
  row sharded with the rows; every device works on every picked coordinate, over its own rows.

  Attributes:
    lam: λ, the L1 penalty's weight (> 0).
  """

  row_state: str  # the name of the per-row parameter

  def __init__(self, design: SparseDesign, lam: float, scheduler: str,
               options: DynamicOptions, pad_rows: bool, config: dict):
    check_arguments(self.name, scheduler, lam)
    super().__init__(design, scheduler, options, pad_rows, config)
    self.lam = float(lam)

  @property
  def blocks(self) -> int:
    return self.design.features

  def block_vectors(self) -> np.ndarray:
    return self.design.x.T

  def param_specs(self, axis: str) -> PyTree:
    return {'beta': PartitionSpec(), self.row_state: PartitionSpec(axis)}

  # -- a round -----------------------------------------------------------------------------------

  def round(self, params, shard, blocks, mask, offset, key, axis):
    """One round on the coordinates ``blocks`` (module docstring): ``(params, Δβ per slot)``."""
    del offset, key
    beta, state = params['beta'], params[self.row_state]
    x = jnp.take(shard['x'], blocks, axis=1)                      # [rows, slots]
    sums = lax.psum(self.partial_sums(state, shard['y'], x), axis)
    old = beta[blocks]
    delta = jnp.where(mask, coordinate_step(old, sums[0], sums[1], self.lam) - old, 0.0)
    beta, state = beta.at[blocks].add(delta), self.moved(state, x, delta)
    params = {'beta': beta, self.row_state: state}
    if not self.reports_priority:
      return params, delta
    every = lax.psum(self.partial_sums(state, shard['y'], shard['x']), axis)
    would = coordinate_step(beta, every[0], every[1], self.lam) - beta
    return params, {'delta': delta, 'priority': jnp.abs(would)}

  def partial_sums(self, state: jax.Array, y: jax.Array, x: jax.Array) -> jax.Array:
    """[2, slots]: this device's rows' share of gⱼ and hⱼ for the columns ``x`` ([rows,
    slots]) at the per-row ``state``."""
    raise NotImplementedError

  def moved(self, state: jax.Array, x: jax.Array, delta: jax.Array) -> jax.Array:
    """The per-row state after β_J moved by ``delta``."""
    raise NotImplementedError


def check_arguments(app: str, scheduler: str, lam: float | None) -> str:
  """The scheduler's name, once it and λ (None: the app's default) are known good.

  Raises:
    ConfigError: an unknown scheduler, λ ≤ 0.
  """
  scheduler = parse_choice(CoordinateScheduler, scheduler, 'scheduler').value
  if lam is not None and not lam > 0:  # also NaN
    raise ConfigError(f'app {app!r}: lam must be > 0, got {lam}')
  return scheduler


def default_lam(app: str, lam_max: float) -> float:
  """λ_max / 10, the default λ (the app's module docstring says why).

  Raises:
    ConfigError: λ_max = 0 (Xᵀy = 0: β = 0 is optimal for every λ, so there is no scale to
      take a default from).
  """
  if not lam_max > 0:
    raise ConfigError(f'app {app!r}: Xᵀy is 0 on this data, so β = 0 is optimal for every λ '
                      'and λ has no default; give lam')
  return lam_max / 10


def make_design(response: Response, data: str, **design: Any) -> tuple[SparseDesign, dict]:
  """The design ``data`` names (``'synthetic'`` made from ``design``, `correlated_design`'s
  arguments with ``data_seed`` for its ``seed`` and None for its defaults, a bundled one, or
  the user's own file: a path ending ``.npz``, ``.csv`` or ``.npy``, read by
  `hetjax.data.read_design`) and its arguments as resolved (JSON).

  Raises:
    ConfigError: unknown data (each response has one bundled set: diabetes for ``LINEAR``,
      breast_cancer for ``LOGISTIC``), design arguments given for bundled data or a file, a
      file that does not read as a design, or what the design refuses.
  """
  if data not in ('synthetic', _BUNDLED[response]) and not is_data_path(data):
    raise ConfigError(f"unknown data {data!r}; choose one of: synthetic, {_BUNDLED[response]}, "
                      'or a .npz, .csv or .npy file')
  if data != 'synthetic':
    given = sorted(k for k, v in design.items() if v is not None)
    if given:
      what = 'a file' if is_data_path(data) else 'bundled'
      raise ConfigError(f'data {os.fspath(data)!r} is {what}: {", ".join(given)} apply to '
                        "data='synthetic' only")
    if is_data_path(data):
      return read_design(data, response), {'data': os.fspath(data)}
    return bundled_design(data), {'data': data}
  defaults = {k: p.default for k, p in inspect.signature(correlated_design).parameters.items()}
  defaults['data_seed'] = defaults.pop('seed')
  resolved = {k: defaults[k] if v is None else v for k, v in design.items()}
  arguments = {k: v for k, v in resolved.items() if k != 'data_seed'}
  design_ = correlated_design(response=response, seed=resolved['data_seed'], **arguments)
  return design_, {'data': data, **resolved}
