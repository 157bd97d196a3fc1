"""LB-BSP does no harm: it moves shares only when the move pays for its compiles and clears the
measured noise, it prices a step's fixed cost, and a step beside a compile is no speed sample.

The hosts here are scripted: worker i's step takes factor_i × (fixed + rows × per_row) seconds,
times a seeded noise, and a share size a worker has not run before costs ``compile_s`` of
compiling, reported as `StepStats.worker_compile_s` and marking the step as no sample (as
`hetjax.train.WorkerTrainer` reports a real one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetjax.balance import EWMA, LBBSP
from hetjax.balance._lbbsp import MIN_NOISE_SAMPLES
from hetjax.core import ShareRules, StepStats
from hetjax.train._share_programs import AUTO_CALLS, Granularity, SharePrograms

X, WORKERS, BUCKET = 64, 4, 4
RULES = ShareRules(X, WORKERS, BUCKET)
UNIFORM = X // WORKERS


def _run(policy, factors, steps, *, fixed_s=0.0, row_s=1e-3, noise_cv=0.0, compile_s=0.0,
         seed=0):
  """The shares of every step and the total modelled time, compiles included."""
  rng = np.random.default_rng(seed)
  state, seen = policy.init(), [set() for _ in range(WORKERS)]
  shares, history, total = policy.update(state, None)[0], [], 0.0
  for step in range(steps):
    x = np.asarray(shares.values)
    noise = np.exp(noise_cv * rng.standard_normal(WORKERS)) if noise_cv else 1.0
    busy = np.asarray(factors) * (fixed_s + x * row_s) * noise
    compiled = np.array([compile_s if int(v) not in s else 0.0 for v, s in zip(x, seen,
                                                                              strict=True)])
    for v, s in zip(x, seen, strict=True):
      s.add(int(v))
    clean = not compiled.any()
    stats = StepStats(step, tuple(int(v) for v in x), tuple(busy.tolist()),
                      iter_s=float(busy.max()), sampled=(clean,) * WORKERS,
                      worker_compile_s=tuple(compiled.tolist()))
    total += float(busy.max()) + float(compiled.max())
    history.append(tuple(int(v) for v in x))
    shares, state = policy.update(state, stats)
  return history, total, state


def _changes(history, after=0):
  return sum(a != b for a, b in zip(history[after:], history[after + 1:], strict=False))


def test_equal_hosts_under_noise_never_move_when_a_compile_costs_more_than_the_noise_gains():
  # 50 ms steps, 30% noise a worker a step, a 1.5 s compile: nothing to gain, never a move.
  for seed in range(3):
    history, _, _ = _run(LBBSP(RULES, EWMA()), (1, 1, 1, 1), 100, row_s=50e-3 / UNIFORM,
                         noise_cv=0.3, compile_s=1.5, seed=seed)
    assert set(history) == {RULES.uniform().values}, seed


def test_a_straggler_under_noise_moves_once_and_holds():
  # Slow worker 3x; noise 10%; each new size costs 0.5 s: at most 3 changes in 100 steps after
  # the warm-up, and the run beats uniform shares, compiles included.
  for seed in range(3):
    kwargs = dict(row_s=0.1 / UNIFORM, noise_cv=0.1, compile_s=0.5, seed=seed)
    history, total, _ = _run(LBBSP(RULES, EWMA()), (1, 1, 1, 3), 100, **kwargs)
    uniform = _run(LBBSP(RULES, EWMA(), dead_band=10.0, jump=10.0), (1, 1, 1, 3), 100, **kwargs)
    assert _changes(history, after=10) <= 3, (seed, history)
    assert history[-1][3] < UNIFORM and total < 0.7 * uniform[1], (seed, history[-1], total)


def test_a_move_that_does_not_repay_its_compile_is_not_made():
  # 10 ms steps: balancing a 3x straggler saves ~5 ms a step, 0.25 s over the 50-step horizon,
  # against a 2 s compile: stay. Make the compile 0.1 s and it moves, straight to its target.
  history, _, _ = _run(LBBSP(RULES, EWMA()), (1, 1, 1, 3), 30, row_s=3.3e-3 / UNIFORM,
                       compile_s=2.0)
  assert set(history) == {RULES.uniform().values}
  history, _, state = _run(LBBSP(RULES, EWMA()), (1, 1, 1, 3), 30, row_s=3.3e-3 / UNIFORM,
                           compile_s=0.1)
  moved = [h for h in history if h != RULES.uniform().values]
  assert moved and len(set(moved)) == 1  # one move, all the way
  assert state.move_cost_s == pytest.approx(0.1)  # the move's own compiles, measured


def test_a_fixed_cost_is_priced_and_learned():
  # 80% of a uniform share's time is fixed: a 3x straggler should keep most of its rows (time
  # ∝ rows would strip it to one bucket and overload the others).
  fixed, row = 0.08, 0.02 / UNIFORM
  splits = [(a, a, a, X - 3 * a) for a in range(BUCKET, X // 3 + 1, BUCKET) if X - 3 * a >= BUCKET]
  times = [max(fixed + a * row, 3 * (fixed + b * row)) for a, _, _, b in splits]
  best = splits[int(np.argmin(times))]
  priced = LBBSP(RULES, EWMA(), fixed_fraction=fixed / (fixed + UNIFORM * row))
  history, _, state = _run(priced, (1, 1, 1, 3), 20, fixed_s=fixed, row_s=row)
  assert history[-1] == best and _changes(history) == 1
  assert state.fraction == pytest.approx(0.8, abs=0.01)  # measured from the move: the same
  naive = LBBSP(RULES, EWMA())  # starts from time ∝ rows, learns the fixed part from its move
  history, _, state = _run(naive, (1, 1, 1, 3), 20, fixed_s=fixed, row_s=row)
  assert state.fraction == pytest.approx(0.8, abs=0.01)
  assert history[-1] == best and _changes(history) <= 3


def test_a_compile_on_any_worker_is_no_sample_for_the_others():
  from hetjax.train._head import StepHead
  from hetjax.train._workers import WorkerTrainer

  head = StepHead(2)
  values = np.zeros(head.size)
  for worker, (busy, compile_s) in enumerate(((0.05, 0.0), (2.0, 1.4))):
    values[list(head.slots(worker))] += [busy, 1.0, 1.0, 32, compile_s, worker == 0]
  trainer = WorkerTrainer.__new__(WorkerTrainer)  # stats() reads only the head and the bytes
  trainer._layout_head, trainer._fused_size = head, 1
  trainer.fused_layout = type('Layout', (), {'separate_bytes': 0})()
  from hetjax.core import WorkerTiming
  local = WorkerTiming(1, 0, 32, 1.0, 0.0, 0.05, 0.0, 0.01, 2.1)
  stats = trainer.stats(0, head.read(values), 2.1, 0.0, local)
  assert stats.sampled == (False, False) and stats.worker_compile_s == (0.0, pytest.approx(1.4))
  assert stats.worker_ready == (True, False)


def _partial(params, batch):
  def loss(w):
    return jnp.sum((batch['x'] @ w - batch['y']) ** 2) / X
  return jax.value_and_grad(loss)(params)


def _batch(rows, seed=0):
  rng = np.random.default_rng(seed)
  return {'x': jnp.asarray(rng.normal(size=(rows, 8)), jnp.float32),
          'y': jnp.asarray(rng.normal(size=(rows,)), jnp.float32)}


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


PARAMS = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)


def test_micro_granularity_never_compiles_a_share_size_and_its_pieces_are_samples():
  programs = SharePrograms(jax.jit(_partial).lower, bucket=4, max_rows=52,
                           granularity='micro')
  programs(_add, PARAMS, _batch(16))
  assert programs.sizes == (16,) and programs.compiles == 1
  for rows in (20, 4, 28, 52, 12):
    batch = _batch(rows, seed=rows)
    got = programs(_add, PARAMS, batch)
    want = _partial(PARAMS, batch)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-7)
    assert not programs.last_ran_pieces  # the steady state, not a stopgap: speed samples
  assert programs.sizes == (4, 16) and programs.compiles == 2  # the micro-batch, once
  assert programs.background_compiles == 0
  programs.close()


def test_auto_picks_micro_when_a_compile_costs_more_than_a_few_calls():
  programs = SharePrograms(jax.jit(_partial).lower, bucket=4, max_rows=52, granularity='auto')
  programs(_add, PARAMS, _batch(16))
  programs.observe(16, programs.compile_s / (2 * AUTO_CALLS))  # a call: 1/10 of the compile
  programs(_add, PARAMS, _batch(20))
  assert programs.granularity is Granularity.MICRO and programs.sizes == (4, 16)
  cheap = SharePrograms(jax.jit(_partial).lower, bucket=4, max_rows=52, granularity='auto')
  cheap(_add, PARAMS, _batch(16))
  cheap.observe(16, cheap.compile_s)  # a call as long as the compile: compile each size
  cheap(_add, PARAMS, _batch(20))
  cheap.wait()  # its background compile of 20, done before the test ends
  assert cheap.granularity is Granularity.COMPILE and 20 in cheap.sizes
  cheap.close()


def test_a_move_waiting_for_its_second_look_names_its_shares_and_the_programs_compile_ahead():
  # Under material noise a costly move waits for a second decision; the held shares carry it:
  policy = LBBSP(RULES, EWMA())
  state = policy.init()
  shares = policy.update(state, None)[0]
  held = []
  for step in range(10):
    x = np.asarray(shares.values)
    busy = np.asarray((1, 1, 1, 3)) * x * 5e-3 * (1 + 0.2 * (step % 2))  # 20% noise
    stats = StepStats(step, tuple(int(v) for v in x), tuple(busy.tolist()),
                      sampled=(step > 0,) * WORKERS,
                      worker_compile_s=(1.0 if step == 0 else 0.0,) * WORKERS)
    shares, state = policy.update(state, stats)
    held.append(shares.upcoming)
    if shares.values != RULES.uniform().values:
      break
  first = next(k for k, h in enumerate(held) if h is not None)
  # Step 0 compiled; then the noise is measured on quiet steps (a sample a pair of them).
  assert first >= MIN_NOISE_SAMPLES + 1 and held[first][3] < UNIFORM  # then prepared
  assert len(held) == first + 2 and shares.values == held[first]  # made at the second look
  assert shares.upcoming is None
  # ... and a worker compiles what that share needs in the background, before it runs it.
  programs = SharePrograms(jax.jit(_partial).lower, bucket=4, max_rows=52,
                           granularity='micro')
  programs(_add, PARAMS, _batch(16))
  programs.prepare(held[first][0])
  programs.wait()
  assert programs.sizes == (4, 16) and programs.background_compiles == 1
  programs(_add, PARAMS, _batch(held[first][0]))
  assert programs.last_compile_s == 0.0  # nothing left to wait for
  programs.close()


def test_hosts_a_compile_does_not_spoil_prepare_the_move_while_the_noise_is_measured():
  # Step 0 compiled and every worker still sampled (padded hosts with room to spare): the move
  # is prepared from the first sample on, not only once the noise is measured.
  policy = LBBSP(RULES, EWMA())
  state, shares = policy.init(), RULES.uniform()
  held = []
  for step in range(3):
    x = np.asarray(shares.values)
    busy = np.asarray((1, 1, 1, 3)) * x * 5e-3
    stats = StepStats(step, tuple(int(v) for v in x), tuple(busy.tolist()),
                      sampled=(True,) * WORKERS,
                      worker_compile_s=(1.0 if step == 0 else 0.0,) * WORKERS)
    shares, state = policy.update(state, stats)
    held.append(shares.upcoming)
  assert state.immune and shares.values == RULES.uniform().values  # still measuring the noise
  assert held[0] is not None and held[0][3] < UNIFORM


def test_hosts_padded_to_their_time_need_no_noise_samples_before_a_move():
  # Every worker's busy time is its host's (`worker_exact`): a measurement without noise, so
  # the move is prepared at the first decision and made as soon as every worker is ready,
  # not after MIN_NOISE_SAMPLES quiet steps. The same steps unpadded wait for the samples.
  def first_move(exact: bool) -> int:
    policy = LBBSP(RULES, EWMA())
    state, shares = policy.init(), RULES.uniform()
    for step in range(12):
      x = np.asarray(shares.values)
      if x[3] < UNIFORM:
        return step
      busy = np.asarray((1, 1, 1, 3)) * x * 5e-3
      stats = StepStats(step, tuple(int(v) for v in x), tuple(busy.tolist()),
                        sampled=(step > 0 or exact,) * WORKERS,
                        worker_compile_s=(1.0 if step == 0 else 0.0,) * WORKERS,
                        worker_ready=(shares.upcoming is not None,) * WORKERS,
                        worker_exact=(exact,) * WORKERS)
      shares, state = policy.update(state, stats)
    return -1

  assert first_move(exact=True) == 2  # prepared after step 0, ready at step 1
  assert first_move(exact=False) >= MIN_NOISE_SAMPLES + 2


def test_a_costly_move_waits_until_every_worker_has_compiled_its_share():
  # Workers report whether they can run the prepared shares without a compile; a new size's
  # program takes 4 steps to compile in the background. The move is held until all are ready,
  # then made to the prepared split: no step ever runs a size its worker has not compiled.
  policy = LBBSP(RULES, EWMA())
  state, shares = policy.init(), RULES.uniform()
  compiled = [{UNIFORM} for _ in range(WORKERS)]
  started: list[dict[int, int]] = [{} for _ in range(WORKERS)]  # size -> step its compile began
  held_steps, history = 0, []
  for step in range(30):
    x = np.asarray(shares.values)
    assert all(int(v) in c for v, c in zip(x, compiled, strict=True)), (step, x)  # no wait
    upcoming = shares.upcoming
    if upcoming is not None:
      held_steps += 1
      for w, size in enumerate(upcoming):
        started[w].setdefault(int(size), step)
    for w in range(WORKERS):
      compiled[w] |= {s for s, began in started[w].items() if step - began >= 4}
    ready = tuple(upcoming is None or int(upcoming[w]) in compiled[w] for w in range(WORKERS))
    busy = np.asarray((1, 1, 1, 3)) * x * 5e-3
    stats = StepStats(step, tuple(int(v) for v in x), tuple(busy.tolist()),
                      sampled=(step > 0,) * WORKERS,
                      worker_compile_s=(1.0 if step == 0 else 0.0,) * WORKERS,
                      worker_ready=ready)
    history.append(tuple(int(v) for v in x))
    shares, state = policy.update(state, stats)
  assert history[-1][3] < UNIFORM and _changes(history) == 1  # moved once, to the balance
  assert held_steps >= 4  # held while the programs compiled


def test_share_programs_say_when_a_prepared_share_runs_without_a_compile():
  programs = SharePrograms(jax.jit(_partial).lower, bucket=4, max_rows=52,
                           granularity='micro')
  assert programs.ready  # nothing prepared
  programs(_add, PARAMS, _batch(16))
  programs.prepare(32)  # two of the first size: nothing to compile
  assert programs.ready and programs.background_compiles == 0
  programs.prepare(20)  # 16 + 4: the micro-batch's program, compiling in the background
  programs.wait()
  assert programs.ready and programs.sizes == (4, 16)
  programs.prepare(None)
  assert programs.ready
  programs.close()


def test_a_prepared_compile_that_fails_is_raised_not_waited_for_forever():
  def lower(params, batch):
    if len(batch['x']) == 4:
      raise ValueError('no program for 4 rows')
    return jax.jit(_partial).lower(params, batch)

  programs = SharePrograms(lower, bucket=4, max_rows=52, granularity='micro')
  programs(_add, PARAMS, _batch(16))
  programs.prepare(20)  # needs the micro-batch's program, whose compile raises
  programs.wait()
  with pytest.raises(ValueError, match='no program for 4 rows'):
    assert programs.ready
  programs.close()
