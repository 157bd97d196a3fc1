"""The showcase: 4 local workers, one of them 3x slow, trained with uniform BSP and then LB-BSP.

Both runs are `hetjax-train` (`experiments/train.py`) under `hetjax.launch`: the same MLP on
scikit-learn's digits, the same global batch, seed and straggler; they differ only in how the
batch is split. Every worker runs as a host of known speed: its step is padded by sleep to rows ×
a per-row cost calibrated at start (the slowest worker's measurement, with a margin) × its
slowdown, so four workers sharing two cores behave like four separate hosts whose speeds the
trace sets. The second run emulates the first's hosts (``emulation.hosts=RUN_DIR``): one cluster,
not two calibrations of a busy machine. Each run directory is what any run writes (``run.json``,
``metrics.jsonl``, ``telemetry.jsonl``, ``summary.json``, checkpoints); this prints the two side by
side with the perfectly balanced limit and writes per-worker timelines, throughput and
shares-over-time plots into each.

  .venv/bin/python experiments/demo.py --workdir=runs/demo
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys
import time

import numpy as np
from absl import app, flags

from hetjax import runtime
from hetjax.report import load_telemetry, summarise, write_plots

_WORKDIR = flags.DEFINE_string('workdir', 'runs/demo', 'where the two runs go (replaced)')
_STEPS = flags.DEFINE_integer('steps', 80, 'steps per run')
_SLOWDOWN = flags.DEFINE_string('slowdown', 'static:1,1,1,3', 'the straggler trace')
_POLICY = flags.DEFINE_string('policy', 'lbbsp', 'the balancing policy compared with uniform')

WORKERS = 4
SKIP = 3  # compile steps left out of the means
TRAIN = pathlib.Path(__file__).with_name('train.py')
#: The run: a wider MLP than the shipped config's, so a step is mostly the model's compute.
ARGS = ('--config=mlp', '--mesh=1x1', '--set', 'model.args.hidden=1024', '--set',
        'model.args.width=512', '--set', 'data.global_batch=2048', '--set', 'balance.bucket=128',
        '--set', 'eval.enabled=False', '--set', 'logging.tensorboard=False', '--set',
        'logging.mfu=False')


def _run(policy: str, run_dir: pathlib.Path, hosts: pathlib.Path | None) -> None:
  """One launched run of ``policy`` (on the hosts ``hosts`` recorded, else calibrated); its
  output goes to ``RUN_DIR.log``."""
  command = [sys.executable, str(TRAIN), *ARGS, f'--policy={policy}', f'--steps={_STEPS.value}',
             f'--workdir={run_dir}', '--set', f'checkpoint.every={_STEPS.value}']
  if hosts is not None:
    command += ['--set', f'emulation.hosts={hosts}']
  where = f'the hosts of {hosts}' if hosts else 'hosts calibrated at start'
  print(f'--- {policy}: {WORKERS} workers, slowdown {_SLOWDOWN.value}, {where} '
        f'(log: {run_dir}.log)', flush=True)
  run_dir.parent.mkdir(parents=True, exist_ok=True)
  with open(f'{run_dir}.log', 'w') as log:
    result = runtime.launch_local(command, WORKERS, slowdown=_SLOWDOWN.value, timeout=600,
                                  init_timeout=120, stdout=log)
  if result.returncode:
    print(f'demo: the {policy} run failed: {result.cause} (see {run_dir}.log)', file=sys.stderr)
    sys.exit(1)


def _describe(run_dir: pathlib.Path) -> dict:
  t = load_telemetry(run_dir)
  workers = summarise(t, SKIP)
  summary = json.loads((run_dir / 'summary.json').read_text())
  write_plots(t, SKIP)
  # Compiling a new share size is a one-off (and cached on disk for the next run): reported on
  # its own line, not averaged into the iteration time.
  iteration = (t.step_s - t.compile_s).max(axis=1)[SKIP:]
  # The hosts' speeds, rows per busy second, and the perfectly balanced compute X / Σ vᵢ: no
  # split of the batch can make the slowest worker finish its rows sooner.
  speeds = t.share[SKIP:] / (t.compute_s + t.dilation_s)[SKIP:]
  balanced = t.batch()[SKIP:] / speeds.sum(axis=1)
  compile_s = float(t.compile_s.max(axis=1)[1:].sum())
  return {'iteration_ms': 1e3 * float(iteration.mean()),
          'balanced_ms': 1e3 * float(np.median(balanced)),
          'overruns': int((t.overrun_s[SKIP:] > 0).sum()), 'worker_steps': t.overrun_s[SKIP:].size,
          'samples_per_s': float(t.batch()[SKIP:].sum() / iteration.sum()),
          'compile_s': compile_s, 'idle': [w.idle_fraction for w in workers],
          'shares': t.share[-1].tolist(), 'loss': summary['final_loss']}


def main(argv: list[str]) -> None:
  del argv
  workdir = pathlib.Path(_WORKDIR.value)
  if workdir.exists():
    shutil.rmtree(workdir)
  start = time.perf_counter()
  _run('uniform', workdir / 'uniform', None)
  _run(_POLICY.value, workdir / _POLICY.value, workdir / 'uniform')
  results = {p: _describe(workdir / p) for p in ('uniform', _POLICY.value)}
  uniform, balanced = results['uniform'], results[_POLICY.value]
  rows = [('iteration ms (mean, steps 4+)', 'iteration_ms', '{:.1f}'),
          ('balanced compute ms (X / sum of speeds)', 'balanced_ms', '{:.1f}'),
          ('steps that overran their host', 'overruns', '{}'),
          ('samples/s', 'samples_per_s', '{:,.0f}'),
          ('compiling new share sizes (s)', 'compile_s', '{:.1f}'),
          ('final loss (same SGD)', 'loss', '{:.4f}')]
  width = 42
  print(f'\n{"":<{width}}{"uniform BSP":>16}{_POLICY.value:>16}')
  for label, key, fmt in rows:
    print(f'{label:<{width}}{fmt.format(uniform[key]):>16}{fmt.format(balanced[key]):>16}')
  for name, key, fmt in (('idle fraction', 'idle', '{:.2f}'), ('shares at the end', 'shares', '{}')):
    for w in range(WORKERS):
      label = f'{name}, worker {w}' + (' (slow)' if w == WORKERS - 1 else '')
      print(f'{label:<{width}}{fmt.format(uniform[key][w]):>16}{fmt.format(balanced[key][w]):>16}')
  speedup = uniform['iteration_ms'] / balanced['iteration_ms']
  print(f'\n{_POLICY.value} is {speedup:.2f}x faster per iteration than uniform BSP '
        f'(max idle {max(uniform["idle"]):.2f} → {max(balanced["idle"]):.2f}); '
        f'losses differ by {abs(uniform["loss"] - balanced["loss"]):.1e}.')
  print(f'plots: {", ".join(str(workdir / p / f) for p in results for f in ("timeline.png", "shares.png"))}')
  print(f'demo took {time.perf_counter() - start:.0f} s; all times measured on this machine.')


if __name__ == '__main__':
  app.run(main)
