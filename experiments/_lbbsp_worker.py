"""One worker of `bench_lbbsp.py`: every policy trained in interleaved blocks within one job.

  python experiments/_lbbsp_worker.py OUT_DIR POLICIES ROUNDS BLOCK  (under hetjax.launch)

Policy p's k-th step (counting only its own steps) sees slowdown ``trace(k)``, so every policy
meets the same slowdown sequence although their blocks alternate in time. The chief writes
``schedule.json`` (which global steps belong to which policy) beside ``telemetry.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hetjax import runtime

MODEL = {'hidden': 1024, 'width': 512}
GLOBAL_BATCH = 2048
BUCKET = 128
# Every worker is dilated 4x on top of the scenario, so four workers on two cores spend most of
# a step asleep and stop contending for the cores (see TimeDilation.factor).
DILATION_BASE = 4.0


@dataclasses.dataclass(frozen=True)
class _Shifted:
  """A trace seen from a policy's own step count: global step s ↦ policy step s + shift."""

  trace: runtime.SlowdownTrace
  shift: int

  @property
  def workers(self) -> int:
    return self.trace.workers

  def factors(self, step: int):
    return self.trace.factors(step + self.shift)

  def factor(self, worker: int, step: int) -> float:
    return self.trace.factor(worker, step + self.shift)

  def describe(self) -> str:
    return self.trace.describe()


@dataclasses.dataclass
class _Local:
  """A policy asked with its own step count."""

  policy: object
  shift: int

  def shares(self, step, history):
    return self.policy.shares(step + self.shift, history)


@dataclasses.dataclass(frozen=True)
class Bench:
  """What every benchmark worker starts from (`set_up`)."""

  trainer: object
  trace: runtime.SlowdownTrace
  rules: object  # balance.ShareRules
  channel: runtime.Channel
  fit: object  # runtime.AllReduceFit
  telemetry: runtime.TelemetryGatherer
  state: object
  warmup_compile_s: float


def set_up(ctx, out: pathlib.Path, channel_prefix: str) -> Bench:
  """The benchmark MLP's trainer (bucketed), this job's slowdown trace, share rules, channel,
  all-reduce fit and telemetry; the ladder of piece programs compiled once before the first
  step, its compile time reported on its own."""
  import jax
  import optax

  import models
  from hetjax import balance
  from hetjax.train import WorkerTrainer

  trainer = WorkerTrainer(models.make_task('mlp', **MODEL), optax.sgd(0.05, momentum=0.9),
                          GLOBAL_BATCH, bucket=BUCKET)
  trace = runtime.parse_slowdown(ctx.slowdown or 'none', ctx.workers)
  rules = balance.ShareRules(GLOBAL_BATCH, ctx.workers, BUCKET)
  channel = runtime.Channel(f'{channel_prefix}/{out}')
  fit = runtime.fit_allreduce(trainer.mesh, 'proc', trainer.fused_size, 10)
  telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers, out / 'telemetry.jsonl')
  state = trainer.init_state()
  uniform = balance.make_policy('uniform', rules).shares(0, []).values
  jax.block_until_ready(trainer.local_gradient(state, trainer.local_batch(0, uniform)))
  return Bench(trainer, trace, rules, channel, fit, telemetry, state, trainer.compile_s)


def main(out_dir: str, policies: list[str], rounds: int, block: int) -> None:
  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()  # HETJAX_COMPILATION_CACHE: one fresh dir per bench run
  from hetjax import balance
  from hetjax.train import worker_steps

  out = pathlib.Path(out_dir)
  bench = set_up(ctx, out, 'lbbsp')
  trainer, trace, fit, telemetry = bench.trainer, bench.trace, bench.fit, bench.telemetry
  made = {name: balance.make_policy(name, bench.rules, trace) for name in policies}
  histories = {name: [] for name in policies}
  state, schedule, warmup_compile_s = bench.state, [], bench.warmup_compile_s
  try:
    for r in range(rounds):
      for name in policies:
        start, local = int(state.step), r * block
        shift = local - start
        dilation = runtime.TimeDilation(_Shifted(trace, shift), ctx.worker, DILATION_BASE)
        for info in worker_steps(trainer, state, start + block, _Local(made[name], shift),
                                 dilation, telemetry, history=histories[name]):
          state = info.state
        schedule.append({'policy': name, 'first_step': start + 1, 'last_step': start + block,
                         'policy_step': local})
  finally:
    telemetry.close()
    trainer.close()
  if ctx.is_chief:
    info = {'workers': ctx.workers, 'global_batch': GLOBAL_BATCH, 'bucket': BUCKET,
            'dilation_base': DILATION_BASE,
            'model': 'mlp', **MODEL, 'slowdown': ctx.slowdown, 'grad_bytes': 4 * trainer.fused_size,
            'allreduce': dataclasses.asdict(fit), 'compiles': trainer.compiles,
            'warmup_compile_s': warmup_compile_s,
            'background_compiles': trainer.programs.background_compiles,
            'background_compile_s': trainer.programs.background_compile_s,
            'piece_steps': trainer.programs.piece_steps,
            'shares': {n: [list(h.shares) for h in histories[n]] for n in policies}}
    (out / 'run.json').write_text(json.dumps(info) + '\n')
    (out / 'schedule.json').write_text(json.dumps(schedule, indent=1) + '\n')


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2].split(','), int(sys.argv[3]), int(sys.argv[4]))
