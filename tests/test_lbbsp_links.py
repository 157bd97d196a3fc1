"""LB-BSP with communication: each worker's step is its compute plus its own transfer.

The solver and the policy are checked in closed form on the virtual clock (equal compute with one
slow link; unequal compute and a slow link; a transfer longer than the balanced step), the
links' text form and its one-line errors, and one launched ``experiments/train.py`` job with
per-worker links on the server exchange: LB-BSP moves rows off the slow link and trains the same
losses as uniform shares (shares change only who computes which rows).
"""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from hetjax import ConfigError, balance, core, emulation, simulation
from hetjax.balance._simple import min_max_shares
from hetjax.emulation import Exchange, Links, StaticTrace, _network, parse_links
from hetjax.report import load_telemetry

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROW_S = 1e-3  # seconds per row on every host at factor 1


def _run(policy, trace, transfer, batch, steps=8):
  cost = simulation.ClockCosts(per_sample_s=ROW_S, transfer_s=transfer)
  return simulation.simulate_shares(policy, trace, cost, batch, steps)


def test_the_links_docstring_examples_hold():
  assert doctest.testmod(_network, raise_on_error=True).attempted > 0


def test_the_solver_equalises_compute_plus_transfer():
  # Equal hosts, worker 3's transfer 60 ms: 4T − 60 ms = 400 rows × 1 ms ⇒ T = 115 ms.
  rules = core.ShareRules(400, 4, 1)
  shares = min_max_shares(rules, [ROW_S] * 4, [0, 0, 0, 0.06])
  assert shares.values == (115, 115, 115, 55)
  finish = np.asarray(shares.values) * ROW_S + [0, 0, 0, 0.06]
  np.testing.assert_allclose(finish, 0.115)
  assert balance.LBBSP(rules, balance.EWMA(), transfer_s=(0, 0, 0, 0.06)).transfer_s == (
      0.0, 0.0, 0.0, 0.06)


@pytest.mark.parametrize('factors, transfer, batch, balanced, limit', [
    # equal compute, one slow link: the one on it gets fewer rows
    ((1, 1, 1, 1), (0, 0, 0, 0.06), 400, (115, 115, 115, 55), 0.115),
    # worker 2 half as fast, worker 3 on a slow link: T + T + T/2 + (T − 50 ms) = 370 ms
    ((1, 1, 2, 1), (0, 0, 0, 0.05), 370, (120, 120, 60, 70), 0.12),
])
def test_lbbsp_with_links_reaches_the_balanced_limit(factors, transfer, batch, balanced, limit):
  rules, trace = core.ShareRules(batch, 4, 1), StaticTrace(factors)
  with_links = _run(balance.LBBSP(rules, balance.EWMA(), transfer_s=transfer), trace, transfer,
                    batch)
  assert tuple(with_links.shares[-1]) == balanced
  finish = with_links.compute_s[-1] + transfer
  np.testing.assert_allclose(finish, limit)  # every worker's compute + transfer equal
  np.testing.assert_allclose(with_links.balanced_limit_s, limit)
  np.testing.assert_allclose(with_links.iter_s[2:], limit)
  oracle = balance.Oracle(rules, trace, ROW_S, transfer_s=transfer)
  assert oracle.update(oracle.init(), None)[0].values == balanced

  compute_only = _run(balance.LBBSP(rules, balance.EWMA()), trace, transfer, batch)
  assert compute_only.iter_s[-1] > 1.1 * limit  # it balances compute, the slow link waits
  assert compute_only.shares[-1][3] > balanced[3]


def test_a_transfer_longer_than_the_balanced_step_leaves_that_worker_out_of_the_limit():
  # Three equal hosts finish 300 rows in 100 ms; worker 3's transfer alone takes 1 s.
  cost = simulation.ClockCosts(per_sample_s=ROW_S, transfer_s=(0, 0, 0, 1.0))
  assert cost.balanced_limit_s(300, np.ones(4)) == pytest.approx(0.1)
  assert simulation.ClockCosts(ROW_S).balanced_limit_s(300, np.ones(4)) == pytest.approx(0.075)


