"""Token scheduling (Fela) trains the same SGD as one device, whatever split the pulls produce;
its virtual clock and end-game rule against hand-computed cases.

The multi-worker cases launch real local workers through `hetjax.runtime.launch_local` (always
with a timeout); one worker is an emulated host 200x slower, so the tokens split unevenly.
"""

import json
import pathlib
import sys

import jax
import numpy as np
import pytest

from hetjax import ConfigError, models
from hetjax.bench import may_leave
from hetjax.emulation import StaticTrace
from hetjax.runtime import launch_local
from hetjax.sharding import make_mesh
from hetjax.simulation import ClockCosts
from hetjax.simulation._tokens import simulate_tokens
from hetjax.train import Strategy, Trainer, takes_token, training_steps
from hetjax.train._tokens import TokenRules
from tests.conftest import require_devices
from tests.workers.common import MODELS, OPTIMIZER, STEPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 120
TOKEN_ROWS = 8  # 8 tokens of the 64-row batch


def _reference():
  kwargs, batch = MODELS['mlp']
  mesh = make_mesh((1, 1), devices=require_devices(1))
  trainer = Trainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch, mesh,
                    Strategy.DATA_PARALLEL.rules())
  infos = list(training_steps(trainer, trainer.init_state(), STEPS))
  return [float(i.metrics['loss']) for i in infos], jax.device_get(infos[-1].state.params)


