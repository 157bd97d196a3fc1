"""A step's batch read where it is used: each worker reads only the rows of its share (or token)
from a `RowSource`, and the rows are those of the eager global batch."""

import itertools

import numpy as np
import pytest

from hetjax import data as hdata


class CountingSource:
  """An `ArraySource` that counts the rows it reads."""

  def __init__(self):
    self.inner = hdata.ArraySource({'x': np.arange(40.0).reshape(20, 2), 'y': np.arange(20)})
    self.read = 0

  def global_batch(self, seed, step, size):
    self.read += size
    return self.inner.global_batch(seed, step, size)

  def read_rows(self, seed, step, size, lo, hi):
    self.read += hi - lo
    return self.inner.read_rows(seed, step, size, lo, hi)


def test_a_worker_reads_only_its_share():
  source = CountingSource()
  eager = source.inner.global_batch(3, 5, 12)
  shares = (7, 0, 5)
  for worker in range(3):
    batch = hdata.StepBatch(source, seed=3, step=5, size=12)
    got = hdata.slice_batch(batch, shares, worker)
    want = hdata.slice_batch(eager, shares, worker)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
  assert source.read == 12  # each row once, by the worker that computes it
  assert hdata.batch_size(hdata.StepBatch(source, 3, 5, 12)) == 12 and source.read == 12


def test_read_as_a_mapping_the_whole_batch_is_read_once():
  source = CountingSource()
  batch = hdata.StepBatch(source, seed=0, step=1, size=8)
  assert sorted(batch) == ['x', 'y'] and batch['x'].shape == (8, 2) and len(batch) == 2
  assert source.read == 8
  np.testing.assert_array_equal(hdata.take_rows(batch, 2, 5)['y'], batch['y'][2:5])
  assert source.read == 8  # cut from the batch already read


@pytest.mark.parametrize('source', [
    hdata.ArraySource({'x': np.arange(30)}),
    hdata.stdlib_text(seq_len=8, max_bytes=20_000),
], ids=['array', 'stdlib'])
def test_shipped_row_sources_cut_their_own_batch(source):
  assert isinstance(source, hdata.RowSource)
  # A source whose `rows` is a size (the wide & deep tables) is not one.
  assert not isinstance(hdata.zipf_clicks(rows=64, fields=2, dense=2), hdata.RowSource)
  whole = source.global_batch(4, 2, 9)
  for lo, hi in itertools.pairwise([0, 2, 2, 9]):
    part = source.read_rows(4, 2, 9, lo, hi)
    for key in whole:
      np.testing.assert_array_equal(part[key], whole[key][lo:hi])


def test_worker_programs_hand_the_loop_a_lazy_batch():
  from hetjax import models, train

  task = models.make_task('mlp', hidden=8, width=4)
  trainer = train.WorkerTrainer(task, train.Optimizer.SGD.make(0.1), 16, None)
  try:
    batch = trainer.global_batch_at(3)
    assert isinstance(batch, hdata.StepBatch) and (batch.step, batch.size) == (3, 16)
  finally:
    trainer.close()
