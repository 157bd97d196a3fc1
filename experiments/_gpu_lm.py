"""The GPU check's language-model part: the `gpt` model of `gpt2_small` (124M parameters,
sequence 1024, bfloat16 compute over float32 weights and optimizer state) on one device.

* **hetjax vs plain**, for each variant (`VARIANTS`: the config's attention, ``'auto'``, which
  is cuDNN's fused attention on a GPU, with rematerialisation ``none`` and ``save_dots``; then
  XLA's attention with ``save_dots``, to show what the kernel is worth), at the config's batch
  (32 × 1024 tokens), 8 rounds of 5 steps a side: hetjax's `Trainer` (data
  parallel on a 1×1 mesh, driven by `training_steps`) and the hand-written `PlainLM` loop (the
  model's own activation constraints kept), same model, seed, batches and ``optax.adamw``,
  interleaved in blocks (`_harness.interleave`, the first side alternating). ``step_s``: the
  median block / steps; ``tokens_per_s``; ``mfu``: the model's FLOPs
  (`hetjax.models.gpt.flops_per_token`, PaLM's ``6·N + 12·L·T·d``, remat's recompute not
  counted) per second over the device's bfloat16 peak measured by a matmul
  (`hetjax.runtime.peak_flops`); ``mfu_datasheet``: the same over the datasheet's dense peak
  where the device is known (`DATASHEET_BF16`); ``hfu``: XLA's FLOP count of the lowered step
  (before XLA's passes, which on a GPU hide the matmuls in cuBLAS custom calls; remat's
  recompute counted, a cuDNN kernel's FLOPs not) over the measured peak;
  ``first_step_s``: the warm-up step, its compile (or persistent-cache load) included;
  ``loss_max_rel_diff``: every step's loss against the plain loop's. A variant that fails is
  a row with its error; the others still run.
* **largest batch**: hetjax's step (the config's ``save_dots``) at doubling batches above the
  config's (64, 128, 256) until the device runs out of memory (or the ladder ends), one step
  each, compiled fast (`LADDER_COMPILER_OPTIONS`: no autotuning, the lowest backend
  optimisation; the same buffers), a batch whose compiled step needs more than the device's
  limit not run; beside the largest that ran, the planner's memory estimate for it
  (`hetjax.planner.profile_submodels` and `search` for this one device: parameters, optimizer
  state and activations) and what XLA's compiled step says it needs (``memory_analysis``:
  arguments, outputs and temporaries, the donated state once).

* **where the step's time goes** (the first variant's hetjax step): each distinct matmul of
  the step (and cuDNN's attention kernels) timed alone at its shapes
  (`hetjax.bench.time_matmuls`), times how often the step runs it; the step's time less theirs
  is the rest (norms, activations, the loss's softmax over the vocabulary, the optimizer's
  update); ``mfu_ceiling`` is the MFU the step would reach if only its matmuls ran.

Order: the first variant (the goals' numbers), where its time goes, the largest batch, the
other variants; `run` yields each row as it is measured, and the check writes it at once (a
second H200 run was killed after 379 s of this part with nothing written: compiles of GPT-2
small dominate it).

``--quick`` (the suite's CPU run): the same code on a gpt of 1 layer, d_model 32, sequence 32,
batch 4, one round of one step and a ladder to 8; its numbers only show the code runs.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterator

import jax
import optax
from jax.sharding import PartitionSpec

from experiments import _harness
from experiments._gpu_curve import is_out_of_memory
from experiments._plain_lm import PlainLM, SideBySide
from hetjax import models, planner
from hetjax.bench import compiled_bytes, time_matmuls
from hetjax.models import gpt
from hetjax.run import load_config
from hetjax.runtime import peak_flops
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Trainer, program_flops

SEED = 0
LR = 3e-4
GOAL_RATIO = 1.03
GOAL_MFU = 0.40
#: ``(attention, remat)`` pairs the comparison runs, in order; one whose attention resolves to
#: a pair already run (``'auto'`` is XLA's on a CPU) is skipped.
VARIANTS = (('auto', 'none'), ('auto', 'save_dots'), ('xla', 'save_dots'))
#: Dense bfloat16 FLOP/s from NVIDIA's datasheets (SXM parts), by a word of `device_kind`.
DATASHEET_BF16 = {'H100': 989.4e12, 'H200': 989.4e12, 'A100': 312e12}


@dataclasses.dataclass(frozen=True)
class Sizes:
  """What one run of the part measures: the model's arguments, its batch, the timed rounds and
  steps a block, and the batch ladder."""

  model: dict
  batch: int
  rounds: int
  steps: int
  ladder: tuple[int, ...]


def sizes(quick: bool) -> Sizes:
  """GPT-2 small as `gpt2_small` configures it (its data: the stdlib bytes, nothing to read),
  or (quick) a tiny gpt."""
  if quick:
    return Sizes({'vocab_size': 256, 'd_model': 32, 'heads': 2, 'layers': 1, 'mlp': 64,
                  'seq_len': 32, 'dtype': 'bfloat16', 'param_dtype': 'float32'}, 4, 1, 1,
                 (4, 8))
  config = load_config('gpt2_small')
  args = {**config.model.task_args(), 'data': None}
  args.pop('remat', None)
  # The ladder starts above the config's batch, which the comparison runs (without remat).
  return Sizes(args, config.data.global_batch, 8, 5, (64, 128, 256))


def _task(args: dict, remat: str, attention: str = 'auto'):
  return models.make_task('gpt', **{**args, 'attention': attention}, remat=remat)


def datasheet_peak(device_kind: str) -> float | None:
  """The datasheet's dense bfloat16 FLOP/s of a device named ``device_kind``, if known."""
  return next((v for k, v in DATASHEET_BF16.items() if k in device_kind), None)


