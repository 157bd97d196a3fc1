"""`Lasso`: ½‖y − Xβ‖² + λ‖β‖₁ by scheduled parallel coordinate descent, as STRADS does it.

The rows (samples) are split over the devices and each device keeps the residual r = y − Xβ of
its rows (a parameter sharded by rows); β is replicated. A round is `PrimalCoordinateApp`'s:
for the picked coordinates J each device sums, over its rows, gⱼ = −Σᵢ xᵢⱼ rᵢ (the derivative of
½‖r‖² in βⱼ) and hⱼ = Σᵢ xᵢⱼ² (its exact second derivative: the loss is quadratic), one
`lax.psum` adds them, and every device sets

  βⱼ ← S(βⱼ hⱼ − gⱼ, λ) / hⱼ = S(Σᵢ xᵢⱼ rᵢ + βⱼ Σᵢ xᵢⱼ², λ) / Σᵢ xᵢⱼ²,

the exact minimiser of the objective in βⱼ with the others fixed; then r ← r − X_J Δβ_J.

Done one coordinate at a time this is cyclic coordinate descent; done for coordinates whose
columns are uncorrelated it is as good as one at a time (the dynamic scheduler's
θ check); done for correlated ones at once it can overshoot (Shotgun).

Scaling: scikit-learn's ``Lasso(alpha)`` minimises 1/(2n)‖y − Xβ‖² + α‖β‖₁, this app's
objective divided by n with α = λ/n; `reference_objective` solves it so and reports this app's
objective at scikit-learn's β. λ defaults to λ_max / 10, where λ_max = maxⱼ |xⱼᵀy| is the
smallest λ at which β = 0 is optimal (on the default synthetic design: 14 nonzero coefficients
against a truth of 16). The objective the run reports is recomputed from β (y − Xβ, not the
kept residual, which drifts in float32).

Example::

  >>> app = make_lasso('cyclic', data='diabetes')
  >>> app.blocks, app.default_schedule_size(2), round(app.lam, 1)
  (10, 1, 25.9)
"""

from __future__ import annotations

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


class Lasso(PrimalCoordinateApp):
  """The Lasso app (module docstring); made by `make_lasso`."""

  name = 'lasso'
  row_state = 'residual'

  def init_params(self, data, axis):
    del axis
    return {'beta': jnp.zeros(self.blocks, jnp.float32), 'residual': data['y']}

  def partial_sums(self, state, y, x):
    del y
    return jnp.stack([-(state @ x), jnp.sum(x * x, axis=0)])

  def moved(self, state, x, delta):
    return state - x @ delta

  def objective(self, params, shard, axis):
    r = shard['y'] - shard['x'] @ params['beta']
    return 0.5 * lax.psum(r @ r, axis) + self.lam * jnp.sum(jnp.abs(params['beta']))

  def objective_at(self, beta: np.ndarray) -> float:
    x, y = self.design.x.astype(np.float64), self.design.y.astype(np.float64)
    r = y - x @ np.asarray(beta, np.float64)
    return float(0.5 * r @ r + self.lam * np.abs(beta).sum())

  def _solve_reference(self) -> np.ndarray:
    from sklearn.linear_model import Lasso as SkLasso

    x, y = self.design.x.astype(np.float64), self.design.y.astype(np.float64)
    model = SkLasso(alpha=self.lam / self.design.rows, fit_intercept=False, tol=1e-12,
                    max_iter=1_000_000)
    return model.fit(x, y).coef_.copy()


def lam_max(x: np.ndarray, y: np.ndarray) -> float:
  """maxⱼ |xⱼᵀy|: the smallest λ at which β = 0 solves the Lasso."""
  return float(np.abs(x.T.astype(np.float64) @ y.astype(np.float64)).max())


def make_lasso(scheduler: str = 'schmp', *, lam: float | None = None, data: str = 'synthetic',
               rows: int | None = None, features: int | None = None, groups: int | None = None,
               group_size: int | None = None, rho: float | None = None,
               nonzeros: int | None = None, noise: float | None = None,
               data_seed: int | None = None, pad_rows: bool = False, theta: float = 0.1,
               warmup: int | None = None, candidates: int | None = None, epsilon: float = 1e-4,
               priority: str = 'current', eta: float = 0.0) -> Lasso:
  """The Lasso app.

  Args:
    scheduler: ``'schmp'``, ``'shotgun'`` or ``'cyclic'``.
    lam: λ (> 0); default λ_max / 10.
    data: ``'synthetic'`` (`hetjax.data.correlated_design`, whose arguments ``rows`` …
      ``noise`` and ``data_seed`` are; None takes its default: 1024 × 1024, one group of 512
      columns at ρ = 0.9, 16 nonzeros, noise 1), ``'diabetes'`` (442 × 10), or the path of
      your own ``.npz`` (arrays ``X`` and ``y``), ``.csv`` or ``.npy`` (rows of features, the
      target last), used as given: no standardising, no intercept (`hetjax.data.read_design`).
    pad_rows: pad rows that do not divide over the devices with zero rows (exact: a zero row
      changes no sum) instead of refusing.
    theta, warmup, candidates, epsilon, priority, eta: the ``'schmp'`` scheduler's
      (`DynamicScheduler`); ``priority='current'`` (default) has each round report every
      coordinate's current |Δβⱼ|, ``'abs'`` is STRADS's last |Δβⱼ|.

  Raises:
    ConfigError: λ ≤ 0, an unknown scheduler or data, design arguments for bundled data or a
      file, a file that does not read as a design, bad scheduler settings.
  """
  scheduler = check_arguments(Lasso.name, scheduler, lam)
  options = DynamicOptions(theta, warmup, candidates, epsilon, priority, eta)
  design, data_config = make_design(
      Response.LINEAR, data, rows=rows, features=features, groups=groups,
      group_size=group_size, rho=rho, nonzeros=nonzeros, noise=noise, data_seed=data_seed)
  lam = default_lam(Lasso.name, lam_max(design.x, design.y)) if lam is None else lam
  config = {'scheduler': scheduler, 'lam': float(lam), **data_config, 'pad_rows': pad_rows,
            **options.settings()}
  return Lasso(design, lam, scheduler, options, pad_rows, config)
