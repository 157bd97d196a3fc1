"""`build_host`: the one builder of emulated hosts: a given or calibrated cost, the one margin,
the slowest worker's cost agreed by all, and a small model's cost taken as all per row."""

from __future__ import annotations

import pytest

from hetjax._errors import ConfigError
from hetjax.emulation import MARGIN, Calibration, StaticTrace, build_host

TRACE = StaticTrace((1.0, 1.0, 3.0))


class Board:
  """The other workers' published costs, as a `Channel` would hold them."""

  def __init__(self, others: dict[int, list]):
    self.values = {f'calibrate/{w}': v for w, v in others.items()}

  def set(self, key, value):
    self.values[key] = value

  def get(self, key):
    if '/ready/' in key:  # the other workers are ready to time
      return True
    return self.values[key]


def line(rows: int) -> float:
  return 1e-3 + rows * 1e-4


def flat(rows: int) -> float:
  return 4e-3


def test_a_given_cost_per_row_measures_nothing():
  host = build_host(TRACE, 2, 3, row_s=2e-3, calibration=Calibration(None, (1, 2)))
  assert (host.row_s, host.fixed_s, host.factor(0)) == (2e-3, 0.0, 3.0)
  with pytest.raises(ConfigError, match='needs a cost per row'):
    build_host(TRACE, 0, 3)


def test_a_line_takes_the_margin_and_the_slowest_worker():
  board = Board({1: [3e-4, 1e-3, True, 1e-2], 2: [1e-4, 9e-3, True, 1e-2]})
  host = build_host(TRACE, 0, 3, calibration=Calibration(line, (10, 40)), board=board)
  assert board.values['calibrate/0'] == pytest.approx([MARGIN * 1e-4, MARGIN * 1e-3, True,
                                                       MARGIN * line(40) / 10])
  assert (host.row_s, host.fixed_s) == (3e-4, 9e-3)  # each the largest any worker offers
  alone = build_host(TRACE, 0, 3, calibration=Calibration(line, (10, 40)))
  assert (alone.row_s, alone.fixed_s) == pytest.approx((MARGIN * 1e-4, MARGIN * 1e-3))


def test_a_worker_of_two_devices_publishes_a_speed_one_hosts_cost():
  board = Board({0: [0.0, 0.0, True, 0.0], 2: [0.0, 0.0, True, 0.0]})
  host = build_host(TRACE, 1, 3, calibration=Calibration(line, (10, 40)), speed=2.0,
                    board=board)
  assert host.speed == 2.0 and host.row_s == pytest.approx(2 * MARGIN * 1e-4)


def test_one_size_is_all_per_row():
  calls = []
  calibration = Calibration(lambda units: calls.append(units) or 0.03, (12.5,), repeats=1)
  host = build_host(TRACE, 0, 3, calibration=calibration)
  assert calls == [12.5] and host.fixed_s == 0.0
  assert host.row_s == MARGIN * 0.03 / 12.5  # what ps, SchMP and replica hosts always took


def test_an_unresolved_line_is_measured_again_then_all_per_row(capsys):
  """The retries go to ``record`` (the run's run.json), the console gets the one notice
  (issue 44: every launch printed a retry line)."""
  calls, retries = [], []

  def measure(rows):
    calls.append(rows)
    return flat(rows)

  host = build_host(TRACE, 0, 1, calibration=Calibration(measure, (10, 42), repeats=5),
                    record=retries.append)
  assert len(calls) == 3 * 2 * 5  # three attempts of 5 rounds of two sizes
  assert host.fixed_s == 0.0 and host.row_s == pytest.approx(MARGIN * 4e-3 / 10)
  assert [r.split(' (')[0] for r in retries] == [
      f'worker 0: host calibration {a} of 3 resolved no cost per row' for a in (1, 2)]
  assert all(r.endswith('; measuring again') for r in retries)
  [notice] = capsys.readouterr().out.splitlines()
  assert 'no cost per row resolved on worker 0 ' in notice
  assert 'every host costs 0.6 ms a row' in notice


def test_a_second_attempt_that_resolves_the_line_is_kept(capsys, caplog):
  """Without ``record`` a retry goes to the ``hetjax.emulation`` logger, never the console."""
  attempts = iter([flat] * 10 + [line] * 10)
  with caplog.at_level('INFO', logger='hetjax.emulation'):
    host = build_host(TRACE, 1, 1,
                      calibration=Calibration(lambda r: next(attempts)(r), (10, 42)))
  assert (host.row_s, host.fixed_s) == pytest.approx((MARGIN * 1e-4, MARGIN * 1e-3))
  assert capsys.readouterr().out == ''
  [record] = caplog.records
  assert record.levelname == 'INFO' and 'measuring again' in record.getMessage()


