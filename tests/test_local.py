"""Local SGD (DiLoCo, `hetjax.train.LocalTrainer`): exact against the plain steps it stands for.

- One inner step a round, outer SGD at rate 1: the rows-weighted average of the workers'
  parameters is synchronous data parallelism's step (launched workers, unequal shares).
- H inner steps on one worker: H plain steps, then the outer optimizer on θ_start − θ.
- `hetjax.balance.RoundPolicy` holds its shares for a round and learns at its end only.
- The config: a run of mode shares under ``local.inner_steps``, its resume and `load_model`;
  refusals in one line.
"""

import json
import pathlib
import sys

import jax
import numpy as np
import optax
import pytest

from hetjax import balance, models, run, train
from hetjax._errors import ConfigError
from hetjax.core import ShareRules, StepStats, Work
from hetjax.runtime import launch_local
from hetjax.sharding import make_mesh
from tests.conftest import require_devices
from tests.workers.common import MODELS, OPTIMIZER, STEPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 180


def _task():
  kwargs, batch = MODELS['mlp']
  return models.make_task('mlp', **kwargs), batch


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_one_inner_step_with_outer_sgd_at_one_is_synchronous_training(tmp_path):
  task, batch = _task()
  mesh = make_mesh((1, 1), devices=require_devices(1))
  reference = train.Trainer(task, OPTIMIZER, batch, mesh, train.Strategy.DATA_PARALLEL.rules())
  infos = list(train.training_steps(reference, reference.init_state(), STEPS))
  want_losses = [float(i.metrics['loss']) for i in infos]
  want = jax.tree.leaves(jax.device_get(infos[-1].state.params))
  out = tmp_path / 'out.json'
  command = [sys.executable, str(ROOT / 'tests' / 'workers' / 'train_local.py'), str(out), '1',
             json.dumps([[40, 24]]), 'sgd1']
  result = launch_local(command, workers=2, devices_per_worker=1, timeout=LAUNCH_TIMEOUT,
                        init_timeout=60)
  assert result.returncode == 0, result
  got = json.loads(out.read_text())
  # Momentum SGD inside each worker, constant shares: Σ wᵢ mᵢ follows the synchronous momentum.
  np.testing.assert_allclose(got['losses'], want_losses, rtol=2e-6)
  for a, b in zip(got['params'], want, strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=2e-7)


