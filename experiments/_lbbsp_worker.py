"""One worker of `bench_lbbsp.py`: every policy trained in interleaved blocks within one job.

  python experiments/_lbbsp_worker.py OUT_DIR POLICIES ROUNDS BLOCK  (under hetjax.launch)

Every worker runs as a host of known speed (`hetjax.emulation.KnownSpeedHost`), calibrated once
for the job and slowed by the launcher's trace. Policy p's k-th step (counting only its own
steps) sees slowdown ``trace(k)`` (`_Shifted`, the trace of the block's host) and learns as its
k-th step (`_Local`), so every policy meets the same slowdown sequence although their blocks
alternate in time. Every step runs through `hetjax.train.training_steps`; each policy's state
carries over from one of its blocks to the next. The chief writes ``schedule.json`` (which
global steps belong to which policy) beside ``telemetry.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np

from hetjax import runtime
from hetjax.core import Policy, StepStats
from hetjax.emulation import KnownSpeedHost, SlowdownTrace

MODEL = {'hidden': 1024, 'width': 512}
GLOBAL_BATCH = 2048
BUCKET = 128


@dataclasses.dataclass(frozen=True)
class _Shifted:
  """A trace seen from a policy's own step count: global step s ↦ policy step s + shift."""

  trace: SlowdownTrace
  shift: int

  @property
  def workers(self) -> int:
    return self.trace.workers

  def factors(self, step: int) -> np.ndarray:
    return self.trace.factors(step + self.shift)

  def factor(self, worker: int, step: int) -> float:
    return self.trace.factor(worker, step + self.shift)

  def delays(self, step: int) -> np.ndarray:
    return self.trace.delays(step + self.shift)

  def delay(self, worker: int, step: int) -> float:
    return self.trace.delay(worker, step + self.shift)

  def describe(self) -> str:
    return self.trace.describe()


@dataclasses.dataclass(frozen=True)
class _Local:
  """``policy`` learning each step as its own step count: global step s is policy step
  s + shift (the oracle plans from the step's index; the others ignore it)."""

  policy: Policy
  shift: int

  @property
  def name(self) -> str:
    return self.policy.name

  def init(self) -> Any:
    return self.policy.init()

  def update(self, state: Any, stats: StepStats | None) -> tuple[Any, Any]:
    if stats is not None:
      stats = dataclasses.replace(stats, step=stats.step + self.shift)
    return self.policy.update(state, stats)


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
    """The calibrated host under the trace seen from a policy's own steps (`_Shifted`)."""
    return dataclasses.replace(self.host, trace=_Shifted(self.trace, shift))

  def record(self, info) -> None:
    """A `hetjax.train.Hook` function: this worker's timing of the step to the telemetry."""
    self.telemetry.record(info.stats.local)


def set_up(ctx, out: pathlib.Path, channel_prefix: str) -> Bench:
  """The benchmark MLP's trainer (bucketed), this job's slowdown trace, its calibrated host,
  share rules, channel, all-reduce fit and telemetry; the ladder of piece programs compiled once
  before the first step, its compile time reported on its own."""
  import jax
  import optax

  import models
  from experiments._bench_launch import known_speed_host
  from hetjax import balance, emulation
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
  host = known_speed_host(ctx, trainer, trace, channel)
  return Bench(trainer, trace, host, rules, channel, fit, telemetry, state, warmup_compile_s)


def main(out_dir: str, policies: list[str], rounds: int, block: int) -> None:
  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()  # HETJAX_COMPILATION_CACHE: one fresh dir per bench run
  from hetjax import balance
  from hetjax.train import Hook, training_steps

  out = pathlib.Path(out_dir)
  bench = set_up(ctx, out, 'lbbsp')
  trainer, fit = bench.trainer, bench.fit
  # Every host has the job's one calibrated cost (x rows take factor × (fixed_s + x × row_s)),
  # so the oracle's equal base speeds are every worker's true ones; its shares ∝ 1 / factor
  # balance the rows' part, not the per-step fixed_s × factor.
  made = {name: balance.make_policy(name, bench.rules, bench.trace) for name in policies}
  policy_states = dict.fromkeys(policies)
  shares = {name: [] for name in policies}
  hooks = [Hook(bench.record)]
  state, schedule, step = bench.state, [], int(bench.state.step)
  try:
    for r in range(rounds):
      for name in policies:
        start, local = step, r * block
        shift = local - start
        trainer.host = bench.block_host(shift)
        for info in training_steps(trainer, state, start + block, hooks,
                                   _Local(made[name], shift), policy_states[name]):
          state, policy_states[name], step = info.state, info.policy_state, info.step
          shares[name].append(list(info.stats.rows))
        schedule.append({'policy': name, 'first_step': start + 1, 'last_step': step,
                         'policy_step': local})
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
