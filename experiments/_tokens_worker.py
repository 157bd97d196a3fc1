"""One worker of the Fela token benchmark: BSP, LB-BSP and token scheduling in interleaved blocks.

  python -m experiments._tokens_worker OUT_DIR POLICIES ROUNDS BLOCK TOKEN_ROWS  (under hetjax.launch)

POLICIES is a comma list of ``uniform`` (BSP, `balance.Uniform`), ``lbbsp`` (LB-BSP, default
predictor), ``tokens`` (`TokenRules` with the end game and prefetch), ``tokens-serial`` (the end
game, each pull after its token) and ``tokens-greedy`` (Fela's plain greedy pulling). Every worker
runs as a host of known speed (`hetjax.emulation.KnownSpeedHost`), calibrated once for the job on
token-sized calls and slowed by the launcher's trace, pinned to one core (the benchmark launches
with ``pin_cores``); every share size is compiled before the first step. All train one state through
`hetjax.train.training_steps`: the share policies on one bucketed `WorkerTrainer` (the piece ladder
compiled before the first step), each token policy on a `TokenTrainer` of its own rules (the end
game is the trainer's), on the same meshes and layout, so the state passes from one to the next.
They alternate in blocks (`experiments._bench_launch.interleaved_blocks`): policy p's k-th step
(counting only its own steps) sees slowdown ``trace(k)``, so every policy meets the same slowdown
sequence although their blocks alternate in time; each policy's state carries over from one of its
blocks to the next. The chief writes ``telemetry.jsonl``, ``schedule.json`` (which global steps
belong to which policy) and ``run.json`` (set-up, rows per worker per step, and the measured token
pull round trip).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from experiments._bench_launch import interleaved_blocks
from experiments._lbbsp_worker import BUCKET, GLOBAL_BATCH, MODEL, set_up
from hetjax import runtime

# name: (plays the end game, prefetches the next token while one computes)
TOKEN_POLICIES = {'tokens': (True, True), 'tokens-serial': (True, False),
                  'tokens-greedy': (False, False)}


def main(out_dir: str, policies: list[str], rounds: int, block: int, token_rows: int) -> None:
  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()  # HETJAX_COMPILATION_CACHE: one fresh dir per bench run
  import jax
  import numpy as np

  from hetjax.train import Hook, TokenRules, TokenTrainer

  out = pathlib.Path(out_dir)
  bench = set_up(ctx, out, 'fela', token_rows)  # one host for all, calibrated on token calls
  trainer, channel, fit = bench.trainer, bench.channel, bench.fit
  token_trainers = {
      name: TokenTrainer(trainer.task, trainer.optimizer, GLOBAL_BATCH,
                         TokenRules(GLOBAL_BATCH, token_rows, trainer.local_batch_degree, endgame,
                                    prefetch),
                         channel, rules=trainer.rules, seed=trainer.seed)
      for name, (endgame, prefetch) in TOKEN_POLICIES.items() if name in policies}
  for token_trainer in token_trainers.values():
    # What a token step runs before its first pull, compiled now (as the piece ladder is for
    # the share policies): else a worker still compiling it in its first token step finds the
    # queue drained by one that was done sooner.
    token_trainer.time_gradient(bench.state, token_rows, repeats=1)
    zero = token_trainer.zero_gradient
    jax.block_until_ready(token_trainer.accumulate(zero(), zero()))
  # The workers are pinned, one core each (`hetjax.runtime._affinity`): a share size compiled
  # in the background would share that core with the steps. So every size a share policy can
  # pick (the multiples of the bucket) is compiled now, and LB-BSP meets no compile.
  if set(policies) - set(TOKEN_POLICIES) - {'uniform'}:
    for rows in range(BUCKET, GLOBAL_BATCH + 1, BUCKET):
      trainer.time_gradient(bench.state, rows, repeats=1)
  channel.barrier('tokens-warm')
  programs = {name: token_trainers.get(name, trainer) for name in policies}
  made = {name: token_trainers[name].tokens if name in token_trainers else bench.policy(name)
          for name in policies}
  shares = {name: [] for name in policies}
  pulls = []

  def on_step(name, info) -> None:
    shares[name].append(list(info.stats.rows))
    if name in TOKEN_POLICIES:
      local_timing = info.stats.local
      pulls.append((local_timing.pull_s, local_timing.pulls, local_timing.left > 0))

  try:
    # LB-BSP's new share sizes compile in the background; they finish between blocks
    # (``after_block``), or they would compete for the cores with the next policy's steps.
    _, schedule = interleaved_blocks(
        bench.state, policies, rounds, block, program=programs.__getitem__,
        policy=made.__getitem__, host=lambda name, shift: bench.block_host(shift),
        hooks=[Hook(bench.record)], on_step=on_step,
        after_block=lambda name: trainer.programs.wait())
  finally:
    bench.telemetry.close()
    for program in (trainer, *token_trainers.values()):
      program.close()
  pull_s, count, left = np.sum(pulls, axis=0) if pulls else (0.0, 0, 0)
  channel.set(f'pulls/{ctx.worker}', [float(pull_s), int(count), int(left)])
  if ctx.is_chief:
    per_worker = [channel.get(f'pulls/{w}') for w in range(ctx.workers)]
    total_s, total = (sum(p[i] for p in per_worker) for i in (0, 1))
    info = {'workers': ctx.workers, 'global_batch': GLOBAL_BATCH, 'bucket': BUCKET,
            'token_rows': token_rows, 'host_row_s': bench.host.row_s,
            'host_fixed_s': bench.host.fixed_s,
            'model': 'mlp', **MODEL, 'slowdown': ctx.slowdown, 'grad_bytes': 4 * trainer.fused_size,
            'allreduce': dataclasses.asdict(fit),
            'compiles': trainer.compiles + sum(t.compiles for t in token_trainers.values()),
            'warmup_compile_s': bench.warmup_compile_s,
            'background_compiles': trainer.programs.background_compiles,
            'piece_steps': trainer.programs.piece_steps,
            'pull_s': total_s / total if total else None, 'pulls': total,
            'left_early': [p[2] for p in per_worker],  # token steps it left tokens to others
            'shares': shares}
    (out / 'run.json').write_text(json.dumps(info) + '\n')
    (out / 'schedule.json').write_text(json.dumps(schedule, indent=1) + '\n')
  channel.barrier('pulls-read')  # the chief reads every worker's pulls before anyone leaves


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2].split(','), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
