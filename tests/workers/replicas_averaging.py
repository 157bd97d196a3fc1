"""A worker of tests/test_replicas_averaging.py: group averaging of per-process parameter trees.

  python tests/workers/replicas_averaging.py OUT_DIR

Every worker builds its own tree (`initial`, different per worker) on all its local devices,
then walks `OPS` in order: in each op it averages with its group if it is in one and skips the
op otherwise. It writes ``OUT_DIR/w{worker}.npz``: its tree before the ops (``0/<path>``) and
after op ``k`` (``{k + 1}/<path>``), in float32; `GroupAverager.compiles` after each op
(``compiles``); whether every result leaf kept its dtype and is replicated on exactly the local
devices (``placed``); and the `ConfigError` of averaging in a group without this process
(``outsider``).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

WORKERS = 4
#: Groups per op, disjoint; every worker walks the ops in this order.
OPS = (((0, 1), (2, 3)), ((0, 1, 2, 3),), ((1, 2),), ((3,),), ((0, 1),))


def initial(worker: int) -> dict:
  """Worker ``worker``'s parameters: float32 leaves of three shapes (one a scalar) and one
  bfloat16 leaf, values in ``[worker + 0.5, worker + 2)``."""
  import ml_dtypes

  rng = np.random.default_rng(worker)

  def draw(*shape):
    return (worker + rng.uniform(0.5, 2.0, shape)).astype(np.float32)

  return {'dense': {'w': draw(3, 4), 'b': draw(5)}, 'scale': draw(),
          'half': draw(2, 3).astype(ml_dtypes.bfloat16)}


def group_of(worker: int, op: tuple) -> tuple[int, ...] | None:
  """The group of ``op`` that ``worker`` belongs to, or None."""
  return next((g for g in op if worker in g), None)


def flat(tree: dict, prefix: str) -> dict:
  """``{prefix/a/b: float32 array}`` for a nested dict of arrays."""
  from flax import traverse_util

  return {'/'.join([prefix, *k]): np.asarray(v, dtype=np.float32)
          for k, v in traverse_util.flatten_dict(tree).items()}


def main(out_dir: str) -> None:
  from hetjax import runtime

  ctx = runtime.initialize(init_timeout_s=60)

  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  from hetjax import ConfigError
  from hetjax.replicas._averaging import GroupAverager

  assert ctx.workers == WORKERS, ctx
  host = initial(ctx.worker)
  averager = GroupAverager(jax.local_devices(), host)
  replicated = NamedSharding(averager.local_mesh, PartitionSpec())
  tree = jax.device_put(host, replicated)
  out: dict[str, np.ndarray] = flat(jax.device_get(tree), '0')
  try:
    averager.average(tree, [p for p in range(WORKERS) if p != ctx.worker][:2])
  except ConfigError as e:
    out['outsider'] = np.asarray(str(e))

  compiles, placed = [], True
  for k, op in enumerate(OPS):
    group = group_of(ctx.worker, op)
    if group is not None:
      tree = averager.average(tree, group)
      for leaf, before in zip(jax.tree.leaves(tree), jax.tree.leaves(host), strict=True):
        placed &= (leaf.dtype == before.dtype and leaf.sharding.is_fully_replicated
                   and leaf.sharding.device_set == set(jax.local_devices()))
    compiles.append(averager.compiles)
    out |= flat(jax.device_get(tree), str(k + 1))
  out['compiles'] = np.asarray(compiles)
  out['placed'] = np.asarray(placed)
  np.savez(pathlib.Path(out_dir) / f'w{ctx.worker}.npz', **out)


if __name__ == '__main__':
  main(sys.argv[1])
