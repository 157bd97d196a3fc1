"""The communication schemes and each one's steady-state iteration time (closed forms).

Worker i computes a gradient in Cᵢ seconds and moves the b bytes of the parameters (or of a
gradient) through its link in tᵢ = αᵢ + b / βᵢ (`hetjax.emulation.Links.transfer_s`), a push or
a pull; a ring all-reduce takes R = `Links.all_reduce_s` (all n workers, the slowest link's
pace). The servers add no time (`simulate_comm` says why).

Schemes, and worker i's iteration time under each (`iteration_s`):

* ``ps-bsp``: round r, every worker computes at version r, pushes; when all n pushes are in the
  server applies one update with their mean (the global batch's gradient), every worker pulls
  and starts round r + 1. Every worker: maxⱼ (Cⱼ + 2tⱼ).
* ``ps-asp``: a worker computes at the version it holds, pushes; the server applies the push on
  arrival (staleness τ = server version − that version), the worker pulls the newest version
  and computes again. Worker i: Cᵢ + 2tᵢ.
* ``ps-eager``: a compute thread and a communication thread. Step t computes gₜ while step t − 1's
  communication (push gₜ₋₁, then at once a pull) runs; when both are done the worker adopts the
  pulled parameters and hands gₜ over. gₜ is computed on parameters pulled after push t − 2 was
  applied: one own step staler than ``ps-asp`` (with n equal workers τ = 2n − 1 against n − 1,
  as the window from pull to apply is two iterations long). Worker i: max(Cᵢ, 2tᵢ).
* ``ps-eager-stale-lr``: as ``ps-eager``, each update scaled by 1 / max(1, τ) (Zhang et al.).
* ``allreduce-sync``: all compute, a ring all-reduce once the slowest is done, the mean
  gradient is applied (synchronous SGD). Every worker: maxⱼ Cⱼ + R.
* ``allreduce-overlap`` (Jin's scheduler): step t's all-reduce runs while step t + 1 computes,
  worker i at w̃ᵢ = wₜ − η gₜ⁽ⁱ⁾ (its own gradient applied), then wₜ₊₁ = wₜ − η ḡₜ exactly.
  Step t + 1's compute starts when step t's is done and wₜ is known (all-reduce t − 1 done);
  all-reduce t starts when all-reduce t − 1 is done and every worker has computed step t.
  Every worker: max(maxⱼ Cⱼ, R).

Example::

  >>> links = Links((1e-3,) * 4, (1e8,) * 4)        # 1 ms, 100 MB/s: 11 ms a 1 MB transfer
  >>> iteration_s('ps-eager', (0.02,) * 4, links, 10 ** 6)
  (0.022, 0.022, 0.022, 0.022)
  >>> [round(s, 6) for s in iteration_s('ps-asp', (0.02, 0.02, 0.02, 0.06), links, 10 ** 6)]
  [0.042, 0.042, 0.042, 0.082]
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np

from hetjax._errors import ConfigError, parse_choice
from hetjax.emulation import Links


class Scheme(enum.Enum):
  PS_BSP = 'ps-bsp'
  PS_ASP = 'ps-asp'
  PS_EAGER = 'ps-eager'
  PS_EAGER_STALE_LR = 'ps-eager-stale-lr'
  ALLREDUCE_SYNC = 'allreduce-sync'
  ALLREDUCE_OVERLAP = 'allreduce-overlap'


#: The schemes whose gradients can be stale: they take DC-ASGD and a staleness bound.
ASYNC_PS = (Scheme.PS_ASP, Scheme.PS_EAGER, Scheme.PS_EAGER_STALE_LR)


def iteration_s(scheme: Scheme | str, compute_s: float | Sequence[float], links: Links,
                model_bytes: int) -> tuple[float, ...]:
  """Each worker's steady-state iteration time under ``scheme`` (the closed forms above).

  Args:
    scheme: a `Scheme` or its name.
    compute_s: seconds per gradient, one value or one per worker of ``links``.
    links: each worker's link.
    model_bytes: b, the bytes of the parameters (and of a gradient).
  """
  scheme = parse_choice(Scheme, scheme, 'communication scheme')
  c = compute_times(compute_s, links.workers)
  t = transfer_times(links, model_bytes)
  reduce = links.all_reduce_s(range(links.workers), model_bytes)
  each = {Scheme.PS_BSP: np.full_like(c, (c + 2 * t).max()),
          Scheme.PS_ASP: c + 2 * t,
          Scheme.PS_EAGER: np.maximum(c, 2 * t),
          Scheme.PS_EAGER_STALE_LR: np.maximum(c, 2 * t),
          Scheme.ALLREDUCE_SYNC: np.full_like(c, c.max() + reduce),
          Scheme.ALLREDUCE_OVERLAP: np.full_like(c, max(c.max(), reduce))}[scheme]
  return tuple(float(v) for v in each)


def compute_times(compute_s: float | Sequence[float], workers: int) -> np.ndarray:
  """Cᵢ for every worker from one value or one per worker, checked."""
  c = np.atleast_1d(np.asarray(compute_s, dtype=np.float64))
  if c.size == 1:
    c = np.full(workers, c[0])
  if c.shape != (workers,) or not (np.all(np.isfinite(c)) and np.all(c >= 0)):
    raise ConfigError(f'compute_s must be one value or {workers} (one per worker), finite and '
                      f'>= 0, got {compute_s!r}')
  return c


def transfer_times(links: Links, model_bytes: int) -> np.ndarray:
  """tᵢ = αᵢ + b / βᵢ for every worker: one push, or one pull."""
  return np.array([links.transfer_s(i, model_bytes) for i in range(links.workers)])