def _one_device_mesh():
  return make_mesh((1, 1), devices=jax.devices()[:1])


def _implementation(args: dict, attention: str) -> str:
  """``'xla'`` or ``'cudnn'``: what ``attention`` resolves to for ``args`` on this backend."""
  return gpt.GPTConfig.of({**args, 'attention': attention}).attention_implementation(
      jax.default_backend())


def _error(e: Exception) -> str:
  """``Type: first line`` of ``e``, at most 300 characters of it."""
  return f'{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ""}'


def _compare(args: dict, implementation: str, remat: str, s: Sizes, peak: float) -> list[dict]:
  """hetjax's Trainer and the plain loop, interleaved, for one attention kernel
  (`_implementation`) and remat."""
  task = _task(args, remat, implementation)
  mesh = _one_device_mesh()
  optimizer = optax.adamw(LR)
  rules = Strategy.DATA_PARALLEL.rules()
  trainer = Trainer(task, optimizer, s.batch, mesh, rules, SEED)
  specs = jax.tree.map(lambda _: PartitionSpec(), trainer.state_shardings.params)
  plain = PlainLM(task, optimizer, mesh, specs, s.batch, compute_rules=rules.compute)

  sides = SideBySide(trainer, plain, compile_ahead=False)

  def timed(side):
    def block() -> float:
      start = time.perf_counter()
      side(s.steps)
      return time.perf_counter() - start
    return block

  # Warm-up: the first step compiles (or loads from the persistent cache) and allocates.
  first_s = {'hetjax': timed(sides.run_hetjax)(), 'plain': timed(sides.run_plain)()}
  times = _harness.interleave({'hetjax': timed(sides.run_hetjax),
                               'plain': timed(sides.run_plain)}, s.rounds)
  diff, _ = sides.loss_difference()
  tokens = s.batch * args['seq_len']
  model_flops = gpt.flops_per_token(args) * tokens
  datasheet = datasheet_peak(jax.devices()[0].device_kind)
  rows = []
  for side, traced, lowered in (('hetjax', sides.hetjax_traced, sides.hetjax_lowered),
                                 ('plain', sides.plain_traced, sides.plain_lowered)):
    step_s = statistics.median(times[side]) / s.steps
    flops = program_flops(traced, lowered)
    rows.append({'part': 'lm', 'kind': 'compare', 'attention': implementation,
                 'remat': remat, 'side': side,
                 'batch': s.batch, 'seq_len': args['seq_len'], 'step_s': step_s,
                 'tokens_per_s': tokens / step_s, 'model_flops_per_step': model_flops,
                 'xla_flops_per_step': flops, 'mfu': model_flops / step_s / peak,
                 'mfu_datasheet': (model_flops / step_s / datasheet) if datasheet else None,
                 'datasheet_peak': datasheet, 'hfu': flops / step_s / peak,
                 'first_step_s': first_s[side],
                 'loss_max_rel_diff': diff if side == 'hetjax' else 0.0,
                 'params': sum(x.size for x in jax.tree.leaves(sides.state.params)),
                 'measured': ['step_s', 'tokens_per_s', 'mfu', 'hfu', 'first_step_s',
                              'loss_max_rel_diff']})
  rows[0]['ratio'] = rows[0]['step_s'] / rows[1]['step_s']
  return rows, sides.hetjax_traced


