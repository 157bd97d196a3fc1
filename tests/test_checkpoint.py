"""Checkpoints: exact resume, restore onto another mesh, and no half-written checkpoints."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hetjax import ConfigError, models
from hetjax.checkpoint import Checkpointer, check_compatible
from hetjax.sharding import make_mesh
from hetjax.train import Hook, Strategy, Trainer, TrainState, training_steps
from tests.conftest import require_devices

STEPS, SAVE_AT = 6, 3


def _trainer(shape, strategy):
  mesh = make_mesh(shape, devices=require_devices(int(np.prod(shape))))
  task = models.make_task('wide_deep', rows=2048, dim=16, hidden=64, hidden2=32)
  return Trainer(task, optax.adam(1e-2), 64, mesh, strategy.rules(), seed=1)


def _losses(trainer, state, until, hooks=()):
  infos = list(training_steps(trainer, state, until, hooks))
  return [float(i.metrics['loss']) for i in infos], infos[-1].state


@pytest.fixture(scope='module')
def hybrid():
  """The (4, 2) hybrid trainer of the uninterrupted run and the stopped one (one compile)."""
  return _trainer((4, 2), Strategy.HYBRID)


@pytest.fixture(scope='module')
def uninterrupted(hybrid):
  return _losses(hybrid, hybrid.init_state(), STEPS)


@pytest.fixture(scope='module')
def partway(tmp_path_factory, hybrid):
  """``(checkpoint directory, losses)`` of a run stopped after `SAVE_AT` steps, saved at its end.
  Made once for the module; each test restores from a copy of its own (`_save_partway`)."""
  saved = tmp_path_factory.mktemp('partway') / 'ckpt'
  ckpt = Checkpointer(saved)
  first, _ = _losses(hybrid, hybrid.init_state(), SAVE_AT, [ckpt.hook({'k': 1}, every=SAVE_AT)])
  ckpt.close()
  return saved, first


def _save_partway(tmp_path, partway):
  """The stopped run's checkpoint copied to ``tmp_path / 'ckpt'``; its losses."""
  saved, first = partway
  shutil.copytree(saved, tmp_path / 'ckpt')
  return first


def test_stopped_and_resumed_run_repeats_the_uninterrupted_losses(tmp_path, uninterrupted,
                                                                 partway):
  first = _save_partway(tmp_path, partway)
  trainer = _trainer((4, 2), Strategy.HYBRID)  # a new process would build a new trainer too
  ckpt = Checkpointer(tmp_path / 'ckpt')
  state, meta = ckpt.restore(trainer.abstract_state())
  checksums = meta.pop('checksums')  # verified on restore: tests/test_checkpoint_verify.py
  assert meta == {'k': 1, 'step': SAVE_AT} and int(state.step) == SAVE_AT
  assert 'params/embedding/table' in checksums and checksums['step']['dtype'] == 'int32'
  rest, final = _losses(trainer, state, STEPS)
  assert first + rest == uninterrupted[0]  # same program, same data: bit-identical
  jax.tree.map(np.testing.assert_array_equal,
               jax.device_get(final.params), jax.device_get(uninterrupted[1].params))


@pytest.mark.parametrize('shape, strategy', [((8, 1), Strategy.FSDP), ((1, 1), Strategy.DATA_PARALLEL)])
def test_restore_onto_another_mesh_and_device_count(tmp_path, uninterrupted, partway, shape,
                                                   strategy):
  _save_partway(tmp_path, partway)
  trainer = _trainer(shape, strategy)
  state, _ = Checkpointer(tmp_path / 'ckpt').restore(trainer.abstract_state())
  table = state.params['embedding']['table']
  assert table.sharding == trainer.state_shardings.params['embedding']['table']
  rest, _ = _losses(trainer, state, STEPS)
  np.testing.assert_allclose(rest, uninterrupted[0][SAVE_AT:], rtol=1e-5)


