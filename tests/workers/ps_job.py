"""A launched parameter-server job for the tests: ``ps_job.py OUT SPEC STEPS [DIE]``.

Workers train the small mlp for STEPS steps with SGD under ``hetjax.ps.parse_ps(SPEC)``;
worker 0 writes its final parameters (``OUT/params.npz``) and the server its report
(``OUT/server-S.json``). ``DIE=server``: server 0 exits with status 3 after its second update,
to check that the launcher names it and every worker ends. ``DIE=checkpoint``: the servers
checkpoint every 2 versions into OUT/ckpt.
"""

from __future__ import annotations

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import jax
import numpy as np
import optax

from hetjax import models, ps, runtime, train

GLOBAL_BATCH, LR = 32, 0.1


def main() -> None:
  out, spec, steps = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
  die = sys.argv[4] if len(sys.argv) > 4 else ''
  runtime.initialize(init_timeout_s=60)
  role, channel = ps.ps_role(), runtime.Channel('ps-test')
  task, config = models.make_task('mlp', hidden=16, width=8), ps.parse_ps(spec)
  if role.is_server:
    if die == 'server':
      apply = ps.ParameterServer._apply

      def dying(server, *args):
        apply(server, *args)
        if server.version == 2:
          print('server dies', flush=True)
          os._exit(3)
      ps.ParameterServer._apply = dying
    ps.serve(task, optax.sgd(LR), config, role, channel,
             report_path=out / f'server-{role.index}.json',
             checkpoint_dir=out / 'ckpt' if die == 'checkpoint' else None,
             checkpoint_every=2, idle_timeout_s=60)
    print(f'server {role.index} done', flush=True)
    return
  worker = ps.make_worker(task, GLOBAL_BATCH, config, role, channel, timeout_s=60)
  state = worker.init_state()
  for info in train.training_steps(worker, state, steps):
    state = info.state
  state = worker.finish(state)
  if role.index == 0:
    leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    np.savez(out / 'params.npz', *leaves)


if __name__ == '__main__':
  main()
