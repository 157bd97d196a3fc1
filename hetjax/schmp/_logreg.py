"""`LogReg`: L1-regularised logistic regression, Σᵢ log(1 + exp(−yᵢ xᵢᵀβ)) + λ‖β‖₁ with labels
yᵢ = ±1, by scheduled parallel coordinate descent.

The rows are split over the devices and each device keeps the margins m = Xβ of its rows (a
parameter sharded by rows); β is replicated. A round is `PrimalCoordinateApp`'s: for the picked
coordinates J each device sums over its rows

  gⱼ = Σᵢ −yᵢ xᵢⱼ σ(−yᵢ mᵢ)     (the loss's derivative in βⱼ)
  hⱼ = ¼ Σᵢ xᵢⱼ²               (a bound on its second derivative, Σᵢ xᵢⱼ² σ(mᵢ) σ(−mᵢ)),

one `lax.psum` of the [2, |J|] array adds them, every device sets βⱼ ← S(βⱼ hⱼ − gⱼ, λ) / hⱼ,
and the margins move by X_J Δβ_J.

Why the bound and not the Newton diagonal Σᵢ xᵢⱼ² σ(mᵢ) σ(−mᵢ): since σ(m) σ(−m) ≤ ¼, the
quadratic with curvature ¼Σx² lies above the loss along coordinate j, so its proximal minimiser
never raises the objective — sequential coordinate descent is monotone and converges with no
line search. The Newton diagonal is the curvature at the current point only: where margins are
large it is small and the step overshoots; glmnet and liblinear add a line search for that,
which would cost a second collective a round. Updating many coordinates at once makes it
worse. On breast_cancer at the default λ, from β = 0, in float64 (to 1e-3 relative of the
optimum): one coordinate at a time the Newton diagonal takes 9 sweeps and the bound 46; all 30
coordinates at once (no dependency check), the Newton diagonal diverges (objective 1e8 after
300 sweeps) and the bound converges in 35 sweeps. The price is a slow tail where the data are
nearly separable and σ(m) σ(−m) is far below ¼ at the optimum: on breast_cancer cyclic descent
is at 7e-4 relative after 60 sweeps and 6e-4 after 100. With standardised columns hⱼ = n/4 for
every j; it is summed like gⱼ anyway (the same psum), so zero rows that pad the data and
all-zero columns (hⱼ = 0: βⱼ stays 0) need no special case.

Scaling: scikit-learn's ``LogisticRegression(C)`` with an L1 penalty and no intercept minimises
‖β‖₁ + C Σᵢ log(1 + exp(−yᵢ xᵢᵀβ)), this app's objective divided by λ when C = 1/λ: the same
minimiser. `reference_objective` solves it so (liblinear) and reports this app's objective at
scikit-learn's β. λ defaults to λ_max / 10, where λ_max = ½‖Xᵀy‖_∞ is the smallest λ at which
β = 0 is optimal (the loss's gradient at β = 0 is −½Xᵀy). The objective the run reports is
recomputed from β (Xβ, not the kept margins, which drift in float32), over the data's rows
only (a padding row, y = 0, would add log 2).

Example::

  >>> app = make_logreg('cyclic', data='breast_cancer')
  >>> app.blocks, app.default_schedule_size(2), round(app.lam, 1)
  (30, 1, 21.8)
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hetjax.data import Response
from hetjax.schmp._coordinate_app import (
    DynamicOptions,
    PrimalCoordinateApp,
    check_arguments,
    default_lam,
    make_design,
)


class LogReg(PrimalCoordinateApp):
  """The L1 logistic regression app (module docstring); made by `make_logreg`."""

  name = 'logreg'
  row_state = 'margin'

  def init_params(self, data, axis):
    del axis
    return {'beta': jnp.zeros(self.blocks, jnp.float32), 'margin': jnp.zeros_like(data['y'])}

  def partial_sums(self, state, y, x):
    weight = -y * jax.nn.sigmoid(-y * state)   # 0 on a padding row (y = 0)
    return jnp.stack([weight @ x, 0.25 * jnp.sum(x * x, axis=0)])

  def moved(self, state, x, delta):
    return state + x @ delta

  def objective(self, params, shard, axis):
    y = shard['y']
    loss = jnp.where(y != 0, jnp.logaddexp(0.0, -y * (shard['x'] @ params['beta'])), 0.0)
    return lax.psum(jnp.sum(loss), axis) + self.lam * jnp.sum(jnp.abs(params['beta']))

  def objective_at(self, beta: np.ndarray) -> float:
    x, y = self.design.x.astype(np.float64), self.design.y.astype(np.float64)
    beta = np.asarray(beta, np.float64)
    return float(np.logaddexp(0.0, -y * (x @ beta)).sum() + self.lam * np.abs(beta).sum())

  def _solve_reference(self) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    x, y = self.design.x.astype(np.float64), self.design.y.astype(np.float64)
    # liblinear's L1 solver (newGLMNET) reaches the optimum's objective to ~1e-12 relative at
    # tol 1e-8 in a few dozen iterations on these designs; much smaller tolerances stall it.
    model = LogisticRegression(C=1 / self.lam, fit_intercept=False, solver='liblinear',
                               tol=1e-8, max_iter=10_000, random_state=0, **_l1_penalty())
    return model.fit(x, y).coef_.ravel().copy()


def _l1_penalty() -> dict:
  """The L1 penalty in the words of the installed scikit-learn: ``l1_ratio=1`` from 1.8 on
  (which deprecates ``penalty``), ``penalty='l1'`` before."""
  from sklearn.linear_model import LogisticRegression

  penalty = inspect.signature(LogisticRegression).parameters['penalty'].default
  return {'l1_ratio': 1.0} if penalty == 'deprecated' else {'penalty': 'l1'}


def lam_max(x: np.ndarray, y: np.ndarray) -> float:
  """½‖Xᵀy‖_∞: the smallest λ at which β = 0 solves the L1 logistic regression."""
  return float(0.5 * np.abs(x.T.astype(np.float64) @ y.astype(np.float64)).max())


def make_logreg(scheduler: str = 'schmp', *, lam: float | None = None, data: str = 'synthetic',
                rows: int | None = None, features: int | None = None,
                groups: int | None = None, group_size: int | None = None,
                rho: float | None = None, nonzeros: int | None = None,
                data_seed: int | None = None, pad_rows: bool = False, theta: float = 0.1,
                warmup: int | None = None, candidates: int | None = None,
                epsilon: float = 1e-4,
                priority: str = 'current', eta: float = 0.0) -> LogReg:
  """The L1 logistic regression app.

  Args:
    scheduler: ``'schmp'``, ``'shotgun'`` or ``'cyclic'``.
    lam: λ (> 0); default λ_max / 10.
    data: ``'synthetic'`` (`hetjax.data.correlated_design` with a logistic response, whose
      arguments ``rows`` … ``nonzeros`` and ``data_seed`` are; None takes its default: 1024 ×
      1024, one group of 512 columns at ρ = 0.9, 16 nonzeros), ``'breast_cancer'``
      (569 × 30), or the path of your own ``.npz`` (arrays ``X`` and ``y``), ``.csv`` or
      ``.npy`` (rows of features, the label last), used as given (no standardising, no
      intercept); labels 0/1 or −1/+1 (`hetjax.data.read_design`).
    pad_rows: pad rows that do not divide over the devices with zero rows (label 0: they
      change no sum and the objective skips them) instead of refusing.
    theta, warmup, candidates, epsilon, priority, eta: the ``'schmp'`` scheduler's
      (`DynamicScheduler`); ``priority='current'`` (default) has each round report every
      coordinate's current |Δβⱼ|, ``'abs'`` is STRADS's last |Δβⱼ|.

  Raises:
    ConfigError: λ ≤ 0, an unknown scheduler or data, design arguments for bundled data or a
      file, a file that does not read as a design (labels not 0/1 or −1/+1 …), bad scheduler
      settings.
  """
  scheduler = check_arguments(LogReg.name, scheduler, lam)
  options = DynamicOptions(theta, warmup, candidates, epsilon, priority, eta)
  design, data_config = make_design(
      Response.LOGISTIC, data, rows=rows, features=features, groups=groups,
      group_size=group_size, rho=rho, nonzeros=nonzeros, data_seed=data_seed)
  lam = default_lam(LogReg.name, lam_max(design.x, design.y)) if lam is None else lam
  config = {'scheduler': scheduler, 'lam': float(lam), **data_config, 'pad_rows': pad_rows,
            **options.settings()}
  return LogReg(design, lam, scheduler, options, pad_rows, config)
