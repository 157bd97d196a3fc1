r"""The `gpt` and `llama` language models trained by hetjax's `Trainer` against a hand-written JAX
+ optax loop.

Both sides train the same model (`hetjax.models.gpt` or `hetjax.models.llama`, ``--models``; the
stdlib bytes, ``seq_len`` 128) from the
same initial parameters (``seed`` 0, checked equal) on the same global batches
(``task.data.global_batch(seed, step, B)``, B = 8 rows of 129 tokens) with the same
``optax.adamw(1e-3)``, on the same 4 virtual CPU devices (mesh ``4x1`` over ``('data',
'model')``):

* **hetjax**: `Trainer` under `Strategy.DATA_PARALLEL` or `Strategy.FSDP`, driven by the real
  loop, `training_steps` (host batch, `put_batch`, the step);
* **plain**: one `jax.jit` of `jax.value_and_grad` of the mean loss and `optax.apply_updates`,
  its parameters and optimizer state given by hand-made `NamedSharding` in and out shardings
  and donated, the batch placed with `jax.device_put` split over both mesh axes. Data parallel:
  every parameter ``PartitionSpec()``. FSDP: each parameter's `PartitionSpec` is derived with
  `hetjax.sharding.param_shardings` from the model's logical names under FSDP's parameter rules
  (so the layout is hetjax's: checked on the initial arrays of both sides), and the loop builds
  its own `NamedSharding` objects from those specs; the optimizer state follows its parameters
  by `optax.tree_map_params`. Activations: with ``--plain_constraints`` (the default) the plain
  step traces the model under the strategy's compute rules
  (`hetjax.sharding.activation_rules`), so the model's own logical constraints hold as they do
  in hetjax (a hand-written Flax loop with logical axis rules): the like-for-like comparison;
  ``--noplain_constraints`` leaves the activations' layout to XLA's sharding propagation, as
  hand-written code without rules does (FSDP then contracts over the sharded embedding
  dimension and sums partial products across devices: another computation).

Sizes: ``3m`` (d_model 256, 8 heads, 4 layers: 3.32M gpt parameters) and ``25m`` (d_model 512, 8
heads, 8 layers: 25.5M), float32 and bfloat16 compute over float32 weights; ``tiny`` for the test.
The llama of a size has the gpt's d_model, heads and layers, 2 key/value heads and the SwiGLU width
8·d/3 (3m: 2.90M parameters, 25m: 22.3M). Per model × size × strategy × dtype: both steps are
compiled ahead of time (``compile_s``: lower + compile; their HLO collectives are counted with
`hetjax.bench.collective_bytes`), each side runs one untimed warm-up step, then R rounds each time
one block of N steps per side, the side that goes first alternating by round; a block ends at
`jax.block_until_ready` of its state and losses. ``step_s`` is the median block time / N,
``cpu_step_s`` the same with `time.process_time` (all of the process's threads: on a shared 2-core
machine it swings less with others' load than the wall clock). ``mfu``: each side's model FLOPs per
step as XLA counts its compiled step (`hetjax.bench.compiled_flops`, one device's part, × 4
devices), over the step time, over 4 × `hetjax.runtime.peak_flops` of one device measured once per
dtype (a 1024² matmul). The 4 virtual devices share the machine's 2 cores, so this peak overstates
what the 4 can do at once and the MFU is low by construction; it compares the two sides, not the
machine. ``analytic_flops_per_step`` is the model's ``flops_per_token`` × tokens, beside it for a
check (``flops_ratio``: XLA's count over it), and ``params`` the model's ``num_params``, checked
against the parameters the model holds. Losses: every step's loss on both sides, and the largest
relative difference.

Goals: float32 losses within 1e-6 relative (bit-identical expected for data parallel),
bfloat16 within 1e-2, hetjax / plain step time ≤ 1.03 (wall and CPU).

**Launched** (``--launched``, the default; ``--nolaunched`` skips it, ``--nointerleaved`` skips
the part above; `experiments/_lm_launched.py` says what it runs): the gpt under ``python -m
hetjax.launch``, 4 workers, uniform and LB-BSP shares under one 3x slow emulated host (30 steps,
quick 20) against the balanced ideal, and goodput of a 200-step run (quick 60) with
asynchronous checkpoints every 50 (quick 20), launched once with an empty compilation cache and
once again with the warm one. Goals: LB-BSP tokens/s ≥ 0.95 × the balanced ideal with
uniform's losses (1e-5); goodput ≥ 0.9.

Example::

  .venv/bin/python -m experiments.bench_lm --quick --json runs/bench26/lm_quick.json
  .venv/bin/python -m experiments.bench_lm --nointerleaved --json runs/bench26/lm_launched.json
  .venv/bin/python -m experiments.bench_lm --sizes=tiny --rounds=1 --steps=2 --dtypes=float32 \
      --nolaunched
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
from jax.sharding import Mesh, PartitionSpec

from experiments import _harness, _lm_launched
from experiments._plain_lm import PlainLM, SideBySide
from hetjax import ConfigError, models
from hetjax.bench import collective_bytes, compiled_flops
from hetjax.models import gpt, llama
from hetjax.runtime import enable_compilation_cache, peak_flops
from hetjax.sharding import abstract_model, make_mesh, param_shardings
from hetjax.train import Strategy, Trainer

DEVICES = 4
# name → (gpt make_task keyword arguments, global batch)
SIZES = {
    'tiny': ({'d_model': 64, 'heads': 4, 'layers': 1, 'seq_len': 32}, 8),
    '3m': ({'d_model': 256, 'heads': 8, 'layers': 4, 'seq_len': 128}, 8),
    '25m': ({'d_model': 512, 'heads': 8, 'layers': 8, 'seq_len': 128}, 8),
}
#: model → (its module, what it adds to a size's arguments)
MODELS = {'gpt': (gpt, {}), 'llama': (llama, {'kv_heads': 2})}
STRATEGIES = {'data_parallel': Strategy.DATA_PARALLEL, 'fsdp': Strategy.FSDP}
DTYPES = ('float32', 'bfloat16')
LR = 1e-3
SEED = 0
WARMUP_STEPS = 1
GOAL_RATIO = 1.03
# Why losses may differ at all. With --plain_constraints (the default) both sides trace the
# model under the same activation rules and compile the same collectives: the losses were
# bit-identical in float32 and bfloat16, data parallel and FSDP, at 3m and 25m. Without them
# (--noplain_constraints) the plain FSDP step contracts over the sharded embedding dimension on
# each device and all-reduces the partial sums, another order of reduction (float32: 8.9e-7
# after 7 steps at 3m, 1.5e-5 at 25m), and in bfloat16, where every matmul rounds its inputs to
# 8 mantissa bits, a different reduction order or fusion (the constraints move converts) rounds
# differently, by about 2^-8 relative per rounding rather than 2^-24, carried by the updates.
LOSS_RTOL = {'float32': 1e-6, 'bfloat16': 1e-2}

_MODELS = flags.DEFINE_list('models', list(MODELS), f'models, of {list(MODELS)}')
_SIZES = flags.DEFINE_list('sizes', None, f'sizes, of {list(SIZES)} (default 3m,25m; quick 3m)')
_STRATEGIES = flags.DEFINE_list('strategies', list(STRATEGIES), f'of {list(STRATEGIES)}')
_DTYPES = flags.DEFINE_list('dtypes', list(DTYPES), f'compute dtypes, of {list(DTYPES)}')
_PLAIN_CONSTRAINTS = flags.DEFINE_bool(
    'plain_constraints', True, 'the plain step keeps the model\'s activation constraints under '
    'the strategy\'s compute rules (False: XLA propagates the activations\' layout)')
FLAGS = _harness.define_flags('only 3m, R=3 rounds of N=2 steps; launched: 20-step shares '
                               'runs, a 60-step goodput run with checkpoints every 20')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'timed rounds R (default 5, quick 3)')
_STEPS = flags.DEFINE_integer('steps', None, 'steps N per timed block (default 3, quick 2)')


def _fsdp_specs(task, mesh: Mesh):
  """FSDP's parameter `PartitionSpec`s, from the model's logical names (`hetjax.sharding`)."""
  _, shapes, names = abstract_model(task.make_model, SEED)
  shardings = param_shardings(shapes, names, mesh, Strategy.FSDP.rules().params)
  return jax.tree.map(lambda s: s.spec, shardings)


def _bench(model: str, size: str, strategy: str, dtype: str, rounds: int, steps: int,
           peaks: dict[str, float]) -> list[dict]:
  """Times one model × size × strategy × dtype; returns its hetjax row and its plain row."""
  kwargs, global_batch = SIZES[size]
  module, extra = MODELS[model]
  args = {**kwargs, **extra, 'dtype': dtype, 'param_dtype': 'float32'}
  task = models.make_task(model, **args)
  mesh = make_mesh((DEVICES, 1), devices=jax.devices()[:DEVICES])
  optimizer = optax.adamw(LR)
  trainer = Trainer(task, optimizer, global_batch, mesh, STRATEGIES[strategy].rules(), SEED)
  specs = (_fsdp_specs(task, mesh) if strategy == 'fsdp' else
           jax.tree.map(lambda _: PartitionSpec(), trainer.state_shardings.params))
  constraints = _PLAIN_CONSTRAINTS.value
  plain = PlainLM(task, optimizer, mesh, specs, global_batch,
                  compute_rules=STRATEGIES[strategy].rules().compute if constraints else None)

  sides = SideBySide(trainer, plain)
  same = jax.tree.map(lambda a, b: np.array_equal(a, b), sides.state.params, sides.params)
  if not all(jax.tree.leaves(same)):
    raise AssertionError(f'{size}: hetjax and plain initial parameters differ')
  laid = jax.tree.map(lambda a, b: a.sharding.is_equivalent_to(b.sharding, a.ndim),
                      sides.state.params, sides.params)
  if not all(jax.tree.leaves(laid)):
    raise AssertionError(f'{size} {strategy}: the plain parameters are not laid out as hetjax\'s')

  def timed(run):
    def block() -> tuple[float, float]:
      wall, cpu = time.perf_counter(), time.process_time()
      run(steps)
      return time.perf_counter() - wall, time.process_time() - cpu
    return block

  sides.run_hetjax(WARMUP_STEPS)
  sides.run_plain(WARMUP_STEPS)
  times = _harness.interleave({'hetjax': timed(sides.run_hetjax),
                               'plain': timed(sides.run_plain)}, rounds)

  het_losses, plain_losses = sides.losses()
  rel, identical = sides.loss_difference()
  tokens = global_batch * args['seq_len']
  analytic = float(module.flops_per_token(args) * tokens)
  params = module.num_params(args)
  held = sum(x.size for x in jax.tree.leaves(sides.state.params))
  if held != params:
    raise AssertionError(f'{model} {size}: num_params says {params:,}, the model holds {held:,}')
  rows = []
  for side, compiled, compile_s, losses, diff in (
      ('hetjax', sides.hetjax_compiled, sides.hetjax_compile_s, het_losses, rel),
      ('plain', sides.plain_compiled, sides.plain_compile_s, plain_losses, 0.0)):
    step_s = statistics.median(w for w, _ in times[side]) / steps
    cpu_step_s = statistics.median(c for _, c in times[side]) / steps
    flops = compiled_flops(compiled) * DEVICES
    rows.append({
        'model': model, 'size': size, 'params': params, 'strategy': strategy, 'dtype': dtype,
        'side': side, 'step_s': step_s, 'cpu_step_s': cpu_step_s,
        'tokens_per_s': tokens / step_s, 'mfu': flops / step_s / (DEVICES * peaks[dtype]),
        'loss_max_rel_diff_vs_plain': diff, 'losses_bit_identical': identical,
        'compile_s': compile_s, 'flops_per_step': flops, 'analytic_flops_per_step': analytic,
        'flops_ratio': flops / analytic,
        'final_loss': float(losses[-1]), 'global_batch': global_batch,
        'seq_len': args['seq_len'], 'rounds': rounds, 'steps_per_block': steps,
        'collectives': collective_bytes(compiled).to_json(), 'source': 'measured',
        'plain_constraints': constraints})
  het, ref = rows
  het['ratio_wall'] = het['step_s'] / ref['step_s']
  het['ratio_cpu'] = het['cpu_step_s'] / ref['cpu_step_s']
  return rows


def _table(rows: list[dict]) -> str:
  head = (f'{"model":<6} {"size":<5} {"params":>10} {"strategy":<13} {"dtype":<8} {"side":<6} '
          f'{"ms/step":>8} {"cpu ms":>8} {"tok/s":>7} {"mfu":>6} {"loss diff":>9} '
          f'{"compile s":>9} {"AG":>4} {"RS":>4} {"AR":>4} {"flops":>5} {"ratio w/cpu":>11}')
  lines = [head, '-' * len(head)]
  for r in rows:
    counts = r['collectives']['counts']
    ratio = (f'{r["ratio_wall"]:.3f}/{r["ratio_cpu"]:.3f}' if r['side'] == 'hetjax' else '')
    lines.append(
        f'{r["model"]:<6} {r["size"]:<5} {r["params"]:>10,} {r["strategy"]:<13} '
        f'{r["dtype"]:<8} {r["side"]:<6} {1e3 * r["step_s"]:>8.1f} {1e3 * r["cpu_step_s"]:>8.1f} '
        f'{r["tokens_per_s"]:>7.0f} {r["mfu"]:>6.3f} {r["loss_max_rel_diff_vs_plain"]:>9.1e} '
        f'{r["compile_s"]:>9.2f} {counts["all_gather"]:>4} {counts["reduce_scatter"]:>4} '
        f'{counts["all_reduce"]:>4} {r["flops_ratio"]:>5.2f} {ratio:>11}')
  lines.append('all measured (wall clock and process CPU time), none modelled; AG/RS/AR: '
               'all-gathers, reduce-scatters, all-reduces in the compiled step; flops: XLA\'s '
               'count over flops_per_token × tokens; plain: ' + (
                   'with the model\'s activation constraints' if rows and
                   rows[0]['plain_constraints'] else 'no activation constraints'))
  return '\n'.join(lines)


def _goals(rows: list[dict]) -> list[str]:
  het = [r for r in rows if r['side'] == 'hetjax']
  lines = []
  for dtype, rtol in LOSS_RTOL.items():
    mine = [r for r in het if r['dtype'] == dtype]
    if mine:
      worst = max(r['loss_max_rel_diff_vs_plain'] for r in mine)
      exact = sum(r['losses_bit_identical'] for r in mine)
      met = sum(r['loss_max_rel_diff_vs_plain'] <= rtol for r in mine)
      lines.append(f'goal: {dtype} losses within {rtol:g} relative of plain: met by '
                   f'{met}/{len(mine)} (worst {worst:.1e}; bit-identical {exact}/{len(mine)})')
  for kind in ('wall', 'cpu'):
    met = sum(r[f'ratio_{kind}'] <= GOAL_RATIO for r in het)
    each = ', '.join(f'{r["model"]} {r["size"]} {r["strategy"]} {r["dtype"]} '
                     f'{r[f"ratio_{kind}"]:.3f}' for r in het)
    lines.append(f'goal: hetjax / plain {kind} step time ≤ {GOAL_RATIO}: met by '
                 f'{met}/{len(het)} ({each})')
  return lines


_INTERLEAVED = flags.DEFINE_bool('interleaved', True, 'the in-process hetjax-vs-plain part')
_LAUNCHED = flags.DEFINE_bool(
    'launched', True, 'the launched part: uniform vs LB-BSP shares of gpt on 4 emulated hosts '
    '(one 3x slow), and a goodput run with checkpoints')
_GOODPUT = flags.DEFINE_bool('goodput', True, 'the launched part\'s goodput runs (False: only '
                              'the shares runs)')
_LAUNCHED_STEPS = flags.DEFINE_integer('launched_steps', None,
                                       'steps of each shares run (default 30, quick 20)')
_GOODPUT_STEPS = flags.DEFINE_integer('goodput_steps', None,
                                      'steps of the goodput run (default 200, quick 60)')
_CHECKPOINT_EVERY = flags.DEFINE_integer('checkpoint_every', None,
                                         'the goodput run\'s checkpoints (default 50, quick 20)')
_HOST_ROW_S = flags.DEFINE_float('host_row_s', 0.01, 'seconds per row of an emulated host')


def _choices(values: list[str], known, flag: str) -> list[str]:
  unknown = [v for v in values if v not in known]
  if unknown or not values:
    raise ConfigError(f'--{flag}: unknown {unknown or "(none given)"}; choose from {list(known)}')
  return values


def _interleaved(names, sizes, strategies, dtypes, rounds: int, steps: int) -> list[dict]:
  if jax.device_count() < DEVICES:
    raise ConfigError(f'needs {DEVICES} devices, found {jax.device_count()}')
  start = time.perf_counter()
  peaks = {dtype: peak_flops(None, dtype)[0] for dtype in dtypes}
  print('peak FLOP/s of one device (measured, 1024² matmul): ' +
        ', '.join(f'{d} {v:.3g}' for d, v in peaks.items()))
  rows = []
  # A fresh persistent cache: a program compiled twice in this run (the initialisers of a
  # size under another dtype) compiles once. Every step program differs, so compile_s is cold.
  with _harness.compilation_cache() as cache:
    enable_compilation_cache(cache)
    for model in names:
      for size in sizes:
        for strategy in strategies:
          for dtype in dtypes:
            rows += _bench(model, size, strategy, dtype, rounds, steps, peaks)
  print(_table(rows))
  for line in _goals(rows):
    print(line)
  print(f'{time.perf_counter() - start:.1f} s')
  return rows


def main() -> None:
  quick = FLAGS.quick.value
  names = _choices(_MODELS.value, MODELS, 'models')
  sizes = _choices(_SIZES.value or (['3m'] if quick else ['3m', '25m']), SIZES, 'sizes')
  strategies = _choices(_STRATEGIES.value, STRATEGIES, 'strategies')
  dtypes = _choices(_DTYPES.value, DTYPES, 'dtypes')
  for flag, value in (('rounds', _ROUNDS.value), ('steps', _STEPS.value),
                      ('goodput_steps', _GOODPUT_STEPS.value),
                      ('checkpoint_every', _CHECKPOINT_EVERY.value)):
    if value is not None and value <= 0:
      raise ConfigError(f'--{flag} must be positive, got {value}')
  if _LAUNCHED_STEPS.value is not None and _LAUNCHED_STEPS.value < 3:
    raise ConfigError(f'--launched_steps must be at least 3 (the first is the warm-up), got '
                      f'{_LAUNCHED_STEPS.value}')
  if not _HOST_ROW_S.value > 0:
    raise ConfigError(f'--host_row_s must be positive, got {_HOST_ROW_S.value}')
  if not (_INTERLEAVED.value or _LAUNCHED.value):
    raise ConfigError('--nointerleaved and --nolaunched leave nothing to run')
  rounds = _ROUNDS.value or (3 if quick else 5)
  steps = _STEPS.value or (2 if quick else 3)
  start = time.perf_counter()
  rows = (_interleaved(names, sizes, strategies, dtypes, rounds, steps) if _INTERLEAVED.value
          else [])
  if _LAUNCHED.value:
    launched_start = time.perf_counter()
    with _harness.run_directory(FLAGS.keep.value) as root:
      rows += _lm_launched.run_launched(
          root, _LAUNCHED_STEPS.value or (20 if quick else 30),
          _GOODPUT_STEPS.value or (60 if quick else 200),
          _CHECKPOINT_EVERY.value or (20 if quick else 50), _HOST_ROW_S.value,
          goodput=_GOODPUT.value)
    print(f'launched part: {time.perf_counter() - launched_start:.0f} s')
  print(f'{time.perf_counter() - start:.1f} s in all')
  _harness.finish(rows, FLAGS.json.value)

if __name__ == '__main__':
  _harness.run_main('bench_lm.py', main, cpu_devices=DEVICES)
