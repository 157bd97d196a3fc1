"""`ReplicaCheckpointer`: one replica's checkpoints, by its process alone, verified on restore.

A replica's state is a whole pipeline on one process; its checkpoint is an orbax step directory
(``state/arrays.npz`` and the record). A latest checkpoint whose saved arrays were changed (the
file still decodes, the values differ) is skipped with one warning; asked for by step, as the
runner does to resume every replica from one step, it is a one-line ConfigError. Replicas that
restore together over a channel agree on the newest step every one of them holds good.
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading

import jax
import numpy as np
import optax
import pytest

from hetjax import ConfigError, models
from hetjax.checkpoint import CheckpointerProtocol
from hetjax.pipeline import PipelineTrainer
from hetjax.replicas import ReplicaCheckpointer
from hetjax.runtime import LocalChannel
from tests.conftest import require_devices


def change_one_value(path: pathlib.Path, array: int = -1) -> None:
  """Rewrites the ``.npz`` file at ``path`` with one element of one of its arrays changed (the
  last by default): the file reads back without an error, with other values."""
  with np.load(path, allow_pickle=False) as data:
    arrays = [data[f'arr_{i}'] for i in range(len(data.files))]
  changed = arrays[array].copy()
  changed.reshape(-1)[0] = changed.reshape(-1)[0] + 1 if changed.dtype != bool else \
      not changed.reshape(-1)[0]
  arrays[array] = changed
  with open(path, 'wb') as f:
    np.savez(f, *arrays)


@pytest.fixture(scope='module')
def trainer():
  return PipelineTrainer(models.make_task('mlp', hidden=16, width=8), optax.sgd(0.1), 8,
                         stages=2, micro_batches=2, devices=require_devices(2))


@pytest.fixture(scope='module')
def states(trainer):
  state, states = trainer.init_state(), {}
  for step in range(2):
    state, _ = trainer.train_step(state, trainer.global_batch_at(step))
    states[state.step] = jax.tree.map(lambda x: x.copy(), state)  # the next step donates it
  return states


def test_a_replica_whose_saved_arrays_differ_is_caught_and_skipped(trainer, states, tmp_path,
                                                                   capsys):
  ckpt = ReplicaCheckpointer(tmp_path / 'replica-0')
  assert isinstance(ckpt, CheckpointerProtocol)
  for step in (1, 2):
    ckpt.save(states[step], {'run': 1})
  assert {'meta', 'state'} <= {p.name for p in (tmp_path / 'replica-0' / '2').iterdir()}
  change_one_value(tmp_path / 'replica-0' / '2' / 'state' / 'arrays.npz', array=0)

  restored, meta = ckpt.restore(trainer.abstract_state())
  assert restored.step == meta['step'] == 1 and meta['run'] == 1  # the step is the checkpoint's
  jax.tree.map(np.testing.assert_array_equal, restored.params, states[1].params)
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line == (f'warning: checkpoint step 2 in {tmp_path / "replica-0"} failed verification '
                  "(leaf 'params/0/up/bias' checksum differs); using step 1")
  with pytest.raises(ConfigError) as e:
    ckpt.restore(trainer.abstract_state(2), 2)
  assert str(e.value) == (f'checkpoint step 2 in {tmp_path / "replica-0"} failed verification '
                          "(leaf 'params/0/up/bias' checksum differs)")
  ckpt.close()


def test_a_replica_checkpoint_of_another_model_does_not_fit(trainer, states, tmp_path, capsys):
  """Another model's checkpoints name the parameters that differ, and the latest is not skipped
  for an older one (they all hold the same parameters)."""
  ckpt = ReplicaCheckpointer(tmp_path / 'replica-0')
  for step in (1, 2):
    ckpt.save(states[step], {})
  other = PipelineTrainer(models.make_task('mlp', hidden=32, width=8), optax.sgd(0.1), 8,
                          stages=2, micro_batches=2, devices=require_devices(2))
  for step in (None, 1):
    with pytest.raises(ConfigError, match=(
        rf"^checkpoint step {step or 2} in .* holds other parameters than this model \(was the "
        r"model changed since it was saved\?\): 3 changed \('params/0/up/bias' \[16\] saved, "
        r"\[32\] now; .*; 'params/1/down/kernel' \[16, 8\] saved, \[32, 8\] now\); the run's "
        r"older checkpoints hold the same, so none is restored$")):
      ckpt.restore(other.abstract_state(), step)
  assert capsys.readouterr().err == ''
  ckpt.close()


def _restore_together(trainer, directories, board):
  """Every replica's ``restore`` as threads over ``board``: (state, meta) or the error, each."""
  results = [None] * len(directories)

  def replica(r):
    ckpt = ReplicaCheckpointer(directories[r], board=board, replica=r,
                               replicas=len(directories))
    try:
      results[r] = ckpt.restore(trainer.abstract_state())
    except ConfigError as e:
      results[r] = e
    finally:
      ckpt.close()

  threads = [threading.Thread(target=replica, args=(r,)) for r in range(len(directories))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(60)
  return results


def test_replicas_agree_on_the_newest_step_every_one_holds_good(trainer, states, tmp_path,
                                                                capsys):
  """Replica 0's step 2 is bad and replica 1 also holds step 3: both restore step 1, and only
  replica 0 prints a warning (its own bad checkpoint)."""
  directories = [tmp_path / 'replica-0', tmp_path / 'replica-1']
  for directory, steps in zip(directories, ((1, 2), (1, 2, 3)), strict=True):
    ckpt = ReplicaCheckpointer(directory)
    for step in steps:
      ckpt.save(dataclasses.replace(states[min(step, 2)], step=step), {'run': 1})
    ckpt.close()
  change_one_value(directories[0] / '2' / 'state' / 'arrays.npz', array=0)
  results = _restore_together(trainer, directories, LocalChannel())
  for restored, meta in results:
    assert restored.step == meta['step'] == 1
    jax.tree.map(np.testing.assert_array_equal, restored.params, states[1].params)
  assert capsys.readouterr().err.strip().splitlines() == [
      f'warning: checkpoint step 2 in {directories[0]} failed verification '
      "(leaf 'params/0/up/bias' checksum differs); using step 1"]

  change_one_value(directories[0] / '1' / 'state' / 'arrays.npz', array=0)  # none good in 0
  results = _restore_together(trainer, directories, LocalChannel())
  for r, result in enumerate(results):
    assert isinstance(result, ConfigError)
    assert str(result) == f"replica 0 has no good checkpoint (this replica's are in {directories[r]})"


def test_replicas_restoring_together_stop_at_another_models_checkpoints(trainer, states,
                                                                        tmp_path, capsys):
  """Replicas agreeing on a step (`ReplicaCheckpointer._newest_good`) do not walk back through
  another model's checkpoints either: each names the parameters that differ."""
  directories = [tmp_path / 'replica-0', tmp_path / 'replica-1']
  for directory in directories:
    ckpt = ReplicaCheckpointer(directory)
    for step in (1, 2):
      ckpt.save(states[step], {})
    ckpt.close()
  other = PipelineTrainer(models.make_task('mlp', hidden=32, width=8), optax.sgd(0.1), 8,
                          stages=2, micro_batches=2, devices=require_devices(2))
  for directory, result in zip(directories, _restore_together(other, directories, LocalChannel()),
                               strict=True):
    assert isinstance(result, ConfigError)
    assert str(result).startswith(f'checkpoint step 2 in {directory} holds other parameters '
                                  "than this model (was the model changed since it was saved?): "
                                  "3 changed ('params/0/up/bias' [16] saved, [32] now;")
  assert capsys.readouterr().err == ''
