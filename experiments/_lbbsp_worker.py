"""One worker of `bench_lbbsp.py`: every policy trained in interleaved blocks within one job.

  python experiments/_lbbsp_worker.py OUT_DIR POLICIES ROUNDS BLOCK  (under hetjax.launch)

Every worker runs as a host of known speed (`hetjax.emulation.KnownSpeedHost`), calibrated once
for the job and slowed by the launcher's trace. The policies train in interleaved blocks
(`experiments._bench_launch.interleaved_blocks`): policy p's k-th step (counting only its own
steps) sees slowdown ``trace(k)`` and learns as its k-th step, so every policy meets the same
slowdown sequence although their blocks alternate in time; each policy's state carries over
from one of its blocks to the next. The oracle knows the hosts' calibrated costs as well as the
trace (`experiments._bench_launch.make_policy`). The chief writes ``schedule.json`` (which
global steps belong to which policy) beside ``telemetry.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from experiments._bench_launch import Shifted, interleaved_blocks, make_policy
from hetjax import runtime
from hetjax.emulation import KnownSpeedHost, SlowdownTrace

MODEL = {'hidden': 1024, 'width': 512}
GLOBAL_BATCH = 2048
BUCKET = 128


@dataclasses.dataclass(frozen=True)
class Bench:
  """What every benchmark worker starts from (`set_up`)."""

  trainer: object  # hetjax.train.WorkerTrainer
  trace: SlowdownTrace
  host: KnownSpeedHost
  rules: object  # balance.ShareRules
  channel: runtime.Channel
  fit: object  # runtime.AllReduceFit
  telemetry: runtime.TelemetryGatherer
  state: object
  warmup_compile_s: float

  def block_host(self, shift: int) -> KnownSpeedHost:
    """The calibrated host under the trace seen from a policy's own steps (`Shifted`)."""
    return dataclasses.replace(self.host, trace=Shifted(self.trace, shift))

  def policy(self, name: str):
    """The policy ``name`` for this job; the oracle knows the hosts' costs."""
    return make_policy(name, self.rules, self.trace, self.host.row_s, self.host.fixed_s)

  def record(self, info) -> None:
    """A `hetjax.train.Hook` function: this worker's timing of the step to the telemetry."""
    self.telemetry.record(info.stats.local)


def set_up(ctx, out: pathlib.Path, channel_prefix: str, token_rows: int | None = None) -> Bench:
  """The benchmark MLP's trainer (bucketed), this job's slowdown trace, its calibrated host (on
  token-sized calls with ``token_rows``), share rules, channel, all-reduce fit and telemetry;
  the ladder of piece programs compiled once before the first step, its compile time reported
  on its own."""
  import jax
  import optax

  from hetjax import balance, emulation, models, run
  from hetjax.train import WorkerTrainer

  trainer = WorkerTrainer(models.make_task('mlp', **MODEL), optax.sgd(0.05, momentum=0.9),
                          GLOBAL_BATCH, bucket=BUCKET)
  trace = emulation.parse_trace(ctx.slowdown or 'none', ctx.workers)
  rules = balance.ShareRules(GLOBAL_BATCH, ctx.workers, BUCKET)
  channel = runtime.Channel(f'{channel_prefix}/{out}')
  fit = runtime.fit_allreduce(trainer.mesh, 'proc', trainer.fused_size, 10)
  telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers, out / 'telemetry.jsonl')
  state = trainer.init_state()
  uniform = rules.uniform().values
  jax.block_until_ready(trainer.local_gradient(state, trainer.local_batch(0, uniform)))
  warmup_compile_s = trainer.compile_s
  host = run.emulated_host(ctx, trainer, trace, channel, token_rows=token_rows)
  return Bench(trainer, trace, host, rules, channel, fit, telemetry, state, warmup_compile_s)


def main(out_dir: str, policies: list[str], rounds: int, block: int) -> None:
  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()  # HETJAX_COMPILATION_CACHE: one fresh dir per bench run
  from hetjax.train import Hook

  out = pathlib.Path(out_dir)
  bench = set_up(ctx, out, 'lbbsp')
  trainer, fit = bench.trainer, bench.fit
  made = {name: bench.policy(name) for name in policies}
  shares = {name: [] for name in policies}
  try:
    _, schedule = interleaved_blocks(
        bench.state, policies, rounds, block, program=lambda name: trainer,
        policy=made.__getitem__, host=lambda name, shift: bench.block_host(shift),
        hooks=[Hook(bench.record)],
        on_step=lambda name, info: shares[name].append(list(info.stats.rows)))
  finally:
    bench.telemetry.close()
    trainer.close()
  if ctx.is_chief:
    info = {'workers': ctx.workers, 'global_batch': GLOBAL_BATCH, 'bucket': BUCKET,
            'host_row_s': bench.host.row_s, 'host_fixed_s': bench.host.fixed_s,
            'model': 'mlp', **MODEL, 'slowdown': ctx.slowdown, 'grad_bytes': 4 * trainer.fused_size,
            'allreduce': dataclasses.asdict(fit), 'compiles': trainer.compiles,
            'warmup_compile_s': bench.warmup_compile_s,
            'background_compiles': trainer.programs.background_compiles,
            'background_compile_s': trainer.programs.background_compile_s,
            'piece_steps': trainer.programs.piece_steps, 'shares': shares}
    (out / 'run.json').write_text(json.dumps(info) + '\n')
    (out / 'schedule.json').write_text(json.dumps(schedule, indent=1) + '\n')


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2].split(','), int(sys.argv[3]), int(sys.argv[4]))
