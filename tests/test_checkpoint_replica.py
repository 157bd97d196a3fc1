"""`ReplicaCheckpointer`: one replica's checkpoints, by its process alone, verified on restore.

A replica's state is a whole pipeline on one process; its checkpoint is an orbax step directory
(``state/arrays.npz`` and the record). A latest checkpoint whose saved arrays were changed (the
file still decodes, the values differ) is skipped with one warning; asked for by step, as the
runner does to resume every replica from one step, it is a one-line ConfigError.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import optax
import pytest

from hetjax import ConfigError, models
from hetjax.checkpoint import CheckpointerProtocol
from hetjax.pipeline import PipelineTrainer, ReplicaCheckpointer
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


def test_a_replica_checkpoint_of_another_model_does_not_fit(trainer, states, tmp_path):
  ckpt = ReplicaCheckpointer(tmp_path / 'replica-0')
  ckpt.save(states[1], {})
  other = PipelineTrainer(models.make_task('mlp', hidden=32, width=8), optax.sgd(0.1), 8,
                          stages=2, micro_batches=2, devices=require_devices(2))
  with pytest.raises(ConfigError, match=r"^checkpoint step 1 in .* does not fit this state "
                     r"\(leaf 'params/0/up/bias' has shape \[16\] saved, \[32\] expected\)$"):
    ckpt.restore(other.abstract_state(), 1)
  ckpt.close()
