"""One worker of the Fela token benchmark: BSP, LB-BSP and token scheduling in interleaved blocks.

  python experiments/_tokens_worker.py OUT_DIR POLICIES ROUNDS BLOCK TOKEN_ROWS  (under hetjax.launch)

POLICIES is a comma list of ``uniform`` (BSP, `UniformShares`), ``lbbsp`` (LB-BSP, default
predictor), ``tokens`` (`token_steps` with the end game) and ``tokens-greedy`` (Fela's plain
greedy pulling). All train one state with one trainer, so they share
the compiled programs (the token size is a bucket multiple, hence one of the piece programs).
Policy p's k-th step (counting only its own steps) sees slowdown ``trace(k)``, so every policy
meets the same slowdown sequence although their blocks alternate in time. The chief writes
``telemetry.jsonl``, ``schedule.json`` (which global steps belong to which policy) and
``run.json`` (set-up, rows per worker per step, and the measured token pull round trip).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from experiments._lbbsp_worker import (
    BUCKET,
    DILATION_BASE,
    GLOBAL_BATCH,
    MODEL,
    _Local,
    _Shifted,
    set_up,
)
from hetjax import runtime


def main(out_dir: str, policies: list[str], rounds: int, block: int, token_rows: int) -> None:
  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()  # HETJAX_COMPILATION_CACHE: one fresh dir per bench run
  import numpy as np

  from hetjax import balance
  from hetjax.train import worker_steps
  from hetjax.train._tokens import TokenRules, token_steps

  out = pathlib.Path(out_dir)
  bench = set_up(ctx, out, 'fela')
  trainer, trace, channel, fit, telemetry = (bench.trainer, bench.trace, bench.channel,
                                             bench.fit, bench.telemetry)
  token_rules = {name: TokenRules(GLOBAL_BATCH, token_rows, trainer.local_batch_degree,
                                 endgame=name == 'tokens')
                 for name in ('tokens', 'tokens-greedy')}
  made = {'uniform': runtime.UniformShares(GLOBAL_BATCH, ctx.workers),
          'lbbsp': balance.make_policy('lbbsp', bench.rules, trace)}
  histories = {name: [] for name in policies}
  # The ladder of piece programs (the token size among them) was compiled in set_up.
  state, schedule, pulls = bench.state, [], []
  warmup_compile_s = bench.warmup_compile_s
  try:
    for r in range(rounds):
      for name in policies:
        start, local = int(state.step), r * block
        shift = local - start
        dilation = runtime.TimeDilation(_Shifted(trace, shift), ctx.worker, DILATION_BASE)
        if name in token_rules:
          steps = token_steps(trainer, state, start + block, token_rules[name], channel, dilation,
                              telemetry, history=histories[name])
        else:
          steps = worker_steps(trainer, state, start + block, _Local(made[name], shift),
                               dilation, telemetry, history=histories[name])
        for info in steps:
          state = info.state
          if name in token_rules:
            pulls.append((info.stats.pull_s, info.stats.pulls, info.stats.left > 0))
        # LB-BSP's new share sizes compile in the background; let them finish between blocks,
        # or they would compete for the cores with the next policy's steps.
        trainer.programs.wait()
        schedule.append({'policy': name, 'first_step': start + 1, 'last_step': start + block,
                         'policy_step': local})
  finally:
    telemetry.close()
    trainer.close()
  pull_s, count, left = np.sum(pulls, axis=0) if pulls else (0.0, 0, 0)
  channel.set(f'pulls/{ctx.worker}', [float(pull_s), int(count), int(left)])
  if ctx.is_chief:
    per_worker = [channel.get(f'pulls/{w}') for w in range(ctx.workers)]
    total_s, total = (sum(p[i] for p in per_worker) for i in (0, 1))
    info = {'workers': ctx.workers, 'global_batch': GLOBAL_BATCH, 'bucket': BUCKET,
            'token_rows': token_rows, 'dilation_base': DILATION_BASE,
            'model': 'mlp', **MODEL, 'slowdown': ctx.slowdown, 'grad_bytes': 4 * trainer.fused_size,
            'allreduce': dataclasses.asdict(fit), 'compiles': trainer.compiles,
            'warmup_compile_s': warmup_compile_s,
            'background_compiles': trainer.programs.background_compiles,
            'piece_steps': trainer.programs.piece_steps,
            'pull_s': total_s / total if total else None, 'pulls': total,
            'left_early': [p[2] for p in per_worker],  # token steps it left tokens to others
            'shares': {n: [list(h.shares) for h in histories[n]] for n in policies}}
    (out / 'run.json').write_text(json.dumps(info) + '\n')
    (out / 'schedule.json').write_text(json.dumps(schedule, indent=1) + '\n')
  channel.barrier('pulls-read')  # the chief reads every worker's pulls before anyone leaves


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2].split(','), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
