r"""How much slower is a hetjax train step than a hand-written `jax.jit` data-parallel step?

Both sides train the same model from the same initial parameters on the same mesh (8 devices,
``8x1`` over ``('data', 'model')``) with ``optax.adam(1e-3)`` on the same global batches. hetjax
runs `Trainer` under `Strategy.DATA_PARALLEL` driven by the real loop, `training_steps` (host batch
creation and `put_batch` included); the reference is `PlainLM` (`experiments/_plain_lm.py`) with
every parameter replicated. After a warm-up that compiles both, R rounds each time one block of N
steps per side, the side that goes first alternating by round; a block ends at `jax.block_until_ready` of its last state. The ratio is
median(hetjax block) / median(plain block); the goal is ≤ 1.03. Both sides' losses at the last
step must agree to 1e-5 relative, which proves the two time the same computation.

Example::

  .venv/bin/python -m experiments.bench_overhead --quick --json /tmp/overhead.json
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

import jax
import numpy as np
import optax
from absl import flags

import hetjax
from experiments import _harness
from experiments._plain_lm import PlainLM
from hetjax import models
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Trainer, training_steps

# model name → (make_task keyword arguments, global batch)
MODELS = {
    'mlp': ({}, 256),
    'transformer': ({'d_model': 128, 'heads': 8, 'layers': 2, 'mlp': 512, 'seq_len': 64}, 64),
    'wide_deep': ({}, 256),
}
GOAL = 1.03
LOSS_RTOL = 1e-5
WARMUP_STEPS = 2

_MODELS = flags.DEFINE_list('models', list(MODELS), f'models to time, of {list(MODELS)}')
FLAGS = _harness.define_flags('few short rounds (R=5, N=10): a smoke run', keep=False)
_ROUNDS = flags.DEFINE_integer('rounds', None, 'timed rounds R (default 5 quick, 15 otherwise)')
_STEPS = flags.DEFINE_integer(
    'steps_per_block', None, 'steps N per timed block (default 10 quick, 20 otherwise)')


def _bench(name: str, rounds: int, steps: int) -> dict:
  """Times one model; returns its JSON row."""
  kwargs, global_batch = MODELS[name]
  task = models.make_task(name, **kwargs)
  mesh = make_mesh((jax.device_count(), 1))
  opt = optax.adam(1e-3)
  trainer = Trainer(task, opt, global_batch, mesh, Strategy.DATA_PARALLEL.rules())
  plain = PlainLM(task, opt, mesh, None, global_batch)  # every parameter replicated

  state = trainer.init_state()
  params, opt_state = plain.init()
  same = jax.tree.map(lambda a, b: np.array_equal(a, b), state.params, params)
  if not all(jax.tree.leaves(same)):
    raise AssertionError(f'{name}: hetjax and plain initial parameters differ')
  h = {'state': state, 'loss': None, 'step': 0}
  p = {'params': params, 'opt_state': opt_state, 'loss': None, 'step': 0}

  def run_hetjax(n: int) -> float:
    start = time.perf_counter()
    for info in training_steps(trainer, h['state'], until=h['step'] + n):
      h['state'], h['loss'] = info.state, info.metrics['loss']
    jax.block_until_ready((h['state'], h['loss']))
    h['step'] += n
    return time.perf_counter() - start

  def run_plain(n: int) -> float:
    start = time.perf_counter()
    params, opt_state, loss = p['params'], p['opt_state'], None
    for step in range(p['step'], p['step'] + n):
      params, opt_state, loss = plain.step(params, opt_state, plain.batch_at(step))
    jax.block_until_ready((params, opt_state, loss))
    p.update(params=params, opt_state=opt_state, loss=loss, step=p['step'] + n)
    return time.perf_counter() - start

  run_hetjax(WARMUP_STEPS)
  run_plain(WARMUP_STEPS)
  times = _harness.interleave({'hetjax': lambda: run_hetjax(steps),
                               'plain': lambda: run_plain(steps)}, rounds)  # order alternating

  a, b = float(h['loss']), float(p['loss'])
  if h['step'] != p['step'] or abs(a - b) > LOSS_RTOL * abs(b):
    raise AssertionError(
        f'{name}: loss at step {p["step"]} differs: hetjax {a!r} vs plain {b!r} '
        f'(relative {abs(a - b) / abs(b):.2e} > {LOSS_RTOL:g})')
  het_block, plain_block = statistics.median(times['hetjax']), statistics.median(times['plain'])
  return {
      'model': name,
      'ratio_hetjax_over_plain': het_block / plain_block,
      'hetjax_step_s': het_block / steps,
      'plain_step_s': plain_block / steps,
      'rounds': rounds,
      'steps_per_block': steps,
      'source': 'measured',
  }


def _table(rows: list[dict]) -> str:
  head = (f'{"model":<12} {"hetjax ms/step":>14} {"plain ms/step":>13} {"ratio":>6} '
          f'{"R":>3} {"N":>3}')
  lines = [head, '-' * len(head)]
  for r in rows:
    lines.append(
        f'{r["model"]:<12} {1e3 * r["hetjax_step_s"]:>14.3f} {1e3 * r["plain_step_s"]:>13.3f} '
        f'{r["ratio_hetjax_over_plain"]:>6.3f} {r["rounds"]:>3} {r["steps_per_block"]:>3}')
  lines.append('all measured (wall clock), none modelled')
  return '\n'.join(lines)


def main() -> None:
  unknown = [m for m in _MODELS.value if m not in MODELS]
  if unknown or not _MODELS.value:
    raise hetjax.ConfigError(f'unknown model(s) {unknown}; choose from {list(MODELS)}')
  quick = FLAGS.quick.value
  rounds = _ROUNDS.value or (5 if quick else 15)
  steps = _STEPS.value or (10 if quick else 20)
  for flag, value in (('rounds', _ROUNDS.value), ('steps_per_block', _STEPS.value)):
    if value is not None and value <= 0:
      raise hetjax.ConfigError(f'--{flag} must be positive, got {value}')
  start = time.perf_counter()
  rows = [_bench(m, rounds, steps) for m in _MODELS.value]
  print(_table(rows))
  print(f'goal: ratio ≤ {GOAL} (hetjax median block time / plain median block time); '
        f'met by {sum(r["ratio_hetjax_over_plain"] <= GOAL for r in rows)}/{len(rows)} models; '
        f'{time.perf_counter() - start:.1f} s')
  _harness.finish(rows, FLAGS.json.value)


if __name__ == '__main__':
  _harness.run_main('bench_overhead.py', main, cpu_devices=8)
