"""Emulated links: α + bytes / β per worker, a ring all-reduce at its slowest link's pace, the
text form and its one-line errors, padding a real transfer, and a host on them (`LinkedHost`)."""

import math

import pytest

from hetjax import ConfigError
from hetjax.core import Collective
from hetjax.emulation import KnownSpeedHost, LinkedHost, Links, StaticTrace, parse_links


def test_a_transfer_costs_latency_plus_bytes_over_bandwidth():
  links = parse_links('link:1,1,1,5:1000,1000,1000,100', workers=4)
  assert links.latency_s == (0.001, 0.001, 0.001, 0.005)
  assert links.bandwidth == (1e9, 1e9, 1e9, 1e8)
  assert links.transfer_s(0, 4_000_000) == pytest.approx(0.001 + 0.004)
  assert links.transfer_s(3, 4_000_000) == pytest.approx(0.005 + 0.04)
  assert links.transfer_s(2, 0) == pytest.approx(0.001)
  with pytest.raises(ConfigError, match='worker 4 is not one of the 4 workers'):
    links.transfer_s(4, 1)


def test_a_ring_all_reduce_runs_at_its_slowest_links_pace():
  links = parse_links('link:1,1,1,5:1000,1000,1000,100', workers=4)
  # 2 (n − 1) = 6 steps of b / n = 1 MB: the fast three alone, then with worker 3.
  assert links.all_reduce_s([0, 1, 2], 3_000_000) == pytest.approx(4 * 0.001 + 4 * 1e6 / 1e9)
  assert links.all_reduce_s(range(4), 4_000_000) == pytest.approx(6 * 0.005 + 6 * 1e6 / 1e8)
  assert links.all_reduce_s([2], 10**9) == 0.0                  # nothing to reduce with


def test_none_and_infinite_bandwidth_cost_nothing_beyond_latency():
  free = parse_links('none', workers=3)
  assert free.free and free.transfer_s(1, 10**9) == 0.0 and free.describe() == 'none'
  assert free == Links.none(3)
  unlimited = parse_links('link:2:inf', workers=2)
  assert unlimited.transfer_s(1, 10**12) == pytest.approx(0.002) and not unlimited.free
  assert math.isinf(unlimited.bandwidth[0])


def test_the_text_form_round_trips():
  for spec in ('link:1:100', 'link:0.5,0.5,2:1000,1000,inf', 'none'):
    assert parse_links(parse_links(spec, 3).describe(), 3) == parse_links(spec, 3)
  assert parse_links('link:1:100', 3).describe() == 'link:1:100'


def test_padding_sleeps_the_rest_of_the_links_time_only():
  links = parse_links('link:10:1', workers=1)
  slept = []
  target = links.transfer_s(0, 20_000)                          # 10 ms + 20 ms
  assert links.pad(target, 0.005, sleep=slept.append) == pytest.approx(0.025)
  assert slept == [pytest.approx(0.025)]
  assert links.pad(target, 0.5, sleep=slept.append) == 0.0 and len(slept) == 1


@pytest.mark.parametrize('spec, message', [
    ('wire:1:100', "bad links 'wire:1:100'; expected none or link:LATENCY_MS:BANDWIDTH_MB_S"),
    ('link:1', 'expected none or link:LATENCY_MS:BANDWIDTH_MB_S'),
    ('link:1:2:3', 'expected none or link'),
    ('link:fast:100', "link latency 'fast' is not a list of numbers"),
    ('link:1,2:100', 'link latency has 2 values for 3 workers; give 3 or 1'),
    ('link:1:100,100', 'link bandwidth has 2 values for 3 workers'),
    ('link:-1:100', r'link latencies must be finite and >= 0'),
    ('link:inf:100', r'link latencies must be finite and >= 0'),
    ('link:1:0', r'link bandwidths must be > 0'),
    ('link:1:nan', r'link bandwidths must be > 0'),
])
def test_bad_links_are_one_line(spec, message):
  with pytest.raises(ConfigError, match=message) as e:
    parse_links(spec, workers=3)
  assert '\n' not in str(e.value)


class _Padded(Links):
  """Links that record each padding (seconds to reach, seconds already measured) instead of
  sleeping."""

  def pad(self, seconds, measured_s, sleep=None):
    self.padded.append((seconds, measured_s))
    return 0.0


def _padded(spec: str, workers: int = 4) -> _Padded:
  links = parse_links(spec, workers)
  padded = _Padded(links.latency_s, links.bandwidth, links.exchange)
  object.__setattr__(padded, 'padded', [])
  return padded


def test_a_linked_host_pads_a_ring_collective_after_it_ran():
  links = _padded('link:1:1000,1000,1000,100')
  ticks = iter([10.0, 10.25, 20.0, 20.5])
  pace = LinkedHost(links, 3, clock=lambda: next(ticks))
  with pace.exchange(4_000_000):  # the step's gradient: a ring all-reduce on these links
    assert links.padded == []
  with pace.exchange(1_000_000, Collective.ALL_GATHER):
    pass
  assert links.padded == [(links.all_reduce_s(range(4), 4_000_000), 0.25),
                          (links.all_gather_s(range(4), 1_000_000), 0.5)]


def test_a_linked_host_through_a_server_pushes_and_pulls_first_and_has_no_ring():
  links = _padded('link:1,1,1,20:1000,1000,1000,100:exchange=server')
  pace = LinkedHost(links, 3)
  with pace.exchange(4_000_000):
    assert links.padded == [(2 * links.transfer_s(3, 4_000_000), 0.0)]
  with pytest.raises(ConfigError, match=r'exchange through a server .* no ring all-reduce'):
    pace.exchange(8, Collective.ALL_REDUCE).__enter__()


def test_a_linked_host_computes_as_its_host_or_the_machine():
  links = parse_links('link:1:100', 2)
  alone = LinkedHost(links, 1)
  assert (alone.factor(5), alone.load(5), alone.pad(5, 64, 0.01)) == (1.0, None, (0.0, 0.0))
  host = KnownSpeedHost(StaticTrace((1.0, 3.0)), 1, row_s=1e-3, sleep=lambda s: None,
                        clock=lambda: 0.0)
  paced = LinkedHost(links, 1, host)
  assert (paced.factor(5), paced.load(5)) == (3.0, 3.0)
  assert paced.pad(5, 10, 0.02) == host.pad(5, 10, 0.02) == (0.0, 0.0)  # slept 0 by its clock
  assert paced.pad(5, 10, 0.05) == (0.0, pytest.approx(0.02))           # 20 ms past 30 ms
  with pytest.raises(ConfigError, match='the host of worker 1 on the links of worker 0'):
    LinkedHost(links, 0, host)
  with pytest.raises(ConfigError, match='worker 2 is not one of the 2 workers'):
    LinkedHost(links, 2)