def test_rounds_on_one_worker_are_plain_steps_then_the_outer_update():
  task, batch = _task()
  inner, outer, h = optax.adam(1e-2), optax.sgd(0.7, momentum=0.9, nesterov=True), 3
  local = train.LocalTrainer(task, inner, batch, steps_per_round=h, outer=outer)  # 8 devices
  state = local.init_state()
  for s in range(2 * h):
    state, stats = local.step(state, Work(s, local.global_batch_at(s)), (batch,))
  assert int(state.step) == 2 * h and stats.rows == (batch,)

  plain = train.WorkerTrainer(task, inner, batch)
  ref = plain.init_state()
  start = jax.device_get(plain.local_view(ref.params))
  outer_state = outer.init(start)
  for r in range(2):
    for s in range(r * h, (r + 1) * h):
      ref, _ = plain.step(ref, Work(s, plain.global_batch_at(s)), (batch,))
    end = jax.device_get(plain.local_view(ref.params))
    updates, outer_state = outer.update(jax.tree.map(np.subtract, start, end), outer_state,
                                        start)
    start = optax.apply_updates(start, updates)
    ref = train.TrainState(ref.step, jax.tree.map(
        lambda x, v: jax.device_put(np.asarray(v), x.sharding), ref.params, start),
        ref.opt_state)
  got = jax.tree.leaves(jax.device_get(local.local_view(state.params)))
  for a, b in zip(got, jax.tree.leaves(start), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  # The inner state carried over the round: the stacked row is worker 0's Adam state after 2h.
  assert int(jax.tree.leaves(state.inner)[0][0]) == 2 * h


def test_round_policy_holds_shares_and_learns_at_a_rounds_end():
  rules = ShareRules(64, 2, 8)
  policy = balance.RoundPolicy(balance.make_policy('proportional', rules), steps_per_round=4)
  shares, state = policy.update(policy.init(), None)
  assert tuple(shares) == (32, 32)
  slow = StepStats(0, rows=(32, 32), compute_s=(1.0, 3.0))
  for step in range(3):  # inside the round: held, whatever the stats say
    held, state = policy.update(state, StepStats(step, (32, 32), (1.0, 3.0)))
    assert tuple(held) == (32, 32)
  moved, state = policy.update(state, StepStats(3, slow.rows, slow.compute_s))
  assert moved[0] > moved[1] and sum(moved) == 64
  assert tuple(policy.update(state, StepStats(4, (32, 32), (1.0, 1.0)))[0]) == tuple(moved)


def _config(**local):
  return run.Config(model=run.ModelConfig('mlp', {'hidden': 32, 'width': 16}),
                    data=run.DataConfig(global_batch=32),
                    optimizer=run.OptimizerConfig('sgd', 0.1, steps=8),
                    parallelism=run.ParallelismConfig(mode='shares', mesh='8x1'),
                    local=run.LocalConfig(**local))


@pytest.mark.parametrize('local, checkpoint, message', [
    ({'inner_steps': 3}, 6, 'optimizer.steps (8) and checkpoint.every (6) must be multiples of '
                            'local.inner_steps (3)'),
    ({'inner_steps': 4}, 6, 'checkpoint.every (6) must be multiples'),
])
def test_rounds_must_hold_the_runs_steps_and_checkpoints(tmp_path, local, checkpoint, message):
  config = _config(**local)
  config = run.override(config, [f'checkpoint.every={checkpoint}'])
  with pytest.raises(ConfigError, match=message.replace('(', r'\(').replace(')', r'\)')):
    run.train(config, tmp_path / 'run')


@pytest.mark.parametrize('field, value, message', [
    ('inner_steps', -1, 'local.inner_steps must be >= 0'),
    ('cutoff', 0.5, 'local.cutoff must be 0'),
    ('outer', 'adam', "unknown local.outer 'adam'"),
    ('outer_momentum', 1.0, r'local.outer_momentum must be in \[0, 1\)'),
    ('outer_lr', 0.0, 'local.outer_lr must be > 0'),
])
def test_bad_local_fields_are_one_line_errors(field, value, message):
  with pytest.raises(ConfigError, match=message):
    run.LocalConfig(**{field: value})


def test_an_exchange_lands_inside_the_next_round():
  with pytest.raises(ConfigError, match=r'local.overlap_steps \(4\) must be below '
                                        r'local.inner_steps \(4\)'):
    run.LocalConfig(inner_steps=4, overlap_steps=4)
  with pytest.raises(ConfigError, match=r'local\.fragments must be >= 1'):
    run.LocalConfig(fragments=0)


def test_local_sgd_is_refused_outside_mode_shares_and_with_the_scheduler(tmp_path):
  spmd = run.override(_config(inner_steps=4), ['parallelism.mode=spmd'])
  with pytest.raises(ConfigError, match=r'mode spmd takes no local\.inner_steps'):
    run.train(spmd, tmp_path / 'a')
  both = run.override(_config(inner_steps=4), ['parallelism.overlap=true'])
  with pytest.raises(ConfigError, match='local SGD exchanges once a round'):
    run.train(both, tmp_path / 'b')


def test_a_local_run_trains_resumes_and_loads(tmp_path):
  workdir = tmp_path / 'run'
  config = run.override(_config(inner_steps=4), ['checkpoint.every=4'])
  first = run.train(config, workdir)
  assert first['final_step'] == 8
  more = run.override(config, ['optimizer.steps=12'])
  again = run.train(more, workdir, resume=True)
  assert again['final_step'] == 12 and again['checkpoint_steps'][-1] == 12
  model = run.load_model(workdir)
  batch = models.make_task('mlp', hidden=32, width=16).data.global_batch(0, 0, 8)
  assert model(batch['x']).shape == (8, 10)


def test_the_int8_exchange_is_the_float32_one_up_to_rounding():
  """One round (its outer step is linear in the pseudo-gradient): each value off by at most
  half a step of its block's 8-bit grid, absmax / 254, so within 0.4 % of the largest move."""
  task, batch = _task()
  moves, sent = {}, {}
  for int8 in (False, True):
    local = train.LocalTrainer(task, optax.adam(1e-2), batch, steps_per_round=2,
                               outer=optax.sgd(0.7, momentum=0.9, nesterov=True), int8=int8)
    state = local.init_state()
    start = jax.tree.leaves(jax.device_get(local.local_view(state.params)))
    for s in range(2):
      state, stats = local.step(state, Work(s, local.global_batch_at(s)), (batch,))
    end = jax.tree.leaves(jax.device_get(local.local_view(state.params)))
    moves[int8] = [b - a for a, b in zip(start, end, strict=True)]
    sent[int8] = stats.bytes
  assert sent[False] > 3.5 * sent[True]
  largest = max(float(np.abs(m).max()) for m in moves[False])
  off = max(float(np.abs(a - b).max()) for a, b in zip(moves[False], moves[True], strict=True))
  assert 0 < off <= largest / 254 * 1.01


def _plain(task, batch, optimizer, steps):
  plain = train.WorkerTrainer(task, optimizer, batch)
  state, losses, params = plain.init_state(), [], []
  for s in range(steps):
    state, stats = plain.step(state, Work(s, plain.global_batch_at(s)), (batch,))
    losses.append(float(stats.loss))
    params.append(jax.tree.leaves(jax.device_get(plain.local_view(state.params))))
  return losses, params


def test_an_overlapped_exchange_lands_later_with_the_steps_taken_since():
  """One worker, outer SGD at 1: the landed outer parameters are the ones sent, so rebasing
  onto them keeps the steps taken since, and training is plain training step for step; the
  state at a round's end holds the outer parameters before its exchange (one round behind)."""
  task, batch = _task()
  h, tau = 4, 2
  want_losses, want_params = _plain(task, batch, OPTIMIZER, 3 * h)
  local = train.LocalTrainer(task, OPTIMIZER, batch, steps_per_round=h, outer=optax.sgd(1.0),
                             overlap_steps=tau)
  state, losses, landed = local.init_state(), [], []
  for s in range(3 * h):
    state, stats = local.step(state, Work(s, local.global_batch_at(s)), (batch,))
    losses.append(float(stats.loss))
    if stats.bytes:
      landed.append(s)
  np.testing.assert_allclose(losses[:h - 1], want_losses[:h - 1], rtol=1e-6)
  assert landed == [h + tau - 1, 2 * h + tau - 1]   # the first round's lands in the second
  for a, b in zip(jax.tree.leaves(jax.device_get(local.local_view(state.params))),
                  want_params[2 * h - 1], strict=True):   # round 2's start, sent at its end
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  carried = jax.tree.leaves(jax.device_get(local._carry[1]))
  for a, b in zip(carried, want_params[-1], strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  local.close()


def test_an_overlapped_run_resumes_from_a_rounds_end_exactly():
  task, batch = _task()
  kwargs = dict(steps_per_round=3, outer=optax.sgd(0.7, momentum=0.9, nesterov=True),
                overlap_steps=1, fragments=3)
  whole = train.LocalTrainer(task, optax.adam(1e-2), batch, **kwargs)
  state = whole.init_state()
  for s in range(9):
    state, _ = whole.step(state, Work(s, whole.global_batch_at(s)), (batch,))
    if s == 5:
      saved = jax.device_get(state)
  want = jax.tree.leaves(jax.device_get(state))
  whole.close()
  resumed = train.LocalTrainer(task, optax.adam(1e-2), batch, **kwargs)
  state = jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), saved,
                       resumed.abstract_state())
  for s in range(6, 9):
    state, _ = resumed.step(state, Work(s, resumed.global_batch_at(s)), (batch,))
  got = jax.tree.leaves(jax.device_get(state))
  # The pending buffer's head holds the round's times and load (`StepHead`: loss, busy_s,
  # load, sampled, rows, compile_s, ready for one worker): not the computation's; its loss,
  # rows and every value after the head are.
  timed = [1, 2, 3, 5, 6]
  for a, b in zip(got, want, strict=True):
    if a.shape == (resumed.fused_size,):
      a, b = np.delete(a, timed), np.delete(b, timed)
    np.testing.assert_array_equal(a, b)
  resumed.close()


