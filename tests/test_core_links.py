"""The one α–β link model (`hetjax.core.LinkCost`) and the places that price with it."""

import doctest
import math

import pytest

from hetjax import ConfigError, _links
from hetjax.core import LinkCost, ring_bytes, ring_fraction, ring_steps
from hetjax.emulation import Links
from hetjax.simulation import ClockCosts


def test_the_docstring_examples_hold():
  assert doctest.testmod(_links, raise_on_error=True).attempted > 0


def test_ring_all_reduce_is_two_passes_of_n_minus_one_steps():
  link = LinkCost(1e-3, 1e6)
  assert ring_steps(4) == 6 and ring_steps(4, 1) == 3
  assert ring_fraction(4) == 1.5 and ring_bytes(1000, 4) == 1500.0
  assert link.ring_all_reduce_s(1000, 4) == 6 * 1e-3 + 1500 / 1e6
  assert link.ring_all_reduce_s(1000, 1) == 0.0
  assert link.send_s(1000) == link.time_s(1, 1000) == 1e-3 + 1000 / 1e6
  assert LinkCost().ring_all_reduce_s(10 ** 9, 8) == 0.0   # the default costs nothing
  # an all-gather: one ring pass, n − 1 steps, each member's bytes through every link
  assert link.ring_all_gather_s(250, 4) == pytest.approx(3 * 1e-3 + 750 / 1e6)
  assert link.ring_all_gather_s(250, 1) == 0.0


def test_a_collective_goes_at_its_slowest_link():
  assert LinkCost.slowest([LinkCost(1e-3, 1e9), LinkCost(1e-4, 1e6)]) == LinkCost(1e-3, 1e6)
  with pytest.raises(ConfigError, match='no links'):
    LinkCost.slowest([])


def test_the_fit_inverts_the_model():
  link = LinkCost(2e-5, 3e9)
  small, large = link.ring_all_reduce_s(0, 8), link.ring_all_reduce_s(1 << 20, 8)
  fit = LinkCost.fit_ring_all_reduce(8, small, 1 << 20, large)
  assert fit.alpha_s == pytest.approx(2e-5) and fit.beta_bytes_per_s == pytest.approx(3e9)
  assert LinkCost.fit_ring_all_reduce(1, 1e-4, 1 << 20, 2e-4) == LinkCost(1e-4, math.inf)


def test_for_time_solves_for_the_bandwidth():
  link = LinkCost.for_time(0.05, 6, ring_bytes(10 ** 6, 4), 1e-3)
  assert link.alpha_s == 1e-3 and link.ring_all_reduce_s(10 ** 6, 4) == pytest.approx(0.05)
  with pytest.raises(ConfigError, match='latencies'):
    LinkCost.for_time(0.005, 6, 10 ** 6, 1e-3)


@pytest.mark.parametrize('alpha, beta, match', [(-1.0, 1e9, 'alpha_s'), (math.nan, 1e9, 'alpha_s'),
                                                (math.inf, 1e9, 'alpha_s'), (0.0, 0.0, 'beta'),
                                                (0.0, math.nan, 'beta')])
def test_bad_links_are_one_line(alpha, beta, match):
  with pytest.raises(ConfigError, match=match) as info:
    LinkCost(alpha, beta)
  assert '\n' not in str(info.value)


def test_emulated_links_and_the_virtual_clock_price_alike():
  links = Links((1e-3, 2e-3, 1e-3), (1e8, 1e8, 5e7))
  assert links.link(1) == LinkCost(2e-3, 1e8)
  assert links.all_reduce_s(range(3), 10 ** 6) == LinkCost(2e-3, 5e7).ring_all_reduce_s(10 ** 6, 3)
  assert links.all_gather_s(range(3), 10 ** 6) == LinkCost(2e-3, 5e7).ring_all_gather_s(10 ** 6, 3)
  clock = ClockCosts(per_sample_s=1e-3, alpha_s=2e-3, beta_bytes_per_s=5e7, grad_bytes=10 ** 6)
  assert clock.allreduce_s(3) == links.all_reduce_s(range(3), 10 ** 6)
  assert clock.link == LinkCost(2e-3, 5e7)
