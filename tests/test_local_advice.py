"""`hetjax.planner.local_sgd_advice`: when local SGD pays, from the cluster description."""

import pytest

from hetjax.planner import ClusterSpec, WorkerSpec, local_sgd_advice


def _cluster(beta, workers=4, flops=1e12):
  return ClusterSpec((WorkerSpec(1, flops, 1e10),) * workers, alpha_s=1e-4,
                     beta_bytes_per_s=beta)


def test_fast_links_keep_synchronous_training():
  advice = local_sgd_advice(_cluster(beta=1e11), param_bytes=4e8, step_flops=4e12)
  assert advice.ratio == pytest.approx((6 * 1e-4 + 1.5 * 4e8 / 1e11) / 1.0)
  assert not advice.worth_it
  assert 'synchronous training' in advice.describe()


def test_slow_links_get_the_h_that_hides_the_exchange():
  advice = local_sgd_advice(_cluster(beta=1e8), param_bytes=4e8, step_flops=4e12,
                            overhead=0.05)
  assert advice.worth_it and advice.ratio > 5
  assert advice.exchange_s / advice.inner_steps <= 0.05 * advice.compute_s
  assert advice.exchange_s / (advice.inner_steps - 1) > 0.05 * advice.compute_s
  assert f'--set local.inner_steps={advice.inner_steps}' in advice.describe()


def test_a_slow_device_counts_by_its_flops():
  fast = local_sgd_advice(_cluster(beta=1e9), 4e8, 4e12)
  slow = local_sgd_advice(_cluster(beta=1e9, flops=1e11), 4e8, 4e12)
  assert slow.compute_s == pytest.approx(10 * fast.compute_s)
  assert slow.inner_steps < fast.inner_steps