def test_fragments_sum_what_one_exchange_sums():
  task, batch = _task()
  finals = []
  for fragments in (1, 3):
    local = train.LocalTrainer(task, optax.adam(1e-2), batch, steps_per_round=2,
                               outer=optax.sgd(0.7, momentum=0.9, nesterov=True),
                               fragments=fragments)
    assert len(local._bounds) == fragments
    state = local.init_state()
    for s in range(4):
      state, _ = local.step(state, Work(s, local.global_batch_at(s)), (batch,))
    finals.append(jax.tree.leaves(jax.device_get(state)))
  for a, b in zip(*finals, strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.multiprocess
@pytest.mark.timeout(3 * LAUNCH_TIMEOUT)
def test_a_streamed_run_of_two_workers_resumes_to_the_uninterrupted_one(tmp_path):
  """Overlapped, in fragments, with 8-bit exchanges and unequal hosts (LB-BSP's rounds): a run
  stopped at a round's end and resumed (its pending exchange sent again) ends where the
  uninterrupted one does; `load_model` reads it."""
  def launch(workdir, steps, *extra):
    command = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp',
               '--mesh=1x1', f'--workdir={workdir}', f'--steps={steps}', '--policy=lbbsp',
               '--set=local.inner_steps=4', '--set=local.overlap_steps=2',
               '--set=local.fragments=2', '--set=local.exchange=int8', '--set=checkpoint.every=4',
               '--set=checkpoint.asynchronous=false', '--set=eval.every=100', *extra]
    result = launch_local(command, workers=2, devices_per_worker=1, slowdown='static:1,2',
                          timeout=LAUNCH_TIMEOUT, init_timeout=60)
    assert result.returncode == 0, result
    return json.loads((workdir / 'summary.json').read_text())

  whole = launch(tmp_path / 'whole', 12)
  launch(tmp_path / 'part', 8)
  resumed = launch(tmp_path / 'part', 12, '--resume')
  assert resumed['final_step'] == whole['final_step'] == 12
  a, b = run.load_model(tmp_path / 'whole'), run.load_model(tmp_path / 'part')
  batch = models.make_task('mlp').data.global_batch(0, 0, 16)
  np.testing.assert_array_equal(np.asarray(a(batch['x'])), np.asarray(b(batch['x'])))


