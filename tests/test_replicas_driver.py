"""`ReplicaDriver` in one process: one replica (nothing to average with) under a real service.

The multi-replica behaviour is tested with 4 processes in tests/test_replicas_sdpipe.py; here,
what needs no peers: the driver's loop and records against the plain `PipelineTrainer`, the
pause, `warm_up` leaving the state alone, and bad arguments.
"""

from __future__ import annotations

import itertools
import time

import jax
import numpy as np
import optax
import pytest

from hetjax import ConfigError, models
from hetjax.pipeline import PipelineTrainer
from hetjax.replicas import (
  ReplicaCheckpointer,
  ReplicaDriver,
  ReplicaPolicy,
  SyncClient,
  SyncPolicy,
  start_service,
)
from hetjax.runtime import LocalChannel
from hetjax.train import training_steps
from tests.conftest import require_devices

WAIT_S = 30.0


@pytest.fixture(scope='module')
def trainer():
  return PipelineTrainer(models.make_task('mlp', hidden=16, width=8), optax.sgd(0.1), 8,
                         stages=2, micro_batches=2, devices=require_devices(2))


def test_one_replica_trains_like_the_plain_pipeline_and_records_its_steps(trainer):
  channel = LocalChannel()
  service = start_service(channel, SyncPolicy('sdpipe', 1), 'solo')
  paused = []

  class Pace:  # a replica's host: pads each step's compute of the batch's rows
    def pad(self, step, rows, compute_s):
      paused.append((step, compute_s))
      assert rows == trainer.global_batch
      time.sleep(0.001)  # at least what it reports
      return 0.001, 0.0

  driver = ReplicaDriver(trainer, SyncClient(channel, 'solo', 0), 1, host=Pace())
  assert driver.warm_up(trainer.init_state()) > 0
  state, records = driver.run(trainer.init_state(), steps=3)
  report = service.join(WAIT_S)

  plain, losses = trainer.init_state(), []
  for step in range(3):  # one replica reads stream positions 0, 1, 2
    plain, loss = trainer.train_step(plain, trainer.global_batch_at(step))
    losses.append(float(loss))
  np.testing.assert_allclose([r.loss for r in records], losses, rtol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, state.params, plain.params)
  assert [r.step for r in records] == [1, 2, 3] and state.step == 3
  assert [r.members for r in records] == [(0,)] * 3 and [r.seq for r in records] == [0, 1, 2]
  assert [s for s, _ in paused] == [1, 2, 3] and all(r.pause_s == 0.001 for r in records)
  assert all(r.sync_s == 0.0 and r.end_s >= r.start_s + r.compute_s for r in records)
  assert [b.start_s >= a.end_s for a, b in itertools.pairwise(records)] == [True, True]
  assert (report.groups, report.mean_group, report.messages) == (3, 1.0, 4)


def test_until_s_stops_starting_steps_and_on_step_sees_the_state(trainer):
  channel = LocalChannel()
  service = start_service(channel, SyncPolicy('all-reduce', 1), 'timed')
  seen = []
  driver = ReplicaDriver(trainer, SyncClient(channel, 'timed', 0), 1)
  state, records = driver.run(trainer.init_state(), until_s=0.3,
                              on_step=lambda record, state: seen.append((record.step, state.step)))
  service.join(WAIT_S)
  assert records and seen == [(r.step, r.step) for r in records]
  assert records[-1].start_s < 0.3 and state.step == len(records)
  assert all(r.global_sync for r in records)


def test_bad_arguments(trainer):
  channel = LocalChannel()
  with pytest.raises(ConfigError, match='speaks for worker 1, but this is process 0 of 1'):
    ReplicaDriver(trainer, SyncClient(channel, 'x', 1), 1)
  with pytest.raises(ConfigError, match='replicas'):
    ReplicaDriver(trainer, SyncClient(channel, 'x', 0), 0)
  driver = ReplicaDriver(trainer, SyncClient(channel, 'x', 0), 1)
  with pytest.raises(ConfigError, match='give steps, until_s or both'):
    driver.run(trainer.init_state())


class SlowGroups(LocalChannel):
  """A channel whose group announcements reach the replica 50 ms late (a slow scheduler)."""

  def wait(self, key, timeout_s):
    if '/g/' in key:
      time.sleep(0.05)
    return super().wait(key, timeout_s)


# With momentum the optimizer state exists, and the next step donates it while the background
# thread still waits for the group: the hand-off must not hold on to it.
@pytest.mark.parametrize('momentum', [None, 0.9])
def test_overlap_with_one_replica_is_the_plain_pipeline(momentum):
  """Alone, every group is a singleton: overlapping changes nothing (no mean to move onto)."""
  trainer = PipelineTrainer(models.make_task('mlp', hidden=16, width=8),
                            optax.sgd(0.1, momentum=momentum), 8, stages=2, micro_batches=2,
                            devices=require_devices(2))
  channel = SlowGroups()
  service = start_service(channel, SyncPolicy('all-reduce', 1), 'overlap')
  driver = ReplicaDriver(trainer, SyncClient(channel, 'overlap', 0), 1, overlap=True)
  state, records = driver.run(trainer.init_state(), steps=3)
  report = service.join(WAIT_S)
  plain = trainer.init_state()
  for step in range(3):
    plain, _ = trainer.train_step(plain, trainer.global_batch_at(step))
  jax.tree.map(np.testing.assert_array_equal, (state.params, state.opt_state),
               (plain.params, plain.opt_state))
  # Each step applies the previous step's group; the last one is applied after the loop.
  assert [r.members for r in records] == [(), (0,), (0,)]
  assert [r.seq for r in records] == [-1, 0, 1] and report.groups == 3


def test_the_loop_checkpoints_a_replica_and_its_scheduler_and_resumes_exactly(trainer, tmp_path):
  """`training_steps` with `ReplicaPolicy` as the policy and `ReplicaCheckpointer`'s hook:
  4 steps, then a fresh driver and service resumed from step 2 end where the uninterrupted run
  did, and the scheduler's group numbers go on from the saved ones."""

  def segment(prefix, state, until, policy_state=None, workdir=None):
    channel = LocalChannel()
    sync = ReplicaPolicy(SyncPolicy('sdpipe', 1), channel, prefix, serve=True)
    driver = ReplicaDriver(trainer, SyncClient(channel, prefix, 0), 1)
    hooks = [] if workdir is None else [ReplicaCheckpointer(workdir).hook({'run': 1}, every=2)]
    seqs = []
    for info in training_steps(driver, state, until, hooks, sync, policy_state):
      state = info.state
      seqs.append(info.stats.local.seq)
    driver.close()
    assert sync.close(WAIT_S).groups == len(seqs)
    return state, seqs

  whole, seqs = segment('a', trainer.init_state(), 4, workdir=tmp_path)
  ckpt = ReplicaCheckpointer(tmp_path)
  assert ckpt.all_steps() == [2, 4]
  template = ReplicaPolicy(SyncPolicy('sdpipe', 1), None, '', serve=False).init()
  state, meta = ckpt.restore(trainer.abstract_state(2), 2)
  saved = ckpt.policy_state(meta, template)
  assert saved['step'] == 2 and saved['sync']['seq'] == 2 and meta['run'] == 1
  resumed, later = segment('b', state, 4, saved)
  assert seqs == [0, 1, 2, 3] and later == [2, 3]  # the group numbers go on
  assert resumed.step == whole.step == 4
  jax.tree.map(np.testing.assert_array_equal, resumed.params, whole.params)
  with pytest.raises(ConfigError, match='no complete checkpoint at step 3'):
    ckpt.restore(trainer.abstract_state(3), 3)