def test_worker_0_records_every_workers_retries():
  """Worker 0 gathers the retries every worker published, so the run's record holds them all;
  another worker records none (its own are on the board)."""
  board = Board({1: [6e-4, 0.0, False, 6e-4], 2: [6e-4, 0.0, False, 6e-4]})
  board.values |= {'calibrate/retries/1': ['worker 1: again'], 'calibrate/retries/2': []}
  retries = []
  build_host(TRACE, 0, 3, calibration=Calibration(line, (10, 40)), board=board,
             record=retries.append, log=lambda line: None)
  assert retries == ['worker 1: again'] and board.values['calibrate/retries/0'] == []
  attempts, mine = iter([flat] * 12 + [line] * 10), []  # 2 untimed, then 2 attempts
  build_host(TRACE, 1, 3, calibration=Calibration(lambda r: next(attempts)(r), (10, 42)),
             board=board, record=mine.append, log=lambda line: None)
  assert mine == [] and 'measuring again' in board.values['calibrate/retries/1'][0]


def test_one_unresolved_worker_makes_every_host_all_per_row(capsys):
  """A fitted slope on one worker and noise on another: no mixed model; the largest all-per-row
  cost any worker offers, for all (worker 1's 4.5 ms over 10 rows here)."""
  board = Board({1: [6.75e-4, 0.0, False, 6.75e-4], 2: [MARGIN * 1e-4, 1e-3, True, 1e-5]})
  host = build_host(TRACE, 0, 3, calibration=Calibration(line, (10, 42)), board=board)
  assert host.fixed_s == 0.0 and host.row_s == max(6.75e-4, MARGIN * line(42) / 10)
  assert 'on worker 1 ' in capsys.readouterr().out


def test_hosts_all_per_row_give_a_3x_slow_worker_a_seventh_of_the_batch():
  """Why all per row: a host's time is then rows × cost × factor, so shares that even the
  hosts' times are 3/7, 3/7, 1/7 (a fitted fixed cost of 4 ms slowed 3× could not be evened)."""
  hosts = [build_host(TRACE, w, 3, calibration=Calibration(flat, (10, 42)),
                      log=lambda line: None) for w in range(3)]
  times = [h.target_s(0, n) for h, n in zip(hosts, (55, 55, 18), strict=True)]  # 128 rows
  assert max(times) / min(times) == pytest.approx(55 / 54)  # whole rows: 3 × 18 = 54


@pytest.mark.parametrize(('kwargs', 'needle'), [
    ({'sizes': ()}, 'at least one size'),
    ({'sizes': (10, 40), 'repeats': 0}, 'repeats must be an int >= 1, got 0'),
])
def test_bad_calibrations_are_config_errors(kwargs, needle):
  with pytest.raises(ConfigError, match=needle):
    Calibration(line, **kwargs)
  with pytest.raises(ConfigError, match='a calibration size must be a number > 0, got 0'):
    build_host(TRACE, 0, 1, calibration=Calibration(line, (0,)))


def test_workers_warm_every_size_then_meet_before_timing():
  """Each size runs once untimed (compiling), the worker says it is ready, and it times only
  once every worker is: all of them calibrate under the same contention."""
  events = []

  class Recording(Board):
    def set(self, key, value):
      events.append(('set', key))
      super().set(key, value)

    def get(self, key):
      events.append(('get', key))
      return super().get(key)

  def measure(rows):
    events.append(('measure', rows))
    return line(rows)

  board = Recording({1: [1e-4, 1e-3, True, 1e-2], 2: [1e-4, 1e-3, True, 1e-2]})
  build_host(TRACE, 0, 3, calibration=Calibration(measure, (10, 40), repeats=2), board=board)
  ready = events.index(('set', 'calibrate/ready/0'))
  assert events[:ready] == [('measure', 10), ('measure', 40)]
  assert events[ready + 1:ready + 4] == [('get', f'calibrate/ready/{w}') for w in range(3)]
  timed = [e for e in events[ready + 4:] if e[0] == 'measure']
  assert sorted(r for _, r in timed) == [10, 10, 40, 40]
  # Alone, nothing to wait for: no warm-up either (the calibration compiles as before).
  events.clear()
  build_host(TRACE, 0, 3, calibration=Calibration(measure, (10, 40), repeats=2))
  assert len(events) == 4


def test_a_given_fixed_cost_pins_the_host_with_its_cost_per_row():
  from hetjax.run import EmulationConfig

  host = build_host(StaticTrace((1, 3)), 1, 2, row_s=1e-3, fixed_s=2e-3)
  assert (host.row_s, host.fixed_s) == (1e-3, 2e-3)
  assert host.target_s(0, 10) == pytest.approx(3 * (2e-3 + 10 * 1e-3))
  with pytest.raises(ConfigError, match=r'host_fixed_s needs emulation\.host_row_s'):
    EmulationConfig(host_fixed_s=0.01)
