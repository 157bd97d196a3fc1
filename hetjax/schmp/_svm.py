"""`SVM`: a linear support vector machine, ½‖w‖² + C Σᵢ max(0, 1 − yᵢ wᵀxᵢ) with labels
yᵢ = ±1 and no intercept, by scheduled parallel dual coordinate descent.

The dual (liblinear's, Hsieh et al. 2008) is min over 0 ≤ α ≤ C of ½ αᵀQα − Σᵢ αᵢ with
Qᵢⱼ = yᵢyⱼ xᵢᵀxⱼ, and w = Σᵢ αᵢ yᵢ xᵢ. Its coordinates are the examples: the exact minimiser
along αᵢ, the others fixed, is

  αᵢ ← clip(αᵢ − (yᵢ wᵀxᵢ − 1) / Qᵢᵢ, 0, C),   w ← w + Δαᵢ yᵢ xᵢ

(a zero row, Qᵢᵢ = 0, stays put). The rows are split over the devices as for Lasso and each
device keeps the α of its rows (a parameter sharded by rows); w is replicated. A round's
slots name examples (global row ids): the device holding a slot's row takes its step from
the round's w (the others mask it), one `lax.psum` adds the picked rows' Σ Δαᵢ yᵢ xᵢ into
every device's w (d numbers) and a second the Δα of the slots, so Δα is replicated. Every
picked example steps from the same w, so examples whose rows point the same way
overshoot together, as Shotgun's correlated columns do.

Priorities and the dependency filter, as chosen and measured (numpy, float64, 32 slots,
rounds to 1e-3 relative of LinearSVC's primal objective):

* **Priority**: ``'current'`` (the default) has every round report, for every example, the
  step |clip(αᵢ − Gᵢ/Qᵢᵢ, 0, C) − αᵢ| it would take now (Gᵢ = yᵢ wᵀxᵢ − 1: the projected
  gradient over Qᵢᵢ; 0 for an example at a bound that the gradient pushes out of the box,
  which is what liblinear's shrinking leaves out). It costs one pass over each device's rows
  (Xw) and a psum of n numbers a round. STRADS's last |Δαᵢ| (``'abs'``) is cheap but
  poor here: on breast_cancer at C = 0.01 it needs 1241 rounds where ``'current'`` needs 99,
  and at C = 0.1 it is 3 % off after 1500 where ``'current'`` is there in 385 — an example
  just moved to a bound keeps a high weight and most examples sit at a bound.
* **Dependency**: two examples conflict when their rows are correlated, |xᵢᵀxⱼ| / (‖xᵢ‖‖xⱼ‖)
  ≥ θ: this is |Qᵢⱼ| / √(QᵢᵢQⱼⱼ), the dual's own coupling of αᵢ and αⱼ (the labels only flip
  signs), just as Lasso's column correlation is its Hessian's. The rows are not centred:
  the coupling is the raw inner product. With every accepted pair below θ the picked block
  of the normalised Q has its eigenvalues below 1 + (k − 1)θ (Gershgorin), so a parallel step
  of up to k = 1/θ + 1 examples still descends the dual: θ = 0.1 (STRADS's) guarantees it for
  up to 11 picks. The rows of a classification problem are far more correlated than a
  design's columns (the yᵢxᵢ of correctly classified examples share the separating
  direction): 87 % of breast_cancer's row pairs have |cos| ≥ 0.1, so a round accepts about 3
  of its 64 candidates. θ = 0.3 was faster where it worked (226 rounds against 385 on
  breast_cancer at C = 0.1; 471 against 875 on the default synthetic design at C = 0.01),
  θ = 0.5 failed on both (40 % and 90 % off after 1500 rounds) and no filter (θ = 1) on all;
  θ stays 0.1, the safe choice, and is a setting.
* **Baselines** are the coordinate apps' by the same names, since they are the same
  schedules on other coordinates: ``'shotgun'`` is unscheduled parallel dual coordinate
  descent (`Shotgun`: P examples drawn uniformly a round, no dependency check — what Bradley
  et al.'s Shotgun is, applied to the dual), ``'cyclic'`` one example a round in order
  (liblinear's solver without its random permutation and shrinking). At 32 slots Shotgun
  needed 585 rounds on breast_cancer at C = 0.1 (8 slots: not there after 1500), and on the
  default design at C = 0.01 1197 (8 slots: not there after 1500). The box keeps a dual
  iterate bounded: where Shotgun fails it oscillates rather than diverges.

The objective the run reports is the primal one at the current w, over the data's rows only (a
padding row, y = 0, would add C): it is not monotone (the dual is) and never below the
optimum. `reference_objective` is this objective at scikit-learn's ``LinearSVC(C,
loss='hinge', dual=True, fit_intercept=False)`` solution (tolerance 1e-10).

C defaults to 0.01: there the schedules reach 1e-3 of LinearSVC's objective on the default
design within a thousand rounds (SchMP 810 on one device), at C = 0.1 none had after 1500
(dual coordinate descent slows as C grows: more examples end inside the box). The synthetic
default is `hetjax.data.correlated_design` with a logistic
response on 1024 rows × 256 features in 8 groups of 32 (at ρ = 0.9): more rows than features,
so the classes are not separable (logreg's 1024 × 1024 is, and on separable data the dual's
primal objective crawls).

Example::

  >>> app = make_svm('cyclic', data='breast_cancer', pad_rows=True)
  >>> app.blocks, app.default_schedule_size(2), app.c
  (569, 1, 0.01)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from hetjax._errors import ConfigError
from hetjax.data import Response
from hetjax.schmp._coordinate_app import (
    CoordinateApp,
    DynamicOptions,
    check_arguments,
    make_design,
)

#: the synthetic design's defaults (module docstring)
SYNTHETIC = {'rows': 1024, 'features': 256, 'groups': 8, 'group_size': 32}


class SVM(CoordinateApp):
  """The linear SVM app (module docstring); made by `make_svm`.

  Attributes:
    c: C, the hinge loss's weight (> 0).
  """

  name = 'svm'

  def __init__(self, design, c: float, scheduler: str, options: DynamicOptions,
               pad_rows: bool, config: dict):
    super().__init__(design, scheduler, options, pad_rows, config)
    self.c = float(c)

  @property
  def blocks(self) -> int:
    """The examples: one dual coordinate each."""
    return self.design.rows

  def block_vectors(self) -> np.ndarray:
    return self.design.x

  def param_specs(self, axis: str):
    return {'w': PartitionSpec(), 'alpha': PartitionSpec(axis)}

  def init_params(self, data, axis):
    del axis
    return {'w': jnp.zeros(self.design.features, jnp.float32), 'alpha': jnp.zeros_like(data['y'])}

  # -- a round -----------------------------------------------------------------------------------

  def step(self, alpha: jax.Array, z: jax.Array, w: jax.Array) -> jax.Array:
    """α after the exact coordinate step of each example (rows of ``z``, each yᵢxᵢ) from
    ``w``: clip(αᵢ − (zᵢᵀw − 1) / ‖zᵢ‖², 0, C), and αᵢ where zᵢ = 0."""
    q = jnp.sum(z * z, axis=-1)
    safe = jnp.where(q > 0, q, 1.0)
    return jnp.where(q > 0, jnp.clip(alpha - (z @ w - 1.0) / safe, 0.0, self.c), alpha)

  def round(self, params, shard, blocks, mask, offset, key, axis):
    """One round on the examples ``blocks`` (module docstring): ``(params, Δα per slot)``."""
    del offset, key
    w, alpha = params['w'], params['alpha']
    rows = alpha.shape[0]
    local = blocks - lax.axis_index(axis) * rows
    own = mask & (local >= 0) & (local < rows)          # the slots whose rows are here
    at = jnp.clip(local, 0, rows - 1)
    z = shard['y'][at, None] * shard['x'][at]            # [slots, d]: yᵢxᵢ
    old = alpha[at]
    moved = jnp.where(own, self.step(old, z, w) - old, 0.0)
    w = w + lax.psum(moved @ z, axis)
    alpha = alpha.at[at].add(moved)
    params, delta = {'w': w, 'alpha': alpha}, lax.psum(moved, axis)
    if not self.reports_priority:
      return params, delta
    every = shard['y'][:, None] * shard['x']
    would = jnp.abs(self.step(alpha, every, w) - alpha)
    # Every device's rows in place, zeros elsewhere: the psum is exact (one term per entry)
    # and, unlike an all-gather, replicated by type.
    placed = lax.dynamic_update_slice(jnp.zeros(rows * lax.axis_size(axis), would.dtype), would,
                                      (lax.axis_index(axis) * rows,))
    priority = lax.psum(placed, axis)[:self.blocks]      # padding rows last
    return params, {'delta': delta, 'priority': priority}

  # -- objectives --------------------------------------------------------------------------------

  def objective(self, params, shard, axis):
    w, y = params['w'], shard['y']
    hinge = jnp.where(y != 0, jnp.maximum(0.0, 1.0 - y * (shard['x'] @ w)), 0.0)
    return 0.5 * w @ w + self.c * lax.psum(jnp.sum(hinge), axis)

  def objective_at(self, beta: np.ndarray) -> float:
    """The primal objective at ``w`` (``beta``: the coefficients), in float64."""
    x, y = self.design.x.astype(np.float64), self.design.y.astype(np.float64)
    w = np.asarray(beta, np.float64)
    return float(0.5 * w @ w + self.c * np.maximum(0.0, 1.0 - y * (x @ w)).sum())

  def dual_objective_at(self, alpha: np.ndarray) -> float:
    """The dual objective ½‖Σ αᵢyᵢxᵢ‖² − Σ αᵢ (to minimise) at ``alpha`` (its first n, the data's
    rows), in float64: −1 × a lower bound on the primal optimum."""
    x, y = self.design.x.astype(np.float64), self.design.y.astype(np.float64)
    alpha = np.asarray(alpha, np.float64)[:self.design.rows]
    w = (alpha * y) @ x
    return float(0.5 * w @ w - alpha.sum())

  def _solve_reference(self) -> np.ndarray:
    from sklearn.svm import LinearSVC

    x, y = self.design.x.astype(np.float64), self.design.y.astype(np.float64)
    model = LinearSVC(C=self.c, loss='hinge', dual=True, fit_intercept=False, tol=1e-10,
                      max_iter=1_000_000, random_state=0)
    return model.fit(x, y).coef_.ravel().copy()


def make_svm(scheduler: str = 'schmp', *, c: float = 0.01, data: str = 'synthetic',
             rows: int | None = None, features: int | None = None, groups: int | None = None,
             group_size: int | None = None, rho: float | None = None,
             nonzeros: int | None = None, data_seed: int | None = None, pad_rows: bool = False,
             theta: float = 0.1, warmup: int | None = None, candidates: int | None = None,
             epsilon: float = 1e-4, priority: str = 'current', eta: float = 0.0) -> SVM:
  """The linear SVM app.

  Args:
    scheduler: ``'schmp'``, ``'shotgun'`` or ``'cyclic'``.
    c: C (> 0), the hinge loss's weight, as scikit-learn's ``LinearSVC(C)``.
    data: ``'synthetic'`` (`hetjax.data.correlated_design` with a logistic response, whose
      arguments ``rows`` … ``nonzeros`` and ``data_seed`` are; None takes `SYNTHETIC`, then the
      generator's defaults), ``'breast_cancer'`` (569 × 30), or the path of your own ``.npz``
      (arrays ``X`` and ``y``), ``.csv`` or ``.npy`` (rows of features, the label last), used
      as given (no standardising, no intercept); labels 0/1 or −1/+1
      (`hetjax.data.read_design`).
    pad_rows: pad rows that do not divide over the devices with zero rows (label 0: never
      scheduled, they change no sum and the objective skips them) instead of refusing.
    theta, warmup, candidates, epsilon, priority, eta: the ``'schmp'`` scheduler's
      (`DynamicScheduler`, on examples); ``priority='current'`` (default) has each round
      report every example's current step, ``'abs'`` is STRADS's last |Δαᵢ|.

  Raises:
    ConfigError: C ≤ 0, an unknown scheduler or data, design arguments for bundled data or a
      file, a file that does not read as a design (labels not 0/1 or −1/+1 …), bad scheduler
      settings.
  """
  scheduler = check_arguments(SVM.name, scheduler, None)
  if isinstance(c, bool) or not isinstance(c, int | float) or not (math.isfinite(c) and c > 0):
    raise ConfigError(f"app 'svm': c must be > 0, got {c}")
  options = DynamicOptions(theta, warmup, candidates, epsilon, priority, eta)
  design = dict(rows=rows, features=features, groups=groups, group_size=group_size, rho=rho,
                nonzeros=nonzeros, data_seed=data_seed)
  if data == 'synthetic':
    design = {k: SYNTHETIC.get(k) if v is None else v for k, v in design.items()}
  design_, data_config = make_design(Response.LOGISTIC, data, **design)
  config = {'scheduler': scheduler, 'c': float(c), **data_config, 'pad_rows': pad_rows,
            **options.settings()}
  return SVM(design_, c, scheduler, options, pad_rows, config)
