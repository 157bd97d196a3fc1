"""Communication schemes on the virtual clock: event times against the closed forms, training
against plain SGD, staleness out of the event order, a straggler, and 1024 workers."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.emulation import Links
from hetjax.simulation import CommRun, LeastSquares, Scheme, iteration_s, simulate_comm

C = 0.02         # seconds per gradient
MB = 10 ** 6     # model bytes
SMALL = LeastSquares(global_batch=64, rows=2048)


def _links(workers: int, comm_over_compute: float, scheme: Scheme) -> Links:
  """Links on which the scheme's communication (push + pull, or the all-reduce) takes
  ``comm_over_compute`` × C: 1 ms of latency, the bandwidth set to make up the rest."""
  alpha = 1e-3
  if scheme.value.startswith('ps'):
    beta = 2 * MB / (comm_over_compute * C - 2 * alpha)
  else:
    steps = 2 * (workers - 1)
    beta = steps / workers * MB / (comm_over_compute * C - steps * alpha)
  return Links((alpha,) * workers, (beta,) * workers)


def _plain_sgd(problem: LeastSquares, lr: float, steps: int) -> list[float]:
  w, losses = problem.start(), []
  for k in range(steps):
    w = w - lr * problem.gradient(w, k, slice(None))
    losses.append(problem.loss(w))
  return losses


@pytest.mark.parametrize('scheme', list(Scheme))
@pytest.mark.parametrize('ratio', [0.5, 1.0, 2.0])
def test_equal_workers_iterate_at_the_closed_form(scheme, ratio):
  links = _links(4, ratio, scheme)
  run = simulate_comm(scheme, C, links, MB, updates=120, lr=0.05, problem=SMALL)
  closed = iteration_s(scheme, C, links, MB)
  np.testing.assert_allclose(run.worker_iter_s, closed, rtol=1e-9)
  expected = {Scheme.PS_BSP: C * (1 + ratio), Scheme.PS_ASP: C * (1 + ratio),
              Scheme.PS_EAGER: C * max(1, ratio), Scheme.PS_EAGER_STALE_LR: C * max(1, ratio),
              Scheme.ALLREDUCE_SYNC: C * (1 + ratio),
              Scheme.ALLREDUCE_OVERLAP: C * max(1, ratio)}[scheme]
  assert run.iter_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize('scheme', list(Scheme))
def test_a_straggler_iterates_at_the_closed_form(scheme):
  links = _links(4, 1.0, scheme)
  compute = (C, C, C, 3 * C)
  run = simulate_comm(scheme, compute, links, MB, updates=300, lr=0.05, problem=SMALL)
  np.testing.assert_allclose(run.worker_iter_s, iteration_s(scheme, compute, links, MB),
                             rtol=1e-9)


def test_noisy_compute_averages_to_the_closed_form():
  """Log-normal factors of mean 1 and CV 0.3: asp's iteration C·f + 2t averages to C + 2t (about
  500 iterations a worker: the mean's standard error is 0.3·C / √500 ≈ 0.7% of C + 2t = 2C;
  3% is over 4 of them)."""
  links = _links(4, 1.0, Scheme.PS_ASP)
  run = simulate_comm('ps-asp', C, links, MB, 2000, 0.05, SMALL, noise_cv=0.3, seed=3)
  np.testing.assert_allclose(run.worker_iter_s, 2 * C, rtol=0.03)
  again = simulate_comm('ps-asp', C, links, MB, 2000, 0.05, SMALL, noise_cv=0.3, seed=3)
  np.testing.assert_array_equal(run.losses, again.losses)


@pytest.mark.parametrize('scheme', ['ps-bsp', 'ps-asp', 'allreduce-sync'])
def test_one_worker_on_free_links_is_plain_sgd(scheme):
  run = simulate_comm(scheme, C, Links.none(1), MB, updates=30, lr=0.3, problem=SMALL)
  np.testing.assert_array_equal(run.losses, _plain_sgd(SMALL, 0.3, 30))
  np.testing.assert_allclose(run.update_times, C * np.arange(1, 31), rtol=1e-12)
  assert not run.staleness.any()


def test_one_worker_overlap_and_delay_compensation_are_plain_sgd():
  reference = _plain_sgd(SMALL, 0.3, 30)
  asp = simulate_comm('ps-asp', C, Links.none(1), MB, 30, 0.3, SMALL, dc_lambda=0.04)
  np.testing.assert_array_equal(asp.losses, reference)  # τ = 0: w_now − w_then = 0
  # One worker's w̃ = wₜ − η gₜ is wₜ₊₁; only the summation order differs (einsum vs matmul).
  overlap = simulate_comm('allreduce-overlap', C, Links.none(1), MB, 30, 0.3, SMALL)
  np.testing.assert_allclose(overlap.losses, reference, rtol=1e-10)


def test_one_eager_worker_is_one_step_stale():
  run = simulate_comm('ps-eager', C, Links.none(1), MB, 30, 0.3, SMALL)
  assert run.staleness.tolist() == [0] + [1] * 29
  assert not np.array_equal(run.losses, _plain_sgd(SMALL, 0.3, 30))


def test_bsp_is_synchronous_sgd():
  links = Links((1e-3,) * 8, (1e8,) * 8)
  bsp = simulate_comm('ps-bsp', C, links, MB, 40, 0.3, SMALL)
  sync = simulate_comm('allreduce-sync', C, links, MB, 40, 0.3, SMALL)
  np.testing.assert_array_equal(bsp.losses, sync.losses)


@pytest.mark.parametrize('workers', [1, 4, 16])
def test_staleness_comes_out_of_the_event_order(workers):
  """n equal workers in lock step: between a worker's pull and its next push the n − 1 others
  push once (asp: τ = n − 1); eager's gradient is on a pull two own steps old, so the others
  push twice and the worker itself once (τ = 2n − 1: one more for n = 1)."""
  links = Links((1e-3,) * workers, (1e8,) * workers)
  warm = 2 * workers
  asp = simulate_comm('ps-asp', C, links, MB, 40 * workers, 0.01, SMALL)
  eager = simulate_comm('ps-eager', C, links, MB, 40 * workers, 0.01, SMALL)
  assert asp.staleness[warm:].tolist() == [workers - 1] * (38 * workers)
  assert eager.staleness[warm:].tolist() == [2 * workers - 1] * (38 * workers)


def test_a_straggler_leaves_the_mean_staleness_alone():
  """Each update's τ counts the others' pushes during its worker's iteration Tᵢ, Σ_{j≠i} Tᵢ/Tⱼ;
  weighted by the update rates 1/Tᵢ the mean is n − 1 whatever the speeds."""
  links = Links((1e-3,) * 4, (1e8,) * 4)
  run = simulate_comm('ps-asp', (C, C, C, 3 * C), links, MB, 2400, 0.01, SMALL)
  assert run.staleness.mean() == pytest.approx(3, abs=0.02)
  assert run.staleness.max() > 3


def test_refused_pushes_are_counted_never_applied():
  links = Links((1e-3,) * 4, (1e8,) * 4)
  run = simulate_comm('ps-asp', C, links, MB, 100, 0.1, SMALL, max_staleness=2)
  assert run.refused > 0 and run.staleness.max() <= 2 and len(run.losses) == 100


def _straggler_eager(scheme: str, lr: float) -> CommRun:
  links = _links(4, 1.0, Scheme.PS_EAGER)
  return simulate_comm(scheme, (C, C, C, 3 * C), links, MB, 1500, lr)


def test_staleness_aware_lr_survives_a_large_lr_with_a_straggler():
  """At η = 0.5 plain eager pull diverges (its gradients are 7 versions stale on average, the
  straggler's more); η / τ damps exactly those and reaches 10% of the start loss."""
  target = 0.1 * LeastSquares().loss(LeastSquares().start())
  eager, damped = _straggler_eager('ps-eager', 0.5), _straggler_eager('ps-eager-stale-lr', 0.5)
  assert eager.updates_to(target) is None and eager.losses[-1] > 1e6 * eager.losses[0]
  assert damped.updates_to(target) is not None and damped.updates_to(target) < 40


def test_staleness_aware_lr_costs_updates_at_a_stable_lr():
  """At η = 0.1 (stable for eager) η / τ divides nearly every update by τ ≈ 7: ~7× the updates."""
  target = 0.1 * LeastSquares().loss(LeastSquares().start())
  eager, damped = _straggler_eager('ps-eager', 0.1), _straggler_eager('ps-eager-stale-lr', 0.1)
  assert damped.updates_to(target) > 5 * eager.updates_to(target)


@pytest.mark.parametrize('scheme', list(Scheme))
def test_1024_workers_run_in_seconds(scheme):
  links = Links((1e-5,) * 1024, (1e9,) * 1024)
  asynchronous = scheme in (Scheme.PS_ASP, Scheme.PS_EAGER, Scheme.PS_EAGER_STALE_LR)
  began = time.perf_counter()
  run = simulate_comm(scheme, C, links, 10 ** 7, 3000 if asynchronous else 100,
                      1e-3 if asynchronous else 0.2)
  assert time.perf_counter() - began < 2.0
  np.testing.assert_allclose(run.worker_iter_s, iteration_s(scheme, C, links, 10 ** 7),
                             rtol=1e-9)
  assert run.losses[-1] < run.losses[0]


def test_targets_count_updates_and_read_their_time():
  run = simulate_comm('allreduce-sync', C, Links.none(2), MB, 20, 0.3, SMALL)
  k = run.updates_to(run.losses[4])
  assert k is not None and k <= 5 and run.time_to(run.losses[4]) == run.update_times[k - 1]
  assert run.updates_to(-1.0) is None and run.time_to(-1.0) is None


def test_bad_input_is_one_config_error():
  links = Links.none(4)
  with pytest.raises(ConfigError, match='unknown communication scheme'):
    simulate_comm('gossip', C, links, MB, 10, 0.1)
  with pytest.raises(ConfigError, match='no stale gradients'):
    simulate_comm('ps-bsp', C, links, MB, 10, 0.1, dc_lambda=0.04)
  with pytest.raises(ConfigError, match='one per worker'):
    simulate_comm('ps-asp', (C, C), links, MB, 10, 0.1)
  with pytest.raises(ConfigError, match='do not divide'):
    simulate_comm('ps-asp', C, Links.none(3), MB, 10, 0.1)
