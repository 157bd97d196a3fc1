"""`StageCheckpointer` in one process (every stage local): the checkpoint is an orbax step
directory with one file per stage and one record, a restore verifies every stage's checksums,
and a latest checkpoint whose saved arrays decode but differ is skipped with one warning.

Across processes (stages on different workers) it is exercised by tests/test_plan_launch.py.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from hetjax import ConfigError, models
from hetjax.checkpoint import CheckpointerProtocol
from hetjax.pipeline import PipelineTrainer, StageCheckpointer
from hetjax.train import training_steps
from tests.conftest import require_devices
from tests.test_checkpoint_replica import change_one_value


@pytest.fixture(scope='module')
def trainer():
  return PipelineTrainer(models.make_task('mlp', hidden=16, width=8), optax.adam(0.01), 8,
                         stages=2, micro_batches=2, devices=require_devices(2))


def _trained(trainer, steps):
  state, states = trainer.init_state(), {}
  for step in range(steps):
    state, _ = trainer.train_step(state, trainer.global_batch_at(step))
    states[state.step] = jax.tree.map(lambda x: x.copy(), state)  # the next step donates it
  return states


@pytest.fixture(scope='module')
def states(trainer):
  return _trained(trainer, 2)


def _equal(a, b):
  assert a.step == b.step
  jax.tree.map(np.testing.assert_array_equal, (a.params, a.opt_state), (b.params, b.opt_state))


def test_stages_save_one_file_each_and_restore_exactly(trainer, states, tmp_path):
  ckpt = StageCheckpointer(tmp_path / 'ckpt', trainer)
  assert isinstance(ckpt, CheckpointerProtocol)
  for step in (1, 2):
    ckpt.save(states[step], {'run': 1})
  assert ckpt.all_steps() == [1, 2] and ckpt.latest_step() == 2
  assert sorted(p.name for p in (tmp_path / 'ckpt' / '2' / 'state').glob('*.npz')) == [
      'stage-0.npz', 'stage-1.npz']
  meta = ckpt.read_meta()
  assert meta['step'] == 2 and meta['run'] == 1 and meta['stages'] == [[0, 1], [1, 3]]
  assert {path.split('/')[1] for path in meta['checksums']} == {'0', '1'}  # both stages'
  restored, meta = ckpt.restore(trainer.abstract_state(), 1)  # the step is the checkpoint's
  _equal(restored, states[1])
  assert restored.params[0]['up']['kernel'].sharding == \
      states[1].params[0]['up']['kernel'].sharding
  ckpt.close()


def test_a_stage_whose_saved_arrays_differ_is_caught_and_skipped(trainer, states, tmp_path,
                                                                 capsys):
  ckpt = StageCheckpointer(tmp_path / 'ckpt', trainer)
  for step in (1, 2):
    ckpt.save(states[step], {})
  change_one_value(tmp_path / 'ckpt' / '2' / 'state' / 'stage-1.npz', array=0)
  restored, meta = ckpt.restore(trainer.abstract_state())
  assert meta['step'] == 1
  _equal(restored, states[1])
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line == (f'warning: checkpoint step 2 in {tmp_path / "ckpt"} failed verification '
                  "(leaf 'params/1/down/bias' checksum differs); using step 1")
  with pytest.raises(ConfigError, match=r"^checkpoint step 2 in .* failed verification \(leaf "
                     r"'params/1/down/bias' checksum differs\)$"):
    ckpt.restore(trainer.abstract_state(), step=2)
  (tmp_path / 'ckpt' / '1' / 'state' / 'stage-0.npz').write_bytes(b'not a zip file')
  with pytest.raises(ConfigError, match=r'^checkpoint step 1 in .* is unreadable \(.*\); no '
                     'older one is good$'):
    ckpt.restore(trainer.abstract_state())
  ckpt.close()


def test_a_checkpoint_of_other_stages_is_refused(trainer, states, tmp_path):
  ckpt = StageCheckpointer(tmp_path / 'ckpt', trainer)
  ckpt.save(states[1], {})
  other = PipelineTrainer(models.make_task('mlp', hidden=16, width=8), optax.adam(0.01), 8,
                          stages=1, micro_batches=2, devices=require_devices(1))
  with pytest.raises(ConfigError, match=r"was saved with stages over links \[\[0, 1\], \[1, 3\]\]; "
                     r"this run's stages cover \[\[0, 3\]\]"):
    StageCheckpointer(tmp_path / 'ckpt', other).restore(other.abstract_state())
  ckpt.close()


def test_the_loop_hook_saves_every_n_steps_and_at_the_end(trainer, tmp_path):
  ckpt = StageCheckpointer(tmp_path / 'ckpt', trainer)
  state = trainer.init_state()
  for info in training_steps(trainer, state, 3, [ckpt.hook({'run': 2}, every=2)]):
    state = info.state
  assert ckpt.all_steps() == [2, 3] and ckpt.read_meta(3)['run'] == 2
  restored, _ = ckpt.restore(trainer.abstract_state())
  _equal(restored, state)
  ckpt.close()