#: The costliest distinct matmuls the breakdown lists.
TOP_MATMULS = 6


def _breakdown(traced, compared: dict, peak: float) -> dict:
  """Where hetjax's step of ``compared`` (its row) spends its time: its matmuls timed alone
  (cuDNN's attention apart), and the rest."""
  timed = time_matmuls(traced.jaxpr)
  done = [m for m in timed.matmuls if m.seconds is not None]
  attention = sum(m.seconds * m.count for m in done if m.primitive != 'dot_general')
  top = sorted(done, key=lambda m: m.seconds * m.count, reverse=True)[:TOP_MATMULS]
  return {'part': 'lm', 'kind': 'breakdown',
          **{k: compared[k] for k in ('attention', 'remat', 'batch', 'step_s')},
          'matmul_s': timed.seconds - attention, 'attention_kernel_s': attention,
          'rest_s': compared['step_s'] - timed.seconds, 'matmul_flops': timed.flops,
          'distinct': len(timed.matmuls), 'runs': sum(m.count for m in timed.matmuls),
          'untimed': [f'{m.primitive} {m.shapes}: {m.error}' for m in timed.untimed],
          'mfu_ceiling': compared['model_flops_per_step'] / timed.seconds / peak,
          'mfu_ceiling_datasheet': (compared['model_flops_per_step'] / timed.seconds
                                    / compared['datasheet_peak']
                                    if compared['datasheet_peak'] else None),
          'top': [{'primitive': m.primitive, 'shapes': [list(x) for x in m.shapes],
                   'dtypes': list(m.dtypes), 'count': m.count, 'seconds': m.seconds,
                   'flops_per_s': m.flops / m.seconds} for m in top],
          'measured': ['matmul_s', 'attention_kernel_s', 'top[].seconds',
                       'top[].flops_per_s'],
          'derived': ['rest_s (step_s, measured, less the timed matmuls)', 'mfu_ceiling']}


#: How the ladder compiles its steps: without autotuning the GPU's matmuls and at the lowest
#: backend optimisation. Buffers are assigned before either (the same memory, compiled faster);
#: the step still runs, to show it fits, but is not timed.
LADDER_COMPILER_OPTIONS = {'xla_gpu_autotune_level': 0, 'xla_backend_optimization_level': 0}


def _compiled_bytes(compiled) -> float | None:
  """`hetjax.bench.compiled_bytes` (the donated state counted once), None without an
  analysis."""
  return None if compiled.memory_analysis() is None else float(compiled_bytes(compiled))


def _largest_batch(args: dict, s: Sizes) -> dict:
  """hetjax's step (``save_dots``) at each ladder batch until one does not fit; the planner's
  and XLA's memory for the largest that ran. A batch whose compiled step needs more than the
  device's limit (``memory_analysis``) is not fitted and not run; one that does is run once
  (`LADDER_COMPILER_OPTIONS`), and running out of memory there ends the ladder too."""
  task = _task(args, 'save_dots')
  mesh = _one_device_mesh()
  device = jax.devices()[0]
  limit = (device.memory_stats() or {}).get('bytes_limit') if hasattr(
      device, 'memory_stats') else None
  fitted, compiled_bytes, failed = None, None, None
  for batch in s.ladder:
    try:
      trainer = Trainer(task, optax.adamw(LR), batch, mesh, Strategy.DATA_PARALLEL.rules(),
                        SEED)
      compiled = trainer.lower_step().compile(compiler_options=LADDER_COMPILER_OPTIONS)
      needs = _compiled_bytes(compiled)
      if limit and needs and needs > limit:
        failed = {'batch': batch, 'error': f'its compiled step needs {needs / 2**30:.2f} GiB, '
                  f'over the device\'s {limit / 2**30:.2f} (not run)'}
        break
      state = trainer.init_state()
      # The compiled step itself runs: a second compile under jit would double the ladder's.
      state, _ = compiled(state, trainer.put_batch(trainer.global_batch_at(0)))
      jax.block_until_ready(state)
    except Exception as e:
      if not is_out_of_memory(e):
        raise
      failed = {'batch': batch, 'error': str(e).splitlines()[0][:200]}
      break
    compiled_bytes, fitted = needs, batch
    del state, trainer, compiled
  estimate = _planner_memory(task, fitted) if fitted else None
  return {'part': 'lm', 'kind': 'largest_batch', 'remat': 'save_dots', 'ladder': list(s.ladder),
          'largest_batch': fitted, 'first_failed': failed,
          'device_bytes_limit': limit, 'compiled_bytes': compiled_bytes,
          'planner_bytes': estimate,
          'planner_over_compiled': (estimate / compiled_bytes
                                    if estimate and compiled_bytes else None),
          'measured': ['largest_batch', 'first_failed', 'compiled_bytes (XLA memory_analysis)',
                       'device_bytes_limit'],
          'modelled': ['planner_bytes']}