def test_round_policy_learns_where_an_overlapped_exchange_lands():
  rules = ShareRules(64, 2, 8)
  policy = balance.RoundPolicy(balance.make_policy('proportional', rules), 4, offset=2)
  shares, state = policy.update(policy.init(), None)
  slow = (1.0, 3.0)
  for step in range(5):  # the first round's step 1 (no exchange yet) and rounds' last steps
    shares, state = policy.update(state, StepStats(step, (32, 32), slow))
    assert tuple(shares) == (32, 32)
  moved, _ = policy.update(state, StepStats(5, (32, 32), slow))   # round 0's, landed
  assert moved[0] > moved[1]


def test_a_worker_slowed_inside_a_round_is_cut_and_weighed_by_its_rows():
  """A host 8x slow from step 9 (`KnownSpeedHost`, 50 ms a step before). The budget comes from
  the first clean round (the first compiles): 4 steps of 50 ms and whatever the machine adds,
  e a step. In the round from step 8 the first step runs, the second (400 ms) starts within
  1.5 x the budget, the third would end at 850 ms + 3e, past 1.5 x (200 ms + 4e) while e stays
  under 180 ms a step: the worker joins the exchange with two steps' rows, whatever the load."""
  from hetjax.emulation import KnownSpeedHost, parse_trace

  task, batch = _task()
  local = train.LocalTrainer(task, optax.sgd(0.1), batch, steps_per_round=4,
                             outer=optax.sgd(1.0), cutoff=1.5)
  local.use_host(KnownSpeedHost(parse_trace('step:9:1:8', 1), worker=0, row_s=0.05 / batch))
  state, rounds = local.init_state(), []
  for s in range(12):
    state, stats = local.step(state, Work(s, local.global_batch_at(s)), (batch,))
    if stats.bytes:
      rounds.append(stats.rows[0])
  assert rounds == [batch, batch, batch // 2]   # mean rows a step over each round
  # The next budget is the cut round's two steps: the host pads each to at least its target
  # (50 + 400 ms), and it stays under the 850 ms three steps would have taken.
  assert 0.45 <= local._budget_s < 0.85
  assert int(state.step) == 12


def test_checkpoints_settle_an_exchange_in_flight_only_where_they_save():
  from hetjax.run._runner import _settled

  settled, saved = [], []

  class Program:
    def settle(self):
      settled.append(step)

  hook = _settled(train.Hook(lambda info: saved.append(info.step)), Program(), every=4)
  for step in range(1, 11):
    hook.fn(train.StepInfo(step, None, None, until=10))
  assert saved == list(range(1, 11))               # the checkpoint's hook runs every step
  assert settled == [4, 5, 8, 9, 10]               # where it saves, and where that commits
