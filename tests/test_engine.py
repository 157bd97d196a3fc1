"""The engine's shape: one loop over any step program, policies as values carried in the loop
and saved exactly, and the named head that carries every worker's timing."""

import dataclasses
import json
import math

import numpy as np
import pytest

from hetjax import ConfigError, bench
from hetjax import run as _programs
from hetjax.core import StepStats, Work, decode_state, encode_state
from hetjax.run import _hosts
from hetjax.train import Hook, training_steps
from hetjax.train._head import StepHead


@dataclasses.dataclass(frozen=True)
class _State:
  step: int


class _Program:
  """Runs nothing: a step's stats say which rows the decision gave, and take 1 s per row of the
  busiest worker (worker 1 is twice as slow)."""

  global_batch = 8

  def __init__(self):
    self.seen: list[tuple[int, object]] = []

  def global_batch_at(self, step):
    return {'x': np.full((8, 1), step)}

  def step(self, state, work, decision):
    assert work.step == state.step and int(work.batch['x'][0, 0]) == state.step
    self.seen.append((work.step, decision))
    rows = tuple(decision)
    busy = (float(rows[0]), 2.0 * rows[1])
    return _State(state.step + 1), StepStats(work.step, rows, busy, iter_s=max(busy))


@dataclasses.dataclass(frozen=True)
class _Proportional:
  """Shares of 8 rows ∝ the speeds seen so far (an integer pair), counting its updates."""

  name = 'test'

  def init(self):
    return {'shares': np.array([4, 4]), 'updates': 0}

  def update(self, state, stats):
    if stats is None:
      return tuple(state['shares'].tolist()), state
    speed = np.array(stats.rows) / np.array(stats.compute_s)
    first = int(np.rint(8 * speed[0] / speed.sum()))
    shares = np.array([first, 8 - first])
    return tuple(shares.tolist()), {'shares': shares, 'updates': state['updates'] + 1}


def test_the_loop_feeds_each_step_the_decision_learned_from_the_one_before():
  program = _Program()
  infos = list(training_steps(program, _State(0), 3, policy=_Proportional()))
  assert [d for _, d in program.seen] == [(4, 4), (5, 3), (5, 3)]
  assert [i.decision for i in infos] == [(4, 4), (5, 3), (5, 3)]
  assert [i.next_decision for i in infos] == [(5, 3), (5, 3), (5, 3)]
  assert [i.policy_state['updates'] for i in infos] == [1, 2, 3]
  assert [i.stats.rows for i in infos] == [(4, 4), (5, 3), (5, 3)]


def test_a_resumed_loop_continues_with_the_saved_policy_state():
  policy, whole = _Proportional(), _Program()
  list(training_steps(whole, _State(0), 5, policy=policy))
  first, rest = _Program(), _Program()
  saved = None

  def save(info):
    nonlocal saved
    saved = json.loads(json.dumps(encode_state(info.policy_state)))

  list(training_steps(first, _State(0), 2, [Hook(save, every=2)], policy=policy))
  list(training_steps(rest, _State(2), 5, policy=policy,
                      policy_state=decode_state(policy.init(), saved)))
  assert first.seen + rest.seen == whole.seen


def test_hooks_see_every_step_and_the_loop_stops_at_until():
  seen = []
  infos = list(training_steps(_Program(), _State(0), 4, [Hook(lambda i: seen.append(i.step),
                                                              every=3, at_end=True)],
                              policy=_Proportional()))
  assert [i.step for i in infos] == [1, 2, 3, 4] and seen == [3, 4]
  assert list(training_steps(_Program(), _State(4), 4, policy=_Proportional())) == []


def test_state_codec_keeps_kinds_shapes_and_non_finite_values():
  state = {'a': np.array([[1.5, math.nan], [math.inf, -math.inf]]), 'n': 3, 'f': 0.1,
           'b': True, 'empty': np.zeros((0, 4)), 'i': np.arange(3, dtype=np.int32),
           'nested': (np.float32(2.5), {'x': -1})}
  back = decode_state(state, json.loads(json.dumps(encode_state(state))))
  np.testing.assert_array_equal(back['a'], state['a'])
  assert back['empty'].shape == (0, 4) and back['i'].dtype == np.int32
  assert back['n'] == 3 and type(back['n']) is int and back['f'] == 0.1 and back['b'] is True
  assert back['nested'][0] == np.float32(2.5) and back['nested'][1] == {'x': -1}


def test_state_codec_refuses_a_state_of_another_policy():
  with pytest.raises(ConfigError, match='saved policy state has 1 leaves; this policy keeps 2'):
    decode_state({'a': 0, 'b': 0}, encode_state({'a': 0}))