def test_unfinished_save_is_never_loaded(tmp_path, partway):
  _save_partway(tmp_path, partway)
  # What a process killed mid-save leaves: orbax's temporary directory for the next step.
  partial = tmp_path / 'ckpt' / f'{SAVE_AT + 1}.orbax-checkpoint-tmp-1234567890'
  (partial / 'state').mkdir(parents=True)
  (partial / 'state' / 'garbage').write_bytes(os.urandom(64))
  ckpt = Checkpointer(tmp_path / 'ckpt')
  assert ckpt.latest_step() == SAVE_AT and ckpt.all_steps() == [SAVE_AT]
  ckpt.restore(_trainer((4, 2), Strategy.HYBRID).abstract_state())


def test_missing_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(ConfigError, match='no complete checkpoint in'):
    Checkpointer(tmp_path / 'empty').read_meta()


def test_check_compatible_allows_new_layout_but_not_new_task():
  saved = {'task': {'name': 'mlp', 'hidden': 256}, 'data': {'seed': 0}, 'layout': {'mesh': '4x2'}}
  check_compatible(saved, {**saved, 'layout': {'mesh': '8x1'}}, 'ckpt')
  with pytest.raises(ConfigError, match=r"its task is \{name='mlp', hidden=256\} but this run "
                     r"has \{name='mlp', hidden=512\}"):
    check_compatible(saved, {**saved, 'task': {'name': 'mlp', 'hidden': 512}}, 'ckpt')
  with pytest.raises(ConfigError, match='its data is'):
    check_compatible(saved, {**saved, 'data': {'seed': 1}}, 'ckpt')


def _flip_bytes(directory):
  """Flips 16 bytes in the middle of the two largest files under ``directory``."""
  files = sorted((p for p in directory.rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)
  for path in files[-2:]:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 16):
      data[i] ^= 0xFF
    path.write_bytes(data)


def test_a_corrupt_latest_checkpoint_is_skipped_with_one_warning(tmp_path, capsys):
  """Flipped bytes in the latest checkpoint's arrays: the one before it is restored, with one
  warning line naming the unreadable step; asked for by step, it is a one-line ConfigError."""
  ckpt = Checkpointer(tmp_path / 'ckpt')
  for step in (1, 2):
    state = TrainState(jnp.int32(step), {'w': jnp.arange(1000, dtype=jnp.float32) * step}, {})
    ckpt.save(state, {'k': 1})
  ckpt.wait()
  _flip_bytes(tmp_path / 'ckpt' / '2' / 'state')
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
  restored, meta = ckpt.restore(abstract)
  assert int(restored.step) == 1 and meta['step'] == 1
  np.testing.assert_array_equal(restored.params['w'], np.arange(1000, dtype=np.float32))
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line.startswith(f'warning: checkpoint step 2 in {tmp_path / "ckpt"} is unreadable (')
  assert line.endswith('); using step 1')
  with pytest.raises(ConfigError, match=r'checkpoint step 2 in .* is unreadable'):
    ckpt.restore(abstract, step=2)
  ckpt.close()


def test_a_background_save_is_committed_by_the_next_steps_hook(tmp_path, hybrid):
  """Orbax writes a checkpoint in the background; the checkpoint hook of the step after a save
  waits for it to commit, so at most ``every`` steps are ever lost (issue 28). A hook after it
  sees, at every step, each checkpoint due before that step complete on disk, and the hook
  waited at step 3, where no save is due (orbax itself waits only when the next save starts).
  """
  ckpt = Checkpointer(tmp_path / 'ckpt')  # asynchronous, orbax's default
  every, seen, waits, step = 2, {}, [], [0]
  wait = ckpt._manager.wait_until_finished
  ckpt._manager.wait_until_finished = lambda: (waits.append(step[0]), wait())

  def on_disk(info):
    step[0] = info.step + 1  # the step whose hooks run next
    seen[info.step] = {int(p.name) for p in (tmp_path / 'ckpt').iterdir() if p.name.isdigit()}

  _losses(hybrid, hybrid.init_state(), 5, [ckpt.hook({'k': 1}, every), Hook(on_disk)])
  assert 3 in waits and 1 not in waits, waits
  for at, steps in seen.items():
    assert {s for s in (2, 4) if s < at} <= steps, (at, steps)
  ckpt.close()
  assert sorted(int(p.name) for p in (tmp_path / 'ckpt').iterdir()) == [2, 4, 5]
