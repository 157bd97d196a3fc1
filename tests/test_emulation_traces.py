"""Slowdown traces and their one text grammar (`hetjax.emulation.parse_trace`)."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from hetjax._errors import ConfigError
from hetjax.bench import HostPause
from hetjax.emulation import (
  ComposedTrace,
  CsvTrace,
  MarkovTrace,
  SlowdownTrace,
  StaticTrace,
  StepChangeTrace,
  TransientTrace,
  parse_trace,
)

STEP_S = 0.06


def test_none_and_static_values():
  assert parse_trace('none', 3).factors(0).tolist() == [1.0, 1.0, 1.0]
  trace = parse_trace('static:1,1,1,3', 4)
  assert trace == StaticTrace((1, 1, 1, 3))
  assert trace.factors(7).tolist() == [1.0, 1.0, 1.0, 3.0]
  assert trace.factor(3, 12345) == 3.0 and trace.workers == 4
  assert parse_trace('static:2', 3).factors(0).tolist() == [2.0, 2.0, 2.0]
  assert trace.describe() == 'static 1,1,1,3'
  trace.factors(0)[3] = 100.0  # callers get a copy
  assert trace.factor(3, 0) == 3.0
  for t in (trace, parse_trace('markov:2:0.5', 2), parse_trace('step:1:1:2', 2)):
    assert isinstance(t, SlowdownTrace)


def test_step_change_boundary():
  trace = parse_trace('step:20:1,1,1,1:1,1,1,3', 4)
  assert trace == StepChangeTrace(20, (1, 1, 1, 1), (1, 1, 1, 3))
  assert trace.factors(19).tolist() == [1.0] * 4
  assert trace.factors(20).tolist() == [1.0, 1.0, 1.0, 3.0]
  assert trace.factor(3, 10**6) == 3.0
  assert parse_trace('step:0:5:2', 2).factors(0).tolist() == [2.0, 2.0]
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
  trace = parse_trace('markov:3:0.9:seed=7:workers=0+3', 4)
  assert trace == MarkovTrace(4, 3.0, 0.9, seed=7, slow_workers=(0, 3))
  assert trace.describe() == 'markov slow 3x stay 0.9 seed 7 on workers 0+3'
  assert (_chain(trace, range(2000))[:, [1, 2]] == 1.0).all()
  assert parse_trace('markov:3:0.9', 4) == MarkovTrace(4, 3.0, 0.9, seed=0)


def test_csv_round_trip(tmp_path):
  rows = np.array([[1.0, 2.5], [1.0, 3.0], [1.5, 1.0]])
  plain, headed = tmp_path / 'plain.csv', tmp_path / 'headed.csv'
  np.savetxt(plain, rows, delimiter=',')
  headed.write_text('worker0,worker1\n' + plain.read_text() + '\n')
  for path in (plain, headed):
    trace = parse_trace(f'csv:{path}', 2)
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
    parse_trace(spec, 4)
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
    parse_trace(f'csv:{path}', 4)
  assert needle in str(info.value) and str(path) in str(info.value)
  with pytest.raises(ConfigError, match='cannot read csv'):
    parse_trace(f'csv:{tmp_path}', 4)  # a directory


def test_bad_steps_and_workers():
  with pytest.raises(ConfigError, match='step -1 is negative'):
    parse_trace('markov:3:0.9', 2).factors(-1)
  with pytest.raises(ConfigError, match='worker 2 out of range for 2 workers'):
    parse_trace('static:1,3', 2).factor(2, 0)
  with pytest.raises(ConfigError, match='workers must be >= 1'):
    parse_trace('none', 0)


# --- SDPipe's injections as traces -----------------------------------------------------------


@pytest.mark.parametrize(('spec', 'seed'), [('transient:3:0.3', 0), ('transient:1:0.1:seed=5', 5),
                                            ('transient:3:0.5:seed=2', 2)])
def test_transient_draws_are_sdpipes_and_pad_a_replica(spec, seed):
  """SDPipe's draw, ``default_rng([seed, worker, step]).random() < p``, and a replica's
  `HostPause` pads its step to (1 + delay) × its step time."""
  h, p = (float(v) for v in spec.split(':seed=')[0].split(':')[1:3])
  trace = parse_trace(spec, 4)
  for worker in range(4):
    pause = HostPause.of_step(spec.split(':seed=')[0], 4, worker, STEP_S, seed=seed)
    for step in range(300):
      hit = np.random.default_rng([seed, worker, step]).random() < p
      assert trace.delay(worker, step) == (h if hit else 0.0)
      assert pause.target_s(step) == pytest.approx((1.0 + trace.delay(worker, step)) * STEP_S)
      assert trace.factor(worker, step) == 1.0
  hits = np.stack([trace.delays(t) for t in range(300)]) > 0
  assert 0 < hits.mean() < 1 and not (hits == hits[:, :1]).all()  # workers draw apart


def test_transient_trace_values_and_defaults():
  trace = parse_trace('transient:3', 4)
  assert trace == TransientTrace(4, h=3.0, p=0.1, seed=0) and isinstance(trace, SlowdownTrace)
  assert parse_trace('transient:3:0.5:seed=2', 4) == TransientTrace(4, 3.0, 0.5, seed=2)
  assert trace.describe() == 'transient 3x a step with p 0.1 seed 0 on all 4 workers'
  delays = np.stack([trace.delays(t) for t in range(500)])
  assert set(np.unique(delays)) == {0.0, 3.0}
  assert (np.stack([trace.factors(t) for t in range(50)]) == 1.0).all()
  for t in (0, 17, 499):
    assert trace.delays(t).tolist() == [trace.delay(w, t) for w in range(4)]
  backward = TransientTrace(4, 3.0)  # a pure function of (seed, worker, step): any order
  np.testing.assert_array_equal(np.stack([backward.delays(t) for t in range(499, -1, -1)]),
                                delays[::-1])
  assert not (parse_trace('transient:3:0', 4).delays(7) > 0).any()  # p = 0: never
  assert (parse_trace('transient:2:1', 4).delays(7) == 2.0).all()  # p = 1: always
  with pytest.raises(ConfigError, match='worker 4 out of range for 4 workers'):
    trace.delay(4, 0)
  with pytest.raises(ConfigError, match='step -1 is negative'):
    trace.delays(-1)


def test_persistent_is_a_static_trace_and_slows_one_replica():
  trace = parse_trace('persistent:1:3', 4)
  assert trace == StaticTrace((1, 3, 1, 1))
  for worker in range(4):
    pause = HostPause.of_step('persistent:1:3', 4, worker, STEP_S)
    assert all(pause.target_s(s) == pytest.approx(trace.factor(worker, s) * STEP_S)
               for s in range(20))
  assert parse_trace('persistent:0:0.5', 2).factors(3).tolist() == [0.5, 1.0]


def test_only_transients_have_delays(tmp_path):
  path = tmp_path / 'trace.csv'
  path.write_text('1,2\n3,1\n')
  for spec in ('none', 'static:1,3', 'step:2:1:3', 'markov:3:0.5', f'csv:{path}',
               'persistent:1:2'):
    trace = parse_trace(spec, 2)
    assert all(trace.delays(t).tolist() == [0.0, 0.0] for t in range(5))
    assert trace.delay(1, 3) == 0.0


def test_composed_traces_multiply_factors_and_add_delays():
  trace = parse_trace('static:1,1,2,2*transient:1:0.5:seed=3*step:2:1:1,3,1,1', 4)
  assert isinstance(trace, ComposedTrace) and isinstance(trace, SlowdownTrace)
  assert trace == ComposedTrace((StaticTrace((1, 1, 2, 2)), TransientTrace(4, 1.0, 0.5, seed=3),
                                 StepChangeTrace(2, (1,) * 4, (1, 3, 1, 1))))
  assert trace.factors(1).tolist() == [1.0, 1.0, 2.0, 2.0]
  assert trace.factors(2).tolist() == [1.0, 3.0, 2.0, 2.0]
  transient = TransientTrace(4, 1.0, 0.5, seed=3)
  for t in range(40):
    assert trace.delays(t).tolist() == transient.delays(t).tolist()
    assert [trace.delay(w, t) for w in range(4)] == transient.delays(t).tolist()
  both = parse_trace('transient:1:1*transient:2:1', 2)
  assert both.delays(0).tolist() == [3.0, 3.0] and both.delay(1, 0) == 3.0
  assert trace.describe() == ('static 1,1,2,2 * transient 1x a step with p 0.5 seed 3 on all 4 '
                              'workers * step at 2: 1 on all 4 workers -> 1,3,1,1')
  with pytest.raises(ConfigError, match=r'parts of one size, got workers \[2, 3\]'):
    ComposedTrace((StaticTrace((1, 1)), StaticTrace((1, 1, 1))))
  with pytest.raises(ConfigError, match='worker 2 out of range'):
    both.delay(2, 0)


@pytest.mark.parametrize(('spec', 'needle'), [
    ('fast', 'choose one of: none, static, step, markov, csv, transient, persistent'),
    ('transient', 'expected transient:H[:P][:seed=N]'),
    ('transient:1:0.1:0.2', 'expected transient:H[:P][:seed=N]'),
    ('transient:seed=1', 'expected transient:H[:P][:seed=N]'),
    ('transient:-1', 'transient delay h -1.0 must be finite and >= 0'),
    ('transient:inf', 'transient delay h inf'),
    ('transient:nan', 'transient delay h nan'),
    ('transient:x', "transient delay h 'x' is not a number"),
    ('transient:1:1.5', 'transient probability 1.5 is outside [0, 1]'),
    ('transient:1:nan', 'transient probability nan is outside [0, 1]'),
    ('transient:1:seed=-2', "transient seed '-2' must be an integer >= 0"),
    ('transient:1:workers=1', "bad transient options 'workers=1'; known: seed=N"),
    ('transient:1:seed=1:seed=2', 'bad transient options'),
    ('markov:3:0.9:speed=2', "bad markov options 'speed=2'; known: seed=N, workers=I+J"),
    ('persistent:1', 'expected persistent:W:F'),
    ('persistent:4:3', 'persistent worker 4 is not one of the 4 workers'),
    ('persistent:-1:3', "persistent worker '-1' must be an integer >= 0"),
    ('persistent:1:0', 'persistent has factor 0.0'),
    ('persistent:1:x', "persistent factor 'x' is not a number"),
    ('static:2*', "unknown trace ''"),
    ('static:2*nope:1', "unknown trace 'nope'"),
    ('static:1,1,1,3*static:1,3', 'static has 2 factors for 4 workers'),
])
def test_parse_errors_of_the_new_forms(spec, needle):
  with pytest.raises(ConfigError) as info:
    parse_trace(spec, 4)
  message = str(info.value)
  assert message.startswith(f'slowdown {spec!r}: ') and needle in message
  assert '\n' not in message


def test_the_package_imports_only_numpy_the_errors_and_the_link_model():
  # hetjax.emulation sits below runtime, train, balance, pipeline and sync: it may not import them.
  # The α–β link model (hetjax._links, re-exported by core) is pure arithmetic, no JAX; the value
  # checks (hetjax._checks) are the root's too.
  allowed = {'__future__', 'collections', 'contextlib', 'csv', 'dataclasses', 'enum', 'functools',
             'itertools', 'logging', 'math', 'numbers', 'time', 'typing', 'numpy',
             'hetjax._checks', 'hetjax._errors', 'hetjax._links'}
  package = pathlib.Path(__file__).parents[1] / 'hetjax' / 'emulation'
  for path in package.glob('*.py'):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
      else:
        continue
      for name in names:
        assert name in allowed or name.startswith(('collections.', 'hetjax.emulation')), \
            f'{path.name} imports {name}'