def test_step_head_names_every_workers_slots():
  head = StepHead(3)
  values = np.zeros(head.size)
  for worker in range(3):
    values[list(head.slots(worker))] += [0.1 * (worker + 1), worker, worker != 1, 10 * worker,
                                         0.5 * worker, worker != 2]
  values[0] = 2.5
  read = head.read(values)
  assert read['loss'] == 2.5
  np.testing.assert_allclose(read['busy_s'], [0.1, 0.2, 0.3])
  np.testing.assert_array_equal(read['load'], [0, 1, 2])
  np.testing.assert_array_equal(read['sampled'], [1, 0, 1])
  np.testing.assert_array_equal(read['rows'], [0, 10, 20])
  np.testing.assert_allclose(read['compile_s'], [0.0, 0.5, 1.0])
  np.testing.assert_array_equal(read['ready'], [1, 1, 0])


@pytest.mark.parametrize('batch, workers, degree, bucket', [
    (256, 3, 1, 4), (256, 4, 1, 4), (2048, 4, 1, 32), (256, 1, 8, 16), (100, 3, 1, 2),
    (96, 5, 2, 2)])
def test_default_bucket_divides_the_global_batch_for_any_worker_count(batch, workers, degree,
                                                                      bucket):
  got = bench.default_bucket(batch, workers, degree)
  assert got == bucket and batch % got == 0 and got % degree == 0


def test_default_token_rows_gives_about_four_tokens_per_worker():
  assert bench.default_token_rows(256, 3, 1) == 16
  assert bench.default_token_rows(64, 2, 1) == 8
  with pytest.raises(ConfigError, match='degree 3 does not divide the global batch 64'):
    bench.default_token_rows(64, 2, 3)


@pytest.mark.parametrize('flags, endgame, prefetch', [
    ([], True, True), (['balance.prefetch=false'], True, False), (['endgame=false'], False, True)])
def test_mode_tokens_builds_its_rules_from_the_config(flags, endgame, prefetch):
  from hetjax import run, runtime
  config = run.override(run.load_config('mlp'),
                        ['mode=tokens', 'mesh=8x1', 'token_rows=64', *flags])
  built = _programs.build(config, runtime.WorkerContext(0, 1, None), None)
  rules = built.program.tokens
  assert (rules.endgame, rules.prefetch, rules.token_rows) == (endgame, prefetch, 64)
  assert built.policy is rules


def test_work_and_stats_are_values():
  stats = StepStats(1, (2, 3), (0.5, 0.25), sync_s=0.1)
  assert stats.wait_s == (0.0, 0.25) and stats.workers == 2 and math.isnan(stats.loss)
  with pytest.raises(dataclasses.FrozenInstanceError):
    Work(0, {}).step = 1  # type: ignore[misc]


def test_the_oracle_under_train_py_knows_its_hosts_costs():
  """`--policy=oracle` gets the emulated hosts' per-row and fixed costs, not only the trace."""
  from hetjax import balance, run, runtime
  from hetjax import run as _programs

  config = run.override(run.load_config('mlp'), [
      'mode=shares', 'policy=oracle', 'slowdown=static:1', 'host_row_s=1e-4', 'mesh=8x1',
      'global_batch=64'])
  built = _programs.build(config, runtime.WorkerContext(0, 1, None), None)
  assert isinstance(built.policy, balance.Oracle)
  assert built.host.row_s == 1e-4 and tuple(built.policy.row_s) == (1e-4,)  # one per worker
  assert built.policy.fixed_s == built.host.fixed_s


def test_a_token_job_calibrates_its_host_on_a_stream_of_token_calls(monkeypatch):
  """Mode tokens: the host is fitted to single calls at the token size and a uniform share,
  alternating, scaled to the tail of their slow spells (`_hosts.TAIL`), not to medians."""
  from hetjax import emulation, run, runtime
  from hetjax.emulation import _build_host

  seen, calibrate = [], emulation.calibrate_row_cost

  def spy(measure, rows, **kwargs):
    cost = calibrate(measure, rows, **kwargs)
    seen.append((tuple(rows), kwargs, cost))
    return cost

  monkeypatch.setattr(_build_host, 'calibrate_row_cost', spy)
  monkeypatch.setattr(_hosts, 'STREAM_CALLS', 3)
  ctx = runtime.WorkerContext(0, 1, None)
  for mode, sizes, kwargs in [
      ('tokens', (256, 2048), {'repeats': 3, 'tail': _hosts.TAIL}),
      ('shares', (512, 2048), {'repeats': 5, 'tail': None})]:
    config = run.override(run.load_config('mlp'), [
        f'mode={mode}', 'slowdown=static:2', 'mesh=8x1', 'global_batch=2048', 'token_rows=256'])
    built = _programs.build(config, ctx, None)
    rows, used, cost = seen.pop()
    assert (rows, used) == (sizes, {'margin': _hosts.MARGIN, **kwargs})
    assert (built.host.row_s, built.host.fixed_s) == (cost.row_s, cost.fixed_s)
    assert built.program.pace is built.host and built.host.factor(0) == 2.0
    assert len(cost.measured) == 2 * (3 if mode == 'tokens' else 5)
    assert cost.scale >= _hosts.MARGIN