def _planner_memory(task, batch: int) -> float:
  """The planner's modelled bytes on this one device for ``batch``: the plan `search` picks,
  its sub-models' memory summed (one device runs them all)."""
  profiles = planner.profile_submodels(task, batch_size=batch)
  cluster = planner.measure_cluster(jax.devices()[:1], repeats=2)
  plan = planner.search(profiles, cluster, batch, memory_cap=float('inf'), micro_batches=1)
  return float(sum(sub.memory_bytes for sub in plan.submodels))


def run(quick: bool) -> Iterator[dict | list[dict]]:
  """The part's rows, yielded as soon as they are measured (the check writes them at once, so
  a run cut short keeps them): hetjax's and the plain loop's rows of the first variant (a list:
  measured together), the largest batch, then the other variants (the goals' numbers first).
  Each row says how many seconds its measurement took (``seconds``: compiles included)."""
  s = sizes(quick)
  peak, source = peak_flops(None, 'bfloat16', jax.devices()[0])
  compared, seen = 0, set()
  for i, (attention, remat) in enumerate(VARIANTS):
    # A variant that resolves to one already run (on a CPU, 'auto' is XLA's) is not run again.
    implementation = _implementation(s.model, attention)
    if (implementation, remat) not in seen:
      seen.add((implementation, remat))
      start = time.perf_counter()
      traced = None
      try:
        pair, traced = _compare(s.model, implementation, remat, s, peak)
        compared += 1
        yield [{**row, 'peak_flops': peak, 'peak_source': source,
                'seconds': time.perf_counter() - start} for row in pair]  # measured together
      except Exception as e:  # recorded as a row: the other variants still run
        yield {'part': 'lm', 'kind': 'failed', 'attention': attention, 'remat': remat,
               'error': _error(e), 'seconds': time.perf_counter() - start}
      if i == 0 and traced is not None:
        start = time.perf_counter()
        try:
          yield {**_breakdown(traced, pair[0], peak), 'seconds': time.perf_counter() - start}
        except Exception as e:
          yield {'part': 'lm', 'kind': 'failed', 'attention': implementation, 'remat': remat,
                 'error': f'breakdown: {_error(e)}', 'seconds': time.perf_counter() - start}
    if i == 0:
      start = time.perf_counter()
      try:
        yield {**_largest_batch(s.model, s), 'seconds': time.perf_counter() - start}
      except Exception as e:
        yield {'part': 'lm', 'kind': 'failed', 'attention': 'auto', 'remat': 'save_dots',
               'error': f'largest batch: {_error(e)}', 'seconds': time.perf_counter() - start}
  if not compared:
    raise RuntimeError('no variant of hetjax vs plain ran (see the failed rows)')