# Hosts of known speed at 0.1 ms per row: a token of 8 rows takes 0.8 ms on a fast host and
# 160 ms on the 200x slow one, so it cannot keep up. Which fast worker gets most is up to the
# scheduler (with tokens this small, the first worker back from the combine may drain the queue).
@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
# (Two workers run tokens under the launcher in docs/heterogeneous.md's block: tests/test_readme.py.)
@pytest.mark.parametrize('workers, slowdown', [(4, 'static:1,1,200,1')])
def test_tokens_match_single_device_and_go_to_the_fast_workers(tmp_path, workers, slowdown):
  out = tmp_path / 'out.json'
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'train_tokens.py'), str(out),
             str(TOKEN_ROWS)]
  result = launch_local(command, workers=workers, slowdown=slowdown, timeout=LAUNCH_TIMEOUT,
                        init_timeout=60)
  assert result.returncode == 0, result
  got = json.loads(out.read_text())
  ref_losses, ref_params = _reference()
  np.testing.assert_allclose(got['losses'], ref_losses, rtol=1e-5)
  for got_leaf, ref_leaf in zip(got['params'], jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(np.asarray(got_leaf), ref_leaf, rtol=1e-4, atol=1e-6)
  tokens = np.array(got['rows']) // TOKEN_ROWS  # steps x workers
  assert tokens.shape == (STEPS, workers)
  assert (tokens.sum(axis=1) == 64 // TOKEN_ROWS).all(), tokens
  slow = slowdown.split(':')[1].split(',').index('200')
  done = tokens.sum(axis=0)
  assert done[slow] < np.delete(done, slow).mean(), tokens
  assert got['compiles'] == [1] * workers  # one token program per worker, compiled once


@pytest.mark.parametrize('kwargs, message', [
    ({'global_batch': 64, 'token_rows': 0}, 'token_rows must be an integer >= 1, got 0'),
    ({'global_batch': 64, 'token_rows': 12}, 'token_rows 12 does not divide the global batch 64'),
    ({'global_batch': 64, 'token_rows': 8, 'local_batch_degree': 3},
     'token_rows 8 is not a multiple of the local data-parallel degree 3'),
    ({'global_batch': 64, 'token_rows': 2.0}, 'token_rows must be an integer >= 1, got 2.0'),
    ({'global_batch': True, 'token_rows': 1}, 'global_batch must be an integer >= 1, got True'),
])
def test_token_rules_refuse_bad_sizes_in_one_line(kwargs, message):
  with pytest.raises(ConfigError) as e:
    TokenRules(**kwargs)
  assert str(e.value) == f'token rules: {message}'


def test_token_rules_cut_the_batch_into_contiguous_tokens():
  rules = TokenRules(global_batch=64, token_rows=8, local_batch_degree=2)
  assert rules.tokens == 8
  assert [rules.rows(t) for t in (0, 7)] == [slice(0, 8), slice(56, 64)]


def test_virtual_tokens_match_a_hand_computed_schedule():
  # Worker 1 is 3x slower; 8 rows in tokens of 2 at 1 ms per row; 1 ms per pull. Worker 0 takes
  # tokens at 0, 3 and 6 ms, worker 1 one at 0 ms (free at 7 ms, after the queue emptied at 6);
  # the empty pulls end at 10 and 8 ms; then 0.5 ms of host work.
  cost = ClockCosts(per_sample_s=1e-3, host_s=5e-4)
  run = simulate_tokens(StaticTrace((1, 3)), cost, 8, token_rows=2, steps=1, pull_s=1e-3)
  assert run.shares.tolist() == [[6, 2]]
  np.testing.assert_allclose(run.compute_s, [[6e-3, 6e-3]])
  np.testing.assert_allclose(run.iter_s, [10.5e-3])
  np.testing.assert_allclose(run.idle_fraction, [[0.0, 2e-3 / 10.5e-3]])
  np.testing.assert_allclose(run.balanced_limit_s, [8e-3 / (1 + 1 / 3) + 5e-4])


def test_the_end_game_leaves_the_last_tokens_to_the_fast_workers():
  # 16 tokens of 25 ms, worker 3 three times slower. Greedy: worker 3 takes a second token at
  # 75 ms and ends at 150 ms while the others are done at 125 ms. With the end game (from the
  # second step, when speeds are known) it leaves that token: 125 ms, LB-BSP's best split.
  cost = ClockCosts(per_sample_s=1e-3)
  trace = StaticTrace((1, 1, 1, 3))
  greedy = simulate_tokens(trace, cost, 400, 25, steps=3)
  endgame = simulate_tokens(trace, cost, 400, 25, steps=3, endgame=True)
  assert greedy.shares[2].tolist() == [125, 125, 100, 50]
  np.testing.assert_allclose(greedy.iter_s, [0.15] * 3)
  assert endgame.shares[2].tolist() == [125, 125, 125, 25]
  np.testing.assert_allclose(endgame.iter_s, [0.15, 0.125, 0.125])
  assert endgame.shares.sum(axis=1).tolist() == [400] * 3


@pytest.mark.parametrize('own, others, remaining, takes', [
    (3.0, [1.0, 1.0, 1.0], 6, False),  # the others complete 6 tokens by 2.5 < 3
    (3.0, [1.0, 1.0, 1.0], 7, True),   # the 7th completes at 3.5
    (1.0, [1.0, 1.0, 1.0], 1, True),   # as fast as the others: always takes
    (9.0, [1.0], 1, False),            # one other, 1.5 < 9
    (5.0, [1.0, 1.0], 0, False),       # nothing left
])
def test_takes_token_compares_its_finish_with_the_others(own, others, remaining, takes):
  assert takes_token(own, others, remaining) is takes
  if own < 1.5 * min(others):
    assert not may_leave(own, others)


def test_virtual_tokens_refuse_bad_sizes():
  with pytest.raises(ConfigError, match='token_rows 3 does not divide the global batch 8'):
    simulate_tokens(StaticTrace((1, 1)), ClockCosts(per_sample_s=1e-3), 8, 3, steps=1)


def test_prefetch_hides_the_round_trips_of_the_workers_the_end_game_keeps():
  # 2 equal workers, 4 tokens of 2 ms, 1 ms a pull. Step 0 (speeds unknown) pulls before each
  # token: two tokens each at 1 + 2 ms, then the empty pull: 7 ms. From step 1 a worker pulls
  # its next token as the current one starts, from its second token of the step on: tokens at
  # 1-3 and 4-6 ms, the empty pull (at 4-5 ms) inside the second: 6 ms.
  cost = ClockCosts(per_sample_s=1e-3)
  trace = StaticTrace((1, 1))
  serial = simulate_tokens(trace, cost, 8, 2, steps=2, pull_s=1e-3, endgame=True)
  ahead = simulate_tokens(trace, cost, 8, 2, steps=2, pull_s=1e-3, endgame=True, prefetch=True)
  np.testing.assert_allclose(serial.iter_s, [7e-3, 7e-3])
  np.testing.assert_allclose(ahead.iter_s, [7e-3, 6e-3])
  assert ahead.shares.tolist() == serial.shares.tolist() == [[4, 4], [4, 4]]
  # A worker that may leave tokens (3x slow) decides after each token, so it never prefetches:
  # it takes its first token and leaves the rest, as without prefetch.
  slow = StaticTrace((1, 1, 1, 3))
  keeps = simulate_tokens(slow, cost, 400, 25, steps=3, endgame=True, prefetch=True)
  assert keeps.shares[2].tolist() == [125, 125, 125, 25]


def _token_events(prefetch: bool):
  """One in-process worker's losses and its sequence of pulls, gradient launches and sums."""
  from hetjax import runtime
  from hetjax.train._tokens import TokenTrainer
  kwargs, batch = MODELS['mlp']
  events = []

  class Logged(runtime.LocalChannel):
    def increment(self, key, by=1):
      events.append('pull' if by else 'read')
      return super().increment(key, by)

  rules = TokenRules(batch, TOKEN_ROWS, prefetch=prefetch)
  trainer = TokenTrainer(models.make_task('mlp', **kwargs), OPTIMIZER, batch, rules, Logged())
  gradient, accumulate = trainer.local_gradient, trainer.accumulate
  trainer.local_gradient = lambda *a: (events.append('grad'), gradient(*a))[1]
  trainer.accumulate = lambda *a: (events.append('sum'), accumulate(*a))[1]
  losses, steps = [], []
  for info in training_steps(trainer, trainer.init_state(), 3, policy=rules):
    losses.append(float(info.metrics['loss']))
    steps.append(' '.join(events))
    events.clear()
  return losses, steps


def test_a_prefetching_worker_pulls_the_next_token_before_it_waits_for_the_current():
  ahead, ahead_steps = _token_events(prefetch=True)
  serial, serial_steps = _token_events(prefetch=False)
  assert ahead == serial  # the same tokens, summed in the same order
  tail = ' '.join(['grad pull sum'] * 7)  # tokens 2-8, then the empty pull
  # Step 1 (its own speed unknown) pulls after each token; from step 2, from the second token
  # on, before summing it (the first token's gradient has nothing to be summed with).
  assert ahead_steps[0] == serial_steps[0]
  assert ahead_steps[1] == ahead_steps[2] == f'pull grad pull {tail}'
  assert serial_steps[2] == 'pull grad pull ' + ' '.join(['grad sum pull'] * 7)
