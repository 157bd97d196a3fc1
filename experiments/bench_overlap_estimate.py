r"""The all-reduce scheduler's estimate of the next parameters: its loss against synchronous
training, per learning rate and estimate scale α, over several seeds.

`hetjax.train.OverlapTrainer` computes step t + 1's gradient at w̃ = opt(wₜ, α · gᵢ · X / xᵢ),
worker i's own gradient standing in for the all-reduced one. This script runs that recurrence on
one device (4 workers of 32 rows, bench_comm's digits mlp, SGD), which
``tests/test_overlap.py`` checks equals the launched program after a flush, against the
synchronous step, for ``--seeds`` data orders. Every figure is a ratio of full-data losses,
each a mean over a 20-step window centred on the step (one step's loss moves by more than the
1% goal), averaged over the seeds with its standard error. Nothing is timed.

Goal (issue 28, item 5): within 1% of synchronous training's loss from step 60 on.

  .venv/bin/python experiments/bench_overlap_estimate.py --quick --json runs/overlap_estimate.json
"""

from __future__ import annotations

import json
import pathlib
import sys

if __package__ in (None, ''):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from hetjax import models

_QUICK = flags.DEFINE_bool('quick', False, '2 seeds, 100 steps, learning rate 0.3 only')
_JSON = flags.DEFINE_string('json', None, 'also write the rows here')
_SEEDS = flags.DEFINE_integer('seeds', 8, 'data orders per setting (full run)', lower_bound=2)

WORKERS, BATCH = 4, 128
MODEL = {'hidden': 64, 'width': 32}
LRS, SCALES, STEPS, AT = (0.1, 0.3), (1.0, 0.75, 0.5), 300, (20, 40, 60, 100, 280)


def _setup():
  task = models.make_task('mlp', **MODEL)
  with nnx.use_eager_sharding(False):
    model = task.make_model(nnx.Rngs(0))
  graphdef, init = nnx.graphdef(model), nnx.to_pure_dict(nnx.state(model))
  rows = {k: jnp.asarray(v) for k, v in task.data.arrays.items()}
  full = jax.jit(lambda p: jnp.mean(task.loss(nnx.merge(graphdef, p), rows)))

  @jax.jit
  def partials(tildes, batches):  # each worker's Σ ∇loss / X over its rows, at its own w̃
    return [jax.grad(lambda q, b=b: jnp.sum(task.loss(nnx.merge(graphdef, q), b)) / BATCH)(w)
            for w, b in zip(tildes, batches, strict=True)]

  return task, init, full, partials


def curve(setup, lr: float, scale: float | None, steps: int, seed: int) -> np.ndarray:
  """Full-data loss after each step: synchronous (``scale`` None) or the scheduler with α."""
  task, w, full, partials = setup
  tildes, losses, x = [w] * WORKERS, [], BATCH // WORKERS
  for t in range(steps):
    host = task.data.global_batch(seed, t, BATCH)
    batches = [{k: jnp.asarray(v[i * x:(i + 1) * x]) for k, v in host.items()}
               for i in range(WORKERS)]
    grads = partials([w] * WORKERS if scale is None else tildes, batches)
    if scale is not None:
      tildes = [jax.tree.map(lambda p, g: p - lr * scale * g * BATCH / x, w, g) for g in grads]
    w = jax.tree.map(lambda p, *g: p - lr * sum(g), w, *grads)
    losses.append(float(full(w)))
  return np.array(losses)


def rows(seeds: int, lrs, steps: int, at) -> list[dict]:
  setup, out = _setup(), []
  for lr in lrs:
    sync = np.array([curve(setup, lr, None, steps, s) for s in range(seeds)])
    for scale in SCALES:
      run = np.array([curve(setup, lr, scale, steps, s) for s in range(seeds)])
      for step in at:
        window = slice(max(0, step - 10), step + 10)
        ratio = run[:, window].mean(axis=1) / sync[:, window].mean(axis=1)
        out.append({'lr': lr, 'scale': scale, 'step': step, 'seeds': seeds,
                    'loss_vs_sync': float(ratio.mean()),
                    'stderr': float(ratio.std(ddof=1) / np.sqrt(seeds)),
                    'within_1pct': bool(ratio.mean() <= 1.01)})
  return out


def table(out: list[dict]) -> str:
  steps = sorted({r['step'] for r in out})
  lines = [f'{"lr":>5} {"alpha":>6} ' + ' '.join(f'{"step " + str(s):>14}' for s in steps)]
  for lr, scale in dict.fromkeys((r['lr'], r['scale']) for r in out):
    cells = {r['step']: r for r in out if (r['lr'], r['scale']) == (lr, scale)}
    lines.append(f'{lr:5g} {scale:6g} ' + ' '.join(
        f'{cells[s]["loss_vs_sync"]:8.3f}±{cells[s]["stderr"]:.3f}' for s in steps))
  return '\n'.join(lines)


def main(argv) -> None:
  del argv
  quick = _QUICK.value
  out = rows(2 if quick else _SEEDS.value, (0.3,) if quick else LRS, 100 if quick else STEPS,
             (20, 60) if quick else AT)
  print(table(out))
  print('loss vs synchronous training, 20-step windows, mean ± standard error over seeds; '
        'goal: <= 1.01 from step 60 on')
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
  app.run(main)