def markdown(rows: list[dict]) -> list[str]:
  """The part's section of ``gpu_check.md``."""
  compare = [r for r in rows if r['kind'] == 'compare']
  size = (f'{compare[0]["params"]:,} parameters, sequence {compare[0]["seq_len"]}'
          if compare else 'no run')
  lines = [f'### The gpt language model ({size}, bfloat16 over float32): hetjax vs plain', '',
           '| attention | remat | side | batch | ms/step | tokens/s | MFU (measured peak) | '
           'MFU (datasheet) | HFU (XLA FLOPs) | loss diff vs plain | first step s | '
           'hetjax / plain |', '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in compare:
    ratio = f'{r["ratio"]:.3f}' if 'ratio' in r else ''
    sheet = 'n/a' if r['mfu_datasheet'] is None else f'{r["mfu_datasheet"]:.3f}'
    lines.append(f'| {r["attention"]} | {r["remat"]} | {r["side"]} | {r["batch"]} | '
                 f'{1e3 * r["step_s"]:.1f} | {r["tokens_per_s"]:,.0f} | {r["mfu"]:.3f} | '
                 f'{sheet} | {r["hfu"]:.3f} | {r["loss_max_rel_diff"]:.1e} | '
                 f'{r["first_step_s"]:.1f} | {ratio} |')
  lines += [f'failed: {r["attention"]} attention, remat {r["remat"]}: {r["error"]}'
            for r in rows if r['kind'] == 'failed']
  het = [r for r in compare if r['side'] == 'hetjax']
  if het:
    worst = max(r['ratio'] for r in het)
    best_mfu = max(r['mfu'] for r in het)
    sheets = [r['mfu_datasheet'] for r in het if r['mfu_datasheet'] is not None]
    lines += ['', f'goal: hetjax step <= {GOAL_RATIO}x plain: '
              f'{"met" if worst <= GOAL_RATIO else "not met"} (worst {worst:.3f})',
              f'goal: MFU >= {GOAL_MFU:.0%}: {"met" if best_mfu >= GOAL_MFU else "not met"} '
              f'(best {best_mfu:.1%} of the measured peak {het[0]["peak_flops"]:.3g} FLOP/s '
              f'bfloat16, {het[0]["peak_source"]}'
              + (f'; {max(sheets):.1%} of the datasheet\'s {het[0]["datasheet_peak"]:.3g})'
                 if sheets else ')')]
  for r in rows:
    if r['kind'] == 'breakdown':
      ms = lambda x: f'{1e3 * x:.2f} ms'  # noqa: E731
      rate = r['matmul_flops'] / (r['matmul_s'] + r['attention_kernel_s']) / 1e12
      kernel = (f' + cuDNN attention {ms(r["attention_kernel_s"])}'
                if r['attention'] == 'cudnn' else " (XLA's attention's among them)")
      sheet = ('' if r['mfu_ceiling_datasheet'] is None
               else f', {r["mfu_ceiling_datasheet"]:.1%} of the datasheet\'s')
      lines += ['', f'Where the step\'s time goes (hetjax, {r["attention"]} attention, remat '
                f'{r["remat"]}, batch {r["batch"]}): the step {ms(r["step_s"])} (measured) = its '
                f'{r["runs"]} matmul runs ({r["distinct"]} distinct), timed alone at their '
                f'shapes, {ms(r["matmul_s"])}{kernel}, at {rate:.3g} TFLOP/s, + '
                f'the rest {ms(r["rest_s"])} (norms, activations, the loss\'s softmax, the '
                'update). If only its matmuls ran, the MFU would be '
                f'{r["mfu_ceiling"]:.1%} of the measured peak{sheet}.'
                + (f' Not timed: {"; ".join(r["untimed"])}.' if r['untimed'] else ''), '',
                '| matmul | operands | runs a step | ms each | ms a step | TFLOP/s |',
                '|---|---|---:|---:|---:|---:|']
      for m in r['top']:
        operands = ' × '.join(f'{d}{x}' for d, x in zip(m['dtypes'], m['shapes'], strict=True))
        lines.append(f'| {m["primitive"]} | {operands} | {m["count"]} | '
                     f'{1e3 * m["seconds"]:.3f} | {1e3 * m["seconds"] * m["count"]:.2f} | '
                     f'{m["flops_per_s"] / 1e12:.3g} |')
    if r['kind'] == 'largest_batch':
      gib = (lambda b: 'n/a' if b is None else f'{b / 2**30:.2f} GiB')  # noqa: E731
      failed = r['first_failed']
      lines += ['', f'largest batch that ran (save_dots, ladder {r["ladder"]}): '
                f'{r["largest_batch"]}' + (f'; {failed["batch"]} ran out of memory'
                                           if failed else '; the ladder ended first'),
                f'memory for it: XLA {gib(r["compiled_bytes"])}, planner '
                f'{gib(r["planner_bytes"])} (modelled), device limit '
                f'{gib(r["device_bytes_limit"])}']
  return lines