def test_equal_transfers_keep_the_compute_only_split():
  # A ring all-reduce paces every worker alike: the transfers shift the time, not the split.
  rules, trace = core.ShareRules(4096, 4, 64), StaticTrace((1, 1, 1, 3))
  ring = parse_links('link:1:1000,1000,1000,100', 4).exchange_s(4_000_000)
  assert len(set(ring)) == 1
  plain = _run(balance.LBBSP(rules, balance.EWMA()), trace, (), 4096)
  priced = _run(balance.LBBSP(rules, balance.EWMA(), transfer_s=ring), trace, ring, 4096)
  np.testing.assert_array_equal(plain.shares, priced.shares)
  np.testing.assert_allclose(priced.iter_s, plain.iter_s + ring[0])


def test_a_resumed_policy_decides_as_the_uninterrupted_one():
  rules, trace = core.ShareRules(400, 4, 4), StaticTrace((1, 1.5, 1, 1))
  transfer = (0.0, 0.0, 0.01, 0.05)
  policy = balance.LBBSP(rules, balance.EWMA(), transfer_s=transfer)
  cost = simulation.ClockCosts(per_sample_s=ROW_S, transfer_s=transfer)
  whole = simulation.simulate_shares(policy, trace, cost, 400, 12, noise_cv=0.2, seed=3)
  first = simulation.simulate_shares(policy, trace, cost, 400, 6, noise_cv=0.2, seed=3)
  rest = simulation.simulate_shares(policy, trace, cost, 400, 12, noise_cv=0.2, seed=3, start=6,
                                    policy_state=first.policy_state)
  np.testing.assert_array_equal(np.concatenate([first.shares, rest.shares]), whole.shares)


def test_links_per_worker_on_the_server_exchange():
  links = parse_links('link:1,1,1,20:1000,1000,1000,100:exchange=server', 4)
  assert links.exchange is Exchange.SERVER
  assert links.exchange_s(1_000_000) == pytest.approx(
      (2 * 0.002, 2 * 0.002, 2 * 0.002, 2 * (0.02 + 0.01)))  # a push and a pull each
  assert parse_links(links.describe(), 4) == links
  ring = parse_links('link:1,1,1,20:1000,1000,1000,100', 4)
  assert ring.exchange is Exchange.RING and 'exchange' not in ring.describe()
  assert ring.exchange_s(1_000_000) == (ring.all_reduce_s(range(4), 1_000_000),) * 4
  assert parse_links('link:1:100:exchange=ring', 4) == parse_links('link:1:100', 4)


@pytest.mark.parametrize('spec, message', [
    ('link:1,2,3:100:exchange=server', 'link latency has 3 values for 4 workers; give 4 or 1'),
    ('link:1:100,100:exchange=server', 'link bandwidth has 2 values for 4 workers; give 4 or 1'),
    ('link:1:100:exchange=tree', "unknown links exchange 'tree'; choose one of: ring, server"),
    ('link:1:100:via=server', "bad links options 'via=server'"),
    ('link:1:100:server', "bad links 'link:1:100:server'; expected none or link:"),
])
def test_bad_links_are_one_line(spec, message):
  with pytest.raises(ConfigError, match=message) as e:
    parse_links(spec, 4)
  assert '\n' not in str(e.value)


