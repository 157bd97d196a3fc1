"""Slowdown traces, their text specs, and time dilation."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.runtime._slowdown import (
    CsvTrace,
    MarkovTrace,
    SlowdownTrace,
    StaticTrace,
    StepChangeTrace,
    TimeDilation,
    dilation_seconds,
    parse_slowdown,
)


def test_none_and_static_values():
  assert parse_slowdown('none', 3).factors(0).tolist() == [1.0, 1.0, 1.0]
  trace = parse_slowdown('static:1,1,1,3', 4)
  assert trace == StaticTrace((1, 1, 1, 3))
  assert trace.factors(7).tolist() == [1.0, 1.0, 1.0, 3.0]
  assert trace.factor(3, 12345) == 3.0 and trace.workers == 4
  assert parse_slowdown('static:2', 3).factors(0).tolist() == [2.0, 2.0, 2.0]
  assert trace.describe() == 'static 1,1,1,3'
  trace.factors(0)[3] = 100.0  # callers get a copy
  assert trace.factor(3, 0) == 3.0
  for t in (trace, parse_slowdown('markov:2:0.5', 2), parse_slowdown('step:1:1:2', 2)):
    assert isinstance(t, SlowdownTrace)


def test_step_change_boundary():
  trace = parse_slowdown('step:20:1,1,1,1:1,1,1,3', 4)
  assert trace == StepChangeTrace(20, (1, 1, 1, 1), (1, 1, 1, 3))
  assert trace.factors(19).tolist() == [1.0] * 4
  assert trace.factors(20).tolist() == [1.0, 1.0, 1.0, 3.0]
  assert trace.factor(3, 10**6) == 3.0
  assert parse_slowdown('step:0:5:2', 2).factors(0).tolist() == [2.0, 2.0]
  assert 'step at 20' in trace.describe()


def _chain(trace: MarkovTrace, steps) -> np.ndarray:
  return np.stack([trace.factors(t) for t in steps])


def test_markov_is_deterministic_in_any_query_order():
  steps = np.arange(10_000)  # several chunks
  forward = _chain(MarkovTrace(4, slow=3.0, stay=0.9, seed=7), steps)
  order = np.random.default_rng(0).permutation(steps)
  shuffled = _chain(MarkovTrace(4, slow=3.0, stay=0.9, seed=7), order)
  np.testing.assert_array_equal(shuffled[np.argsort(order)], forward)
  backward = MarkovTrace(4, slow=3.0, stay=0.9, seed=7)
  assert backward.factors(9_999).tolist() == forward[-1].tolist()  # far step first
  assert set(np.unique(forward)) == {1.0, 3.0}
  assert forward[0].tolist() == [1.0] * 4  # starts fast
  other = _chain(MarkovTrace(4, slow=3.0, stay=0.9, seed=8), steps)
  assert not np.array_equal(other, forward)


def test_markov_worker_chain_does_not_depend_on_other_workers():
  steps = range(600)
  alone = _chain(MarkovTrace(2048, slow=2.0, stay=0.8, seed=3, slow_workers=(3,)), steps)
  everyone = _chain(MarkovTrace(2048, slow=2.0, stay=0.8, seed=3), steps)  # smaller chunks
  np.testing.assert_array_equal(alone[:, 3], everyone[:, 3])
  assert (np.delete(alone, 3, axis=1) == 1.0).all()


def test_markov_long_run_statistics():
  # Symmetric two-state chain: stationary slow fraction 1/2, lag-k correlation ρᵏ with
  # ρ = 2·stay − 1 = 0.8, so the mean of N steps has sd √(¼·(1+ρ)/(1−ρ)/N) = 0.0047 per worker
  # at N = 10⁵, 0.0024 over 4 independent workers; 0.015 is > 6 sd. Flips are independent
  # Bernoulli(1 − stay): sd √(0.09 / 4·10⁵) = 0.0005, tolerance 0.003.
  slow = _chain(MarkovTrace(4, slow=3.0, stay=0.9, seed=11), range(100_000)) == 3.0
  assert abs(slow.mean() - 0.5) < 0.015
  assert abs(np.diff(slow, axis=0).mean() - 0.1) < 0.003


def test_markov_extremes_and_affected_workers():
  assert (_chain(MarkovTrace(2, slow=4.0, stay=1.0), range(50)) == 1.0).all()
  alternating = _chain(MarkovTrace(1, slow=4.0, stay=0.0), range(6))[:, 0]
  assert alternating.tolist() == [1.0, 4.0, 1.0, 4.0, 1.0, 4.0]
  trace = parse_slowdown('markov:3:0.9:seed=7:workers=0+3', 4)
  assert trace == MarkovTrace(4, 3.0, 0.9, seed=7, slow_workers=(0, 3))
  assert trace.describe() == 'markov slow 3x stay 0.9 seed 7 on workers 0+3'
  assert (_chain(trace, range(2000))[:, [1, 2]] == 1.0).all()
  assert parse_slowdown('markov:3:0.9', 4) == MarkovTrace(4, 3.0, 0.9, seed=0)


def test_csv_round_trip(tmp_path):
  rows = np.array([[1.0, 2.5], [1.0, 3.0], [1.5, 1.0]])
  plain, headed = tmp_path / 'plain.csv', tmp_path / 'headed.csv'
  np.savetxt(plain, rows, delimiter=',')
  headed.write_text('worker0,worker1\n' + plain.read_text() + '\n')
  for path in (plain, headed):
    trace = parse_slowdown(f'csv:{path}', 2)
    np.testing.assert_array_equal(np.stack([trace.factors(t) for t in range(3)]), rows)
    assert trace.factors(3).tolist() == trace.factors(10**6).tolist() == [1.5, 1.0]
    assert str(path) in trace.describe()
  assert CsvTrace(rows).factor(1, 0) == 2.5


@pytest.mark.parametrize(('spec', 'needle'), [
    ('fast', "unknown trace 'fast'; choose one of: none, static, step, markov, csv"),
    ('static:1,1,3', 'static has 3 factors for 4 workers'),
    ('step:3:1,1:1,1,1,3', 'before has 2 factors for 4 workers'),
    ('static:0', 'factor 0.0; factors must be finite and > 0'),
    ('static:1,-2,1,1', 'factor -2.0'),
    ('static:nan', 'factor nan'),
    ('static:1,1,inf,1', 'factor inf'),
    ('static:1,x,1,1', "factor 'x' is not a number"),
    ('markov:0:0.5', 'markov slow factor has factor 0.0'),
    ('markov:3:1.5', 'stay probability 1.5 is outside [0, 1]'),
    ('markov:3:-0.1', 'stay probability -0.1 is outside [0, 1]'),
    ('markov:3:nan', 'stay probability nan is outside [0, 1]'),
    ('markov:3', 'expected markov:SLOW:STAY'),
    ('markov:3:0.9:speed=2', 'bad markov options'),
    ('markov:3:0.9:seed=-1', "markov seed '-1' must be an integer >= 0"),
    ('markov:3:0.9:workers=1+4', 'must be distinct ids in [0, 4)'),
    ('markov:3:0.9:workers=1+1', 'must be distinct ids'),
    ('step:-1:1:3', "step change at '-1' must be an integer >= 0"),
    ('step:2.5:1:3', "step change at '2.5'"),
    ('step:1:1', 'expected step:AT:BEFORE:AFTER'),
    ('none:2', 'expected none'),
    ('csv:/no/such/file.csv', 'cannot read csv /no/such/file.csv'),
])
def test_parse_errors(spec, needle):
  with pytest.raises(ConfigError) as info:
    parse_slowdown(spec, 4)
  message = str(info.value)
  assert message.startswith(f'slowdown {spec!r}: ') and needle in message
  assert '\n' not in message


@pytest.mark.parametrize(('text', 'needle'), [
    ('1,1,1,1\n1,1,3\n', 'line 2 has 3 columns, expected 4'),
    ('a,b,c,d\n1,1,1,1\n1,1,oops,1\n', "line 3: cell 'oops' is not a number"),
    ('1,1,1,1\n1,x,1,1\n', "line 2: cell 'x' is not a number"),
    ('1,1,1,0\n', 'has factor 0.0'),
    ('1,1,nan,1\n', 'has factor nan'),
    ('w0,w1,w2,w3\n', 'has no data rows'),
    ('', 'has no data rows'),
])
def test_csv_errors(tmp_path, text, needle):
  path = tmp_path / 'trace.csv'
  path.write_text(text)
  with pytest.raises(ConfigError, match=r'^slowdown ') as info:
    parse_slowdown(f'csv:{path}', 4)
  assert needle in str(info.value) and str(path) in str(info.value)
  with pytest.raises(ConfigError, match='cannot read csv'):
    parse_slowdown(f'csv:{tmp_path}', 4)  # a directory


def test_bad_steps_and_workers():
  with pytest.raises(ConfigError, match='step -1 is negative'):
    parse_slowdown('markov:3:0.9', 2).factors(-1)
  with pytest.raises(ConfigError, match='worker 2 out of range for 2 workers'):
    parse_slowdown('static:1,3', 2).factor(2, 0)
  with pytest.raises(ConfigError, match='workers must be >= 1'):
    parse_slowdown('none', 0)


def test_dilation_seconds():
  assert dilation_seconds(3.0, 0.1) == pytest.approx(0.2, rel=1e-12)
  assert dilation_seconds(1.0, 5.0) == 0.0
  assert dilation_seconds(0.5, 1.0) == 0.0  # faster than itself: clipped, never negative
  assert dilation_seconds(2.0, 0.0) == 0.0
  with pytest.raises(ConfigError, match=r'factor 0\.0'):
    dilation_seconds(0.0, 1.0)
  with pytest.raises(ConfigError, match=r'compute time -1\.0 must be >= 0'):
    dilation_seconds(2.0, -1.0)
  with pytest.raises(ConfigError, match='compute time nan'):
    dilation_seconds(2.0, math.nan)


def test_time_dilation_sleeps_the_dilation():
  trace = StaticTrace((1.0, 3.0))
  start = time.perf_counter()
  assert TimeDilation(trace, worker=0).apply(0, compute_s=0.05) == 0.0
  assert time.perf_counter() - start < 0.01  # factor 1 does not sleep
  slept = TimeDilation(trace, worker=1).apply(0, compute_s=0.03)  # sleeps 2 × 0.03 s
  # time.sleep never returns early; the upper bound only allows for scheduler lateness.
  assert 0.06 <= slept < 0.06 + 0.05
  with pytest.raises(ConfigError, match='worker 2 out of range'):
    TimeDilation(trace, worker=2)
