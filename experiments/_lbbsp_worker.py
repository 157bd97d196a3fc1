"""One worker of `bench_lbbsp.py`: every policy trained in interleaved blocks within one job.

  python -m experiments._lbbsp_worker OUT_DIR POLICIES ROUNDS BLOCK [EXCHANGE]  (under launch)

Every worker runs as a host of known speed (`hetjax.emulation.KnownSpeedHost`), calibrated once
for the job and slowed by the launcher's trace. The policies train in interleaved blocks
(`experiments._bench_launch.interleaved_blocks`): policy p's k-th step (counting only its own
steps) sees slowdown ``trace(k)`` and learns as its k-th step, so every policy meets the same
slowdown sequence although their blocks alternate in time; each policy's state carries over
from one of its blocks to the next. The oracle knows the hosts' calibrated costs as well as the
trace (`hetjax.balance.KnownCosts`). The chief writes ``schedule.json`` (which
global steps belong to which policy) beside ``telemetry.jsonl``.

With EXCHANGE (ratios r₀,r₁,…, one a worker) the workers exchange the gradient through a server
on emulated links (`hetjax.emulation.Exchange`): worker i's push and pull take rᵢ × a uniform
share's host time (`exchange_links`), padded by sleep before the combine. ``lbbsp-links`` is
LB-BSP (EWMA) balancing compute plus those declared transfers, ``lbbsp-ewma`` the same policy
on compute only; the oracle knows the transfers too. ``run.json`` records the links and each
worker's transfer (``network``, ``transfer_s``).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from experiments._bench_launch import Shifted, interleaved_blocks
from hetjax import balance, runtime
from hetjax.emulation import Exchange, KnownSpeedHost, LinkedHost, Links, SlowdownTrace

MODEL = {'hidden': 1024, 'width': 512}
GLOBAL_BATCH = 2048
BUCKET = 128
LINKS_POLICY = 'lbbsp-links'  # LB-BSP (EWMA) with the transfers in its objective
LINK_ALPHA_S = 5e-4  # each message's latency on the exchange's links


@dataclasses.dataclass(frozen=True)
class Bench:
  """What every benchmark worker starts from (`set_up`)."""

  trainer: object  # hetjax.train.WorkerTrainer
  trace: SlowdownTrace
  host: KnownSpeedHost
  rules: object  # core.ShareRules
  channel: runtime.Channel
  fit: object  # runtime.AllReduceFit
  telemetry: runtime.TelemetryGatherer
  state: object
  warmup_compile_s: float

  def block_host(self, shift: int, links: Links | None = None) -> KnownSpeedHost | LinkedHost:
    """The calibrated host under the trace seen from a policy's own steps (`Shifted`), on
    ``links`` if given."""
    host = dataclasses.replace(self.host, trace=Shifted(self.trace, shift))
    return host if links is None else LinkedHost(links, host.worker, host)

  def policy(self, name: str, transfer_s: tuple[float, ...] = ()):
    """The policy ``name`` for this job; the oracle knows the hosts' costs, and it and
    ``lbbsp-links`` each worker's transfer ``transfer_s`` (`hetjax.balance.KnownCosts`)."""
    base = 'lbbsp-ewma' if name == LINKS_POLICY else name
    transfer = transfer_s if name in (LINKS_POLICY, 'oracle') else ()
    known = (balance.KnownCosts(self.host.row_s, self.host.fixed_s, transfer_s=transfer)
             if name == 'oracle' else balance.KnownCosts(transfer_s=transfer))
    return balance.make_policy(base, self.rules, self.trace, known)

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

  from hetjax import core, emulation, models, run
  from hetjax.train import WorkerTrainer

  trainer = WorkerTrainer(models.make_task('mlp', **MODEL), optax.sgd(0.05, momentum=0.9),
                          GLOBAL_BATCH, bucket=BUCKET)
  trace = emulation.parse_trace(ctx.slowdown or 'none', ctx.workers)
  rules = core.ShareRules(GLOBAL_BATCH, ctx.workers, BUCKET)
  channel = runtime.Channel(f'{channel_prefix}/{out}')
  fit = runtime.fit_allreduce(trainer.mesh, 'proc', trainer.fused_size, 10)
  telemetry = runtime.TelemetryGatherer(channel, ctx.worker, ctx.workers, out / 'telemetry.jsonl')
  state = trainer.init_state()
  uniform = rules.uniform().values
  jax.block_until_ready(trainer.local_gradient(state, trainer.local_batch(0, uniform)))
  warmup_compile_s = trainer.compile_s
  host = run.emulated_host(ctx, trainer, trace, channel, token_rows=token_rows)
  return Bench(trainer, trace, host, rules, channel, fit, telemetry, state, warmup_compile_s)


def exchange_links(host: KnownSpeedHost, workers: int, nbytes: int, ratios) -> Links:
  """Links of the server exchange on which worker i's push and pull of ``nbytes`` take
  ``ratios[i]`` × the host time of a uniform share at factor 1 (`LINK_ALPHA_S` a message)."""
  from hetjax.core import LinkCost

  uniform_s = host.fixed_s + GLOBAL_BATCH / workers * host.row_s
  links = [LinkCost.for_time(r * uniform_s, 2, 2 * nbytes, LINK_ALPHA_S) for r in ratios]
  return Links(tuple(k.alpha_s for k in links), tuple(k.beta_bytes_per_s for k in links),
               Exchange.SERVER)


def main(out_dir: str, policies: list[str], rounds: int, block: int,
         exchange: tuple[float, ...] = ()) -> None:
  ctx = runtime.initialize(init_timeout_s=120)
  runtime.enable_compilation_cache()  # HETJAX_COMPILATION_CACHE: one fresh dir per bench run
  from hetjax.train import Hook

  out = pathlib.Path(out_dir)
  bench = set_up(ctx, out, 'lbbsp')
  trainer, fit = bench.trainer, bench.fit
  links, transfer = None, ()
  if exchange:
    links = exchange_links(bench.host, ctx.workers, trainer.all_reduce_bytes, exchange)
    transfer = links.exchange_s(trainer.all_reduce_bytes)
  made = {name: bench.policy(name, transfer) for name in policies}
  shares = {name: [] for name in policies}
  try:
    _, schedule = interleaved_blocks(
        bench.state, policies, rounds, block, program=lambda name: trainer,
        policy=made.__getitem__, host=lambda name, shift: bench.block_host(shift, links),
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
            'piece_steps': trainer.programs.piece_steps, 'shares': shares,
            'network': links.describe() if exchange else None,
            'transfer_s': list(transfer)}
    (out / 'run.json').write_text(json.dumps(info) + '\n')
    (out / 'schedule.json').write_text(json.dumps(schedule, indent=1) + '\n')


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2].split(','), int(sys.argv[3]), int(sys.argv[4]),
       tuple(float(r) for r in sys.argv[5].split(',')) if len(sys.argv) > 5 else ())
