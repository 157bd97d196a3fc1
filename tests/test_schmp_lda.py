"""SchMP-LDA: counts exact after every round, the rotation a Latin square, one device's round a
plain numpy collapsed Gibbs sweep with the same uniforms, the likelihood rising; the unscheduled
baseline; bad input in one line."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import Work
from hetjax.schmp import App, Schedule, SchmpProgram, make_app
from hetjax.schmp._lda import make_lda
from hetjax.schmp._lda_gibbs import token_uniforms
from hetjax.train import training_steps
from tests.conftest import require_devices

SMALL = {'topics': 8, 'documents': 64, 'vocabulary': 300}  # 2,430 tokens


def _program(app, seed=0):
  size = app.default_schedule_size(app.devices)
  return SchmpProgram(app, size, require_devices(app.devices), seed=seed, staleness=0)


def _host(params):
  """The parameters copied to the host (the program donates them to the next round)."""
  return {k: np.array(v) for k, v in params.items()}


def _recount(app, z):
  """n_dk [P, D_max, K] and n_wk [V, K] counted from the topics ``z`` [P, P, L]."""
  lay, k = app.layout, app.topics
  p = lay.devices
  real = lay.mask
  device = np.broadcast_to(np.arange(p)[:, None, None], z.shape)[real]
  shard = np.broadcast_to(np.arange(p)[None, :, None], z.shape)[real]
  n_dk = np.zeros((p, lay.length.shape[1], k), np.int64)
  np.add.at(n_dk, (device, lay.doc[real], z[real]), 1)
  n_wk = np.zeros((len(app.corpus.vocabulary), k), np.int64)
  np.add.at(n_wk, (lay.row[real] * p + shard, z[real]), 1)
  return n_dk, n_wk


def _check_counts(app, params):
  lay = app.layout
  n_dk, n_wk = _recount(app, params['z'])
  got_dk = params['n_dk'].reshape(n_dk.shape)
  np.testing.assert_array_equal(got_dk, n_dk)
  np.testing.assert_array_equal(got_dk.sum(-1), lay.length)       # rows sum to doc lengths
  np.testing.assert_array_equal(app.word_topic(params), n_wk)
  np.testing.assert_array_equal(params['n_k'], n_wk.sum(0))
  assert params['n_k'].sum() == app.corpus.num_tokens


def test_the_layout_places_every_token_once():
  app = make_lda(devices=4, **SMALL)
  assert isinstance(app, App) and app.blocks == 4 and make_lda('unscheduled', **SMALL).blocks == 1
  assert make_lda('unscheduled-rounds', devices=4, **SMALL).blocks == 4
  lay, corpus = app.layout, app.corpus
  real = lay.mask
  assert np.array_equal(np.sort(lay.token[real]), np.arange(corpus.num_tokens))
  shard = np.broadcast_to(np.arange(4)[None, :, None], lay.row.shape)[real]
  np.testing.assert_array_equal(lay.row[real] * 4 + shard, corpus.tokens[lay.token[real]])
  device = np.broadcast_to(np.arange(4)[:, None, None], lay.doc.shape)[real]
  np.testing.assert_array_equal(lay.doc_id[device, lay.doc[real]],
                                np.searchsorted(corpus.offsets, lay.token[real], 'right') - 1)
  tokens_per_shard = real.sum((0, 2))
  assert tokens_per_shard.max() < 1.3 * tokens_per_shard.min()   # words dealt by frequency


@pytest.mark.parametrize('scheduler', ['schmp', 'unscheduled', 'unscheduled-rounds'])
@pytest.mark.parametrize('devices', [1, 2, 4])
def test_counts_are_exact_after_every_round(scheduler, devices):
  app = make_app('lda', scheduler=scheduler, devices=devices, **SMALL)
  program = _program(app)
  state = program.init_state()
  _check_counts(app, _host(state.params))
  rounds = 2 * app.blocks
  for info in training_steps(program, state, rounds, policy=app.policy(app.blocks, 0)):
    params = _host(info.state.params)
    _check_counts(app, params)
    assert int(params['rotation']) == (info.step % devices if scheduler == 'schmp' else 0)


def test_the_rotation_gives_each_device_each_shard_once_per_p_rounds():
  app = make_lda(devices=4, **SMALL)
  program = _program(app)
  state = program.init_state()
  before = _host(state.params)
  worked = np.zeros((4, 4), int)                     # rounds device p sampled shard j
  for info in training_steps(program, state, 8, policy=app.policy(4, 0)):
    t, after = info.step - 1, _host(info.state.params)
    changed = (after['z'] != before['z']).sum(2)     # [device, shard]
    assigned = (np.arange(4) + t) % 4                # device p's shard in round t
    mine = np.zeros((4, 4), bool)
    mine[np.arange(4), assigned] = True
    assert (changed[~mine] == 0).all() and (changed[mine] > 0).all()
    worked += mine
    np.testing.assert_array_equal(info.stats.local.delta, changed.sum(0))
    # the word-topic table each device holds now is shard p + t + 1's, counted exactly
    _, n_wk = _recount(app, after['z'])
    padded = np.zeros((app.layout.rows * 4, app.topics), np.int64)
    padded[:len(n_wk)] = n_wk                        # word w = row · P + shard
    by_shard = padded.reshape(-1, 4, app.topics).transpose(1, 0, 2)
    np.testing.assert_array_equal(after['n_wk'], by_shard[(np.arange(4) + t + 1) % 4])
    if t % 4 == 3:
      assert (worked == (t + 1) // 4).all()          # every pair once per P rounds
    before = after


def test_unscheduled_rounds_sample_each_slot_once_per_p_rounds_on_every_shard():
  # Round t samples slots [t·w, (t + 1)·w) of every shard group (w = ⌈L / P⌉): every word of
  # the vocabulary, 1/P of the device's tokens; P rounds touch every slot once.
  app = make_lda('unscheduled-rounds', devices=4, **SMALL)
  width = -(-app.layout.slots // 4)
  program = _program(app)
  state = program.init_state()
  before = _host(state.params)
  for info in training_steps(program, state, 4, policy=app.policy(4, 0)):
    t, after = info.step - 1, _host(info.state.params)
    changed = after['z'] != before['z']                      # [device, shard, slot]
    outside = np.ones(app.layout.slots, bool)
    outside[t * width:(t + 1) * width] = False
    assert not changed[:, :, outside].any()
    assert changed[:, :, ~outside].sum((0, 2)).min() > 0      # every shard's words sampled
    before = after


def test_a_schedule_that_jumps_fetches_its_shards_first():
  app = make_lda(devices=4, **SMALL)
  program = _program(app)
  state = program.init_state()
  before = _host(state.params)
  state, _ = program.step(state, Work(0, {}), Schedule.of(range(4), 4, offset=2))
  after = _host(state.params)
  changed = (after['z'] != before['z']).sum(2)
  assert (changed[np.arange(4), (np.arange(4) + 2) % 4] > 0).all()
  assert changed.sum() == changed[np.arange(4), (np.arange(4) + 2) % 4].sum()
  assert int(after['rotation']) == 3
  _check_counts(app, after)


def _numpy_sweep(n_dk, n_wk, n_k, docs, words, z, uniforms, alpha, beta):
  """Collapsed Gibbs, token by token, in float64: the reference."""
  v_beta = n_wk.shape[0] * beta
  z = z.copy()
  for i, (d, w) in enumerate(zip(docs, words, strict=True)):
    k = z[i]
    n_dk[d, k] -= 1
    n_wk[w, k] -= 1
    n_k[k] -= 1
    cdf = np.cumsum((n_dk[d] + alpha) * (n_wk[w] + beta) / (n_k + v_beta))
    k = min(int(np.searchsorted(cdf, uniforms[i] * cdf[-1], side='right')), len(n_k) - 1)
    z[i] = k
    n_dk[d, k] += 1
    n_wk[w, k] += 1
    n_k[k] += 1
  return z


@pytest.mark.parametrize('scheduler', ['schmp', 'unscheduled', 'unscheduled-rounds'])
def test_a_round_on_one_device_is_a_numpy_gibbs_sweep(scheduler):
  app = make_lda(scheduler, devices=1, alpha=0.3, beta=0.05, **SMALL)
  program = _program(app, seed=5)
  lay = app.layout
  assert lay.mask.all()                              # one device, one shard: no padding
  docs, words, z = lay.doc[0, 0], lay.row[0, 0], lay.topic[0, 0]
  n_dk = np.zeros((lay.length.shape[1], app.topics), np.int64)
  np.add.at(n_dk, (docs, z), 1)
  n_wk = np.zeros((len(app.corpus.vocabulary), app.topics), np.int64)
  np.add.at(n_wk, (words, z), 1)
  n_k = n_wk.sum(0)
  for info in training_steps(program, program.init_state(), 2, policy=app.policy(1, 0)):
    key = jax.random.fold_in(jax.random.key(5), info.step - 1)   # the program's round key
    uniforms = np.asarray(token_uniforms(key, 0, lay.slots), np.float64)
    z = _numpy_sweep(n_dk, n_wk, n_k, docs, words, z, uniforms, app.alpha, app.beta)
    params = _host(info.state.params)
    np.testing.assert_array_equal(params['z'][0, 0], z)
    np.testing.assert_array_equal(params['n_dk'], n_dk)
    np.testing.assert_array_equal(app.word_topic(params), n_wk)


def _numpy_objective(app, params):
  """−log p(w, z) / N in float64 from the counts on the host."""
  lg = np.vectorize(math.lgamma)
  a, b, k, v = app.alpha, app.beta, app.topics, len(app.corpus.vocabulary)
  n_dk = params['n_dk'].astype(np.float64)
  n_wk, n_k = app.word_topic(params).astype(np.float64), params['n_k'].astype(np.float64)
  real = app.layout.doc_id.reshape(-1) >= 0
  docs = (lg(k * a) - lg(n_dk[real].sum(1) + k * a)).sum() + (lg(n_dk[real] + a) - lg(a)).sum()
  words = k * (lg(v * b) - v * lg(b)) + lg(n_wk + b).sum() - lg(n_k + v * b).sum()
  return -(docs + words) / app.corpus.num_tokens


@pytest.mark.parametrize('scheduler', ['schmp', 'unscheduled', 'unscheduled-rounds'])
def test_the_objective_is_the_collapsed_likelihood_and_falls(scheduler):
  app = make_lda(scheduler, devices=2, **SMALL)
  program = _program(app)
  state = program.init_state()
  first = float(program.objective(state))
  assert first == pytest.approx(_numpy_objective(app, _host(state.params)), rel=1e-5)
  rounds = 3 * app.blocks                            # three sweeps
  infos = list(training_steps(program, state, rounds, policy=app.policy(app.blocks, 0)))
  losses = [float(info.stats.loss) for info in infos]
  assert losses[-1] == pytest.approx(_numpy_objective(app, _host(infos[-1].state.params)),
                                     rel=1e-5)
  # Random topics cost about log K per token more than fitted ones; three sweeps from random
  # topics have always cut the loss by over a tenth here.
  assert losses[-1] < 0.9 * first and losses[-1] < losses[len(losses) // 2] < first


def test_unequal_document_shares_pad_and_give_the_same_start():
  even = make_lda(devices=2, **SMALL)
  unequal = make_lda(doc_shares=(44, 20), **SMALL)
  assert unequal.devices == 2 and unequal.layout.length.shape == (2, 44)
  assert (unequal.layout.doc_id[1, 20:] == -1).all() and (unequal.layout.length[1, 20:] == 0).all()
  objectives = []
  for app in (even, unequal, make_lda(devices=1, **SMALL), make_lda(devices=4, **SMALL)):
    program = _program(app)
    objectives.append(float(program.objective(program.init_state())))  # same topics per token
  assert objectives == pytest.approx([objectives[0]] * 4, rel=1e-5)
  program = _program(unequal)
  for info in training_steps(program, program.init_state(), 4, policy=unequal.policy(2, 0)):
    _check_counts(unequal, _host(info.state.params))


@pytest.mark.parametrize('scheduler', ['schmp', 'unscheduled', 'unscheduled-rounds'])
def test_round_work_counts_each_devices_tokens_and_times_a_host_by_them(scheduler):
  """A host of known speed is timed by the tokens of this worker's devices in the round: over
  P rotation rounds each device samples each of its tokens once; the device with more
  documents has more; the baseline samples them all every round."""
  app = make_lda(scheduler, doc_shares=(44, 20), **SMALL)
  per_device = app.layout.mask.sum((1, 2))
  assert per_device.sum() == app.corpus.num_tokens and per_device[0] > per_device[1]
  work = np.array([app.round_work(s) for s in range(2)])
  if scheduler != 'unscheduled':   # each token once in P rounds
    np.testing.assert_array_equal(work.sum(0), per_device)
  else:
    np.testing.assert_array_equal(work, [per_device, per_device])

  calls = []

  class Recorder:
    def factor(self, step):
      return 1.0

    def pad(self, step, rows, measured_s):
      calls.append((step, rows))
      return 0.0, 0.0

  program = _program(app)
  program.use_host(Recorder())
  policy = app.policy(program.schedule_size, 0)
  list(training_steps(program, program.init_state(), 2, policy=policy))
  assert calls == [(0, int(work[0].sum())), (1, int(work[1].sum()))]
  assert program.local_work(1) == int(work[1].sum())  # one process: every device is local
  assert program.mean_work(1) == int(work[1].sum())   # and the one worker is the average


def test_bad_input_is_one_line():
  cases = [
      ({'topics': 1}, 'lda needs topics >= 2, got 1'),
      ({'alpha': 0.0}, 'lda needs alpha > 0 and beta > 0, got alpha=0.0, beta=0.01'),
      ({'beta': -1.0}, 'lda needs alpha > 0 and beta > 0, got alpha=0.1, beta=-1.0'),
      ({'scheduler': 'fancy'}, "unknown lda scheduler 'fancy'; choose one of: schmp, "
                               'unscheduled, unscheduled-rounds'),
      ({'documents': 63, 'devices': 2}, 'lda: 63 documents do not split evenly over 2 devices'),
      ({'documents': 64, 'doc_shares': (40, 20)},
       r'doc_shares \[40, 20\] must be 2 counts >= 0 that sum to the 64 documents'),
  ]
  for kwargs, message in cases:
    args = {'devices': 2, 'topics': 8, 'documents': 64, 'vocabulary': 300, **kwargs}
    with pytest.raises(ConfigError, match=message) as e:
      make_app('lda', **args)
    assert '\n' not in str(e.value)
  app = make_lda(devices=2, **SMALL)
  with pytest.raises(ConfigError, match=r'made for 2 devices .* run on 4: make it with devices=4'):
    SchmpProgram(app, 2, require_devices(4))
  with pytest.raises(ConfigError, match=r'rounds have 2 slots, one per block; got a schedule '
                     'size of 3'):
    app.policy(3, 0)
  with pytest.raises(ConfigError, match="app 'lda': got an unexpected keyword argument 'k'"):
    make_app('lda', k=3)
