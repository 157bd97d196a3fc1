"""The parameter server in one process: servers and workers as threads over a `LocalChannel`,
each with its own transfer server, so every transfer really crosses `jax.experimental.transfer`.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import ConfigError, models, ps, sharding
from hetjax.emulation import parse_links
from hetjax.runtime import LocalChannel
from hetjax.sharding import abstract_model
from hetjax.train import training_steps
from tests.test_checkpoint_replica import change_one_value

pytestmark = pytest.mark.timeout(120)


def _task():
  return models.make_task('mlp', hidden=16, width=8)


def _run(config: ps.PsConfig, workers: int = 2, servers: int = 2, steps: int = 4,
         global_batch: int = 32, lr: float = 0.1, links=None, checkpoint_dir=None,
         checkpoint_every: int = 0):
  """Runs a job as threads; returns (final params of worker 0, server reports, worker infos)."""
  task, channel = _task(), LocalChannel()
  reports, finals, infos, errors = [None] * servers, [None] * workers, [[] for _ in
                                                                          range(workers)], []

  def server(s):
    try:
      role = ps.PsRole(True, s, workers, servers)
      reports[s] = ps.make_server(task, optax.sgd(lr), config, role, channel,
                                  checkpoint_dir=checkpoint_dir,
                                  checkpoint_every=checkpoint_every, idle_timeout_s=60).serve()
    except Exception as e:  # surfaced below
      errors.append(e)

  def worker(w):
    try:
      role = ps.PsRole(False, w, workers, servers)
      program = ps.make_worker(task, global_batch, config, role, channel, links=links,
                               timeout_s=60)
      state = program.init_state()
      for info in training_steps(program, state, steps):
        state = info.state
        infos[w].append(info)
      finals[w] = program.finish(state)
    except Exception as e:
      errors.append(e)

  threads = [threading.Thread(target=server, args=(s,)) for s in range(servers)]
  threads += [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(100)
  assert not errors, errors
  return finals, reports, infos


def _reference(steps: int, global_batch: int = 32, lr: float = 0.1):
  """Plain single-device SGD on the same global batches."""
  task = _task()
  params = sharding.initial_params(task.make_model, 0)
  graphdef = abstract_model(task.make_model, 0)[0]
  opt = optax.sgd(lr)
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, batch):
    loss_fn = lambda p: jnp.mean(task.loss(nnx.merge(graphdef, p), batch))  # noqa: E731
    grads = jax.grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  for s in range(steps):
    params, opt_state = step(params, opt_state, task.data.global_batch(0, s, global_batch))
  return params


def test_layout_deals_leaves_by_size():
  params = {'a': np.zeros((100,)), 'b': np.zeros((60,)), 'c': np.zeros((50,)), 'd': np.zeros(3)}
  layout = ps.ServerLayout.of(params, 2)
  assert [layout.nbytes(s) for s in range(2)] == [824, 880]
  assert layout.merge(layout.split(params)).keys() == params.keys()
  with pytest.raises(ConfigError, match='at most 4'):
    ps.ServerLayout.of(params, 5)


@pytest.mark.parametrize('spec, error', [
    ('bsp,eager', 'eager pull needs asp or ssp'),
    ('asp:2', 'only ssp takes a bound'),
    ('ssp', 'ssp needs its bound'),
    ('asp,fast', "unknown parameter-server option 'fast'"),
    ('bsp,lr=staleness', 'never stale'),
    ('hogwild', "unknown parameter-server consistency 'hogwild'"),
])
def test_parse_ps_errors(spec, error):
  with pytest.raises(ValueError, match=error):
    ps.parse_ps(spec)


def test_parse_ps_round_trip():
  config = ps.parse_ps('ssp:2,eager,lr=staleness,dc=0.1,max_staleness=9')
  assert config.describe() == 'ssp:2,eager,lr=staleness,dc=0.1,max_staleness=9'
  assert ps.parse_ps(config.describe()) == config


def test_bsp_equals_one_device():
  finals, reports, _ = _run(ps.parse_ps('bsp'), workers=2, servers=2, steps=4)
  expected = _reference(4)
  for got in finals:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                 got.params, expected)
  assert all(r.version == 4 and len(r.updates) == 4 for r in reports)
  assert all(u.workers == (0, 1) for u in reports[0].updates)


def test_asp_applies_every_push_and_counts_staleness():
  _, reports, infos = _run(ps.parse_ps("asp"), workers=2, servers=1, steps=5)
  assert reports[0].version == 10 and reports[0].pushes == 10
  staleness = [s for u in reports[0].updates for s in u.staleness]
  assert min(staleness) >= 0 and max(staleness) <= 2
  assert all(info.stats.local.accepted for w in infos for info in w)


def test_eager_pull_computes_one_step_staler():
  _, reports, _ = _run(ps.parse_ps("asp,eager"), workers=1, servers=1, steps=4)
  # one worker: its gradient at step t is computed on the parameters of step t - 2's push
  assert [s for u in reports[0].updates for s in u.staleness] == [0, 1, 1, 1]
  assert reports[0].version == 4


def test_staleness_rule_scales_updates():
  _, reports, _ = _run(ps.parse_ps('asp,eager,lr=staleness'), workers=1, servers=1, steps=3)
  assert [u.scale for u in reports[0].updates] == [1.0, 1.0, 1.0]   # τ ≤ 1: unchanged
  _, reports, _ = _run(ps.parse_ps('asp,lr=staleness'), workers=2, servers=1, steps=4)
  for u in reports[0].updates:
    assert u.scale == pytest.approx(1 / max(1, u.staleness[0]))


def test_links_pad_pushes_and_pulls():
  links = parse_links('link:30:inf', 1)
  _, _, infos = _run(ps.parse_ps('asp'), workers=1, servers=1, steps=2, links=links)
  for info in infos[0]:
    assert info.stats.local.push_s >= 0.03 and info.stats.local.pull_s >= 0.03


def test_refused_pushes_are_counted_never_applied():
  """A push of the wrong shapes or dtype, or from a version the server has not reached, is
  refused, counted, and leaves the parameters as they were."""
  task, channel = _task(), LocalChannel()
  role = ps.PsRole(True, 0, 1, 1)
  server = ps.make_server(task, optax.sgd(0.1), ps.parse_ps('asp,max_staleness=0'), role,
                          channel, idle_timeout_s=30)
  before = [np.asarray(x) for x in server.params]
  thread = threading.Thread(target=server.serve)
  thread.start()
  client = ps.PsClient(0, server.layout, channel, ps.Transport(), timeout_s=30)
  params, versions, _ = client.pull()
  wrong_shape = jax.tree.map(lambda x: jnp.zeros((*x.shape[:-1], x.shape[-1] + 1)), params)
  wrong_dtype = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float16), params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  results = [client.push(wrong_shape, versions, 4, 1.0), client.push(wrong_dtype, versions, 4, 1.0),
             client.push(zeros, (versions[0] + 5,), 4, 1.0)]
  assert [r.accepted for r in results] == [False, False, False]
  assert 'shapes/dtypes' in results[0].reasons[0] and 'version 5' in results[2].reasons[0]
  ticket = channel.increment('ticket/0')               # a malformed request, by hand
  channel.set(f'req/0/{ticket}', {'op': 'push', 'worker': 0, 'version': 0, 'number': 99,
                                  'specs': 'bogus', 'rows': 4, 'loss': 1.0})
  malformed = channel.wait(f'ack/0/{ticket}', timeout_s=30)
  assert not malformed['accepted'] and 'shapes/dtypes None' in malformed['reason']
  good = client.push(zeros, versions, 4, 1.0)          # staleness 0: accepted
  stale = client.push(zeros, versions, 4, 1.0)         # staleness 1 > max_staleness 0
  assert good.accepted and not stale.accepted and 'staleness 1 > 0' in stale.reasons[0]
  client.stop()
  thread.join(30)
  report = server.report()
  assert report.refused == {'shape': 3, 'version': 1, 'staleness': 1}
  assert report.version == 1 and report.pushes == 6
  for b, a in zip(before, server.params, strict=True):
    np.testing.assert_array_equal(b, np.asarray(a))       # the accepted push was all zeros


def test_a_restarted_server_restores_its_checkpoint(tmp_path):
  _, reports, _ = _run(ps.parse_ps('asp'), workers=2, servers=1, steps=3,
                       checkpoint_dir=tmp_path, checkpoint_every=2)
  assert reports[0].version == 6
  role = ps.PsRole(True, 0, 2, 1)
  again = ps.make_server(_task(), optax.sgd(0.1), ps.parse_ps('asp'), role, LocalChannel(),
                         checkpoint_dir=tmp_path)
  assert again.restored_from == 6 and again.version == 6 and again.clocks == [3, 3]
  fresh = ps.make_server(_task(), optax.sgd(0.1), ps.parse_ps('asp'), role, LocalChannel())
  assert any(not np.array_equal(a, b) for a, b in zip(again.params, fresh.params, strict=True))
  # Its saved arrays changed (the file decodes, a value differs): the restore notices, and a
  # server does not go back to version 4 alone.
  change_one_value(tmp_path / 'server-0' / '6' / 'state' / 'arrays.npz', array=0)
  with pytest.raises(ConfigError) as e:
    ps.make_server(_task(), optax.sgd(0.1), ps.parse_ps('asp'), role, LocalChannel(),
                   checkpoint_dir=tmp_path)
  assert str(e.value) == (
      f"checkpoint step 6 in {tmp_path / 'server-0'} failed verification (leaf 'params/0' "
      'checksum differs); a server does not go back to an older version alone (the other '
      'servers and the workers would not)')


def test_dc_asgd_compensates_stale_pushes_only():
  """DC-ASGD changes an update only when its gradient is stale: one worker, push-then-pull
  (τ = 0 every time), ends where plain asp does; two eager workers do not."""
  plain, _, _ = _run(ps.parse_ps('asp'), workers=1, servers=1, steps=3)
  dc, _, _ = _run(ps.parse_ps('asp,dc=0.5'), workers=1, servers=1, steps=3)
  jax.tree.map(np.testing.assert_array_equal, plain[0].params, dc[0].params)
  plain, reports, _ = _run(ps.parse_ps('asp,eager'), workers=1, servers=1, steps=4)
  dc, _, _ = _run(ps.parse_ps('asp,eager,dc=0.5'), workers=1, servers=1, steps=4)
  assert max(s for u in reports[0].updates for s in u.staleness) == 1
  assert any(not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(plain[0].params), jax.tree.leaves(dc[0].params), strict=True))
