"""`StageCheckpointer` over two processes, one stage each: the saved arrays of worker 1's stage
are changed (the file decodes, a value differs), and both workers skip that checkpoint for the
one before it — the one that noticed naming the leaf, the other naming the process."""

import io
import re
import sys
import textwrap

import pytest

from hetjax.runtime import launch_local

WORKER = '''
import pathlib, sys
import numpy as np
from hetjax import runtime
ctx = runtime.initialize(init_timeout_s=30)
import jax, optax
from hetjax import models
from hetjax.pipeline import PipelineTrainer, StageCheckpointer

directory = pathlib.Path(sys.argv[1])
trainer = PipelineTrainer(models.make_task('mlp', hidden=16, width=8), optax.sgd(0.1), 8,
                          stages=2, micro_batches=2)
[mine] = trainer.local_stages
ckpt = StageCheckpointer(directory, trainer)
state, saved = trainer.init_state(), {}
for step in range(2):
  state, _ = trainer.train_step(state, trainer.global_batch_at(step))
  saved[state.step] = jax.tree.map(np.asarray, state.params[mine])
  ckpt.save(state, {'run': 1})
if ctx.worker == 1:  # the first array of its stage's file, one value changed
  path = directory / '2' / 'state' / f'stage-{mine}.npz'
  with np.load(path) as data:
    arrays = [data[f'arr_{i}'] for i in range(len(data.files))]
  arrays[0] = arrays[0] + np.eye(1, arrays[0].size, dtype=arrays[0].dtype).reshape(arrays[0].shape)
  np.savez(path, *arrays)
runtime.Channel('test').barrier('changed')
restored, meta = ckpt.restore(trainer.abstract_state())
good = all(jax.tree.leaves(jax.tree.map(np.array_equal, restored.params[mine], saved[1])))
print(f'restored step {restored.step}, meta step {meta["step"]}, stage {mine} values '
      f'{"equal" if good else "DIFFER"}', flush=True)
ckpt.close()
'''


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_both_processes_skip_a_checkpoint_whose_stage_fails_in_one(tmp_path):
  out = io.StringIO()
  directory = tmp_path / 'ckpt'
  result = launch_local([sys.executable, '-c', textwrap.dedent(WORKER), str(directory)], 2,
                        timeout=120, init_timeout=30, stdout=out)
  lines = out.getvalue().splitlines()
  assert result.returncode == 0, '\n'.join(lines[-30:])
  for worker in (0, 1):
    mine = [m[1] for m in (re.fullmatch(rf'\[w{worker}\] (.*)', line) for line in lines) if m]
    assert [line for line in mine if line.startswith('warning:')] == [
        f'warning: checkpoint step 2 in {directory} failed verification (leaf '
        f"'params/1/down/bias' checksum differs){'' if worker == 1 else ' in process 1'}; "
        'using step 1']
    assert f'restored step 1, meta step 1, stage {worker} values equal' in mine, mine
