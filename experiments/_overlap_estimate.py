"""The all-reduce scheduler's estimate on one device: the recurrence and its ratios to
synchronous training (`experiments/bench_overlap_estimate.py` prints them; no flags here, so
tests can import it)."""

from __future__ import annotations

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hetjax import models
from hetjax.bench import QUANT_BLOCK, quantize_int8

WORKERS, BATCH = 4, 128
MODEL = {'hidden': 64, 'width': 32}
LRS, SCALES, STEPS, AT = (0.1, 0.3), (1.0, 0.75, 0.5), 300, (20, 40, 60, 100, 280)
#: The floor row: synchronous training with η × (1 + FLOOR) against itself. At η = 0.3 a
#: change this small moves single seeds' windows by several percent: the ratios' noise floor.
FLOOR = 1e-4


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


def _int8_sum(grads: list) -> dict:
  """Σᵢ of the workers' gradient trees, each in 8 bits as the scheduler sends them
  (`hetjax.bench.quantize_int8` over blocks of its leaves in leaf order)."""
  flats = [jax.flatten_util.ravel_pytree(g) for g in grads]
  size, unravel = flats[0][0].size, flats[0][1]
  total = 0.0
  for flat, _ in flats:
    q, scale = quantize_int8(jnp.pad(flat, (0, -size % QUANT_BLOCK)).reshape(-1, QUANT_BLOCK))
    total = total + q.astype(jnp.float32) * scale
  return unravel(total.reshape(-1)[:size])


def curve(setup, lr: float, scale: float | None, steps: int, seed: int,
          estimate: str = 'own') -> np.ndarray:
  """Full-data loss after each step: synchronous (``scale`` None) or the scheduler with α and
  its ``estimate`` (``own``: each worker's gradient; ``int8``: every worker's, in 8 bits)."""
  task, w, full, partials = setup
  tildes, losses, x = [w] * WORKERS, [], BATCH // WORKERS
  for t in range(steps):
    host = task.data.global_batch(seed, t, BATCH)
    batches = [{k: jnp.asarray(v[i * x:(i + 1) * x]) for k, v in host.items()}
               for i in range(WORKERS)]
    grads = partials([w] * WORKERS if scale is None else tildes, batches)
    if scale is not None and estimate == 'int8':
      coarse = _int8_sum(grads)
      tildes = [jax.tree.map(lambda p, g: p - lr * scale * g, w, coarse)] * WORKERS
    elif scale is not None:
      tildes = [jax.tree.map(lambda p, g: p - lr * scale * g * BATCH / x, w, g) for g in grads]
    w = jax.tree.map(lambda p, *g: p - lr * sum(g), w, *grads)
    losses.append(float(full(w)))
  return np.array(losses)


def rows(seeds: int, lrs, steps: int, at) -> list[dict]:
  setup, out = _setup(), []
  for lr in lrs:
    sync = np.array([curve(setup, lr, None, steps, s) for s in range(seeds)])
    for estimate, scale in [('own', a) for a in SCALES] + [('int8', 1.0), ('floor', 0.0)]:
      if estimate == 'floor':   # synchronous training itself at η (1 + 1e-4): the noise floor
        run = np.array([curve(setup, lr * (1 + FLOOR), None, steps, s) for s in range(seeds)])
      else:
        run = np.array([curve(setup, lr, scale, steps, s, estimate) for s in range(seeds)])
      for step in at:
        window = slice(max(0, step - 10), step + 10)
        ratio = run[:, window].mean(axis=1) / sync[:, window].mean(axis=1)
        out.append({'lr': lr, 'estimate': estimate, 'scale': scale, 'step': step,
                    'seeds': seeds,
                    'loss_vs_sync': float(ratio.mean()),
                    'stderr': float(ratio.std(ddof=1) / np.sqrt(seeds)),
                    'within_1pct': bool(ratio.mean() <= 1.01)})
  return out


def table(out: list[dict]) -> str:
  steps = sorted({r['step'] for r in out})
  lines = [f'{"lr":>5} {"estimate":>8} {"alpha":>6} '
           + ' '.join(f'{"step " + str(s):>14}' for s in steps)]
  for lr, estimate, scale in dict.fromkeys((r['lr'], r['estimate'], r['scale']) for r in out):
    cells = {r['step']: r for r in out if (r['lr'], r['estimate'], r['scale']) ==
             (lr, estimate, scale)}
    lines.append(f'{lr:5g} {estimate:>8} {scale:6g} ' + ' '.join(
        f'{cells[s]["loss_vs_sync"]:8.3f}±{cells[s]["stderr"]:.3f}' for s in steps))
  return '\n'.join(lines)