def test_transfers_for_another_worker_count_are_one_line():
  rules = core.ShareRules(400, 4, 1)
  for make in (lambda t: balance.LBBSP(rules, balance.EWMA(), transfer_s=t),
               lambda t: balance.Oracle(rules, StaticTrace((1,) * 4), transfer_s=t)):
    with pytest.raises(ConfigError, match=r'must be one finite value >= 0 per worker \(4\)'):
      make((0.0, 0.1, 0.2))
    with pytest.raises(ConfigError, match='per worker'):
      make((0.0, 0.0, 0.0, -1.0))
  cost = simulation.ClockCosts(per_sample_s=ROW_S, transfer_s=(0.1, 0.2))
  with pytest.raises(ConfigError, match='transfer_s has 2 values for 4 workers'):
    cost.balanced_limit_s(400, np.ones(4))


def test_the_server_exchange_has_no_ring_collective_for_the_all_reduce_scheduler():
  pace = emulation.LinkedHost(parse_links('link:1:100:exchange=server', 2), 0)
  for collective in (core.Collective.ALL_REDUCE, core.Collective.ALL_GATHER):
    with pytest.raises(ConfigError, match='overlaps ring all-reduces') as e, \
        pace.exchange(8, collective):
      pass
    assert '\n' not in str(e.value)


STEPS = 10


def _launch(workdir, policy, cache):
  """``train.py`` on two workers; the second launch loads the first one's compiled programs."""
  command = [sys.executable, '-m', 'hetjax.launch', '--workers', '2', '--timeout', '150',
             '--network', 'link:0,40:inf:exchange=server', '--slowdown', 'static:1,1', '--',
             sys.executable,
             str(ROOT / 'experiments' / 'train.py'), '--config=mlp', '--mesh=1x1',
             '--set', 'model_args.hidden=32', '--set', 'model_args.width=16',
             '--set', 'global_batch=64', '--set', 'log_every=1', '--set', 'eval.enabled=False',
             '--set', 'logging.tensorboard=False', '--set', 'logging.mfu=False',
             '--set', 'host_row_s=0.0025', f'--steps={STEPS}',
             '--compilation_cache', f'--policy={policy}', f'--workdir={workdir}']
  env = dict(os.environ, HETJAX_COMPILATION_CACHE=str(cache))
  return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200, env=env)


@pytest.mark.multiprocess
@pytest.mark.timeout(420)
def test_train_py_lbbsp_moves_rows_off_the_slow_link_and_trains_as_uniform(tmp_path):
  """Worker 1's push and pull take 2 × 40 ms; both workers are hosts of 2.5 ms a row (32 rows:
  80 ms). LB-BSP with the links balances compute plus transfer: 48 rows on worker 0 (120 ms)
  and 16 on worker 1 (40 + 80 ms), once it has measured the step-time noise (its first
  program's compile makes a change costly, so it does not move on the first step's reading);
  the losses are uniform shares' to float rounding."""
  losses = {}
  for policy in ('lbbsp', 'uniform'):
    result = _launch(tmp_path / policy, policy, tmp_path / 'cache')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / policy / 'metrics.jsonl').read_text().splitlines()]
    losses[policy] = [r['loss'] for r in rows]
  share = load_telemetry(tmp_path / 'lbbsp').share
  assert (share[0] == 32).all() and tuple(share[-1]) == (48, 16), share
  assert (load_telemetry(tmp_path / 'uniform').share == 32).all()
  assert len(losses['lbbsp']) == STEPS
  np.testing.assert_allclose(losses['lbbsp'], losses['uniform'], rtol=1e-5)


def test_the_bench_prices_links_as_the_policies_do():
  from experiments import _analysis

  # The bench's limit with transfers is the virtual clock's (the same closed form).
  assert _analysis.balanced_time_s(400, [1, 1, 1, 1], ROW_S, 0.0, (0, 0, 0, 0.06)) == (
      pytest.approx(0.115))
  assert dataclasses.replace(simulation.ClockCosts(ROW_S), transfer_s=(0.0, 0.06)).transfers(
      2).tolist() == [0.0, 0.06]
  links = Links((0.0005,) * 2, (1e9, 1e7), Exchange.SERVER)
  assert emulation.parse_links(links.describe(), 2) == links
