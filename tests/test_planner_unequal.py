"""The planner on unequal workers: speeds and device counts per worker, every plan it returns
trainable, and the reasons it gives for each placement."""

import dataclasses

import numpy as np
import pytest

from hetjax import ConfigError, models
from hetjax.planner import (
  ClusterSpec,
  SubmodelProfile,
  WorkerSpec,
  alternatives,
  compile_plan,
  explain,
  search,
)
from hetjax.planner import profile_submodels as profile
from hetjax.train import training_steps
from tests.conftest import require_devices
from tests.test_strategies import MODELS, OPTIMIZER


def test_slowdowns_divide_speed_and_bandwidth_per_worker():
  base = ClusterSpec.uniform(4, 2, 1e12, 16e9)
  base = dataclasses.replace(base, workers=tuple(
      dataclasses.replace(w, memory_bytes_per_s=1e11) for w in base.workers))
  slow = base.with_slowdowns((1, 1, 3, 3))
  assert [w.flops_per_s for w in slow.workers] == [1e12, 1e12, 1e12 / 3, 1e12 / 3]
  assert slow.workers[3].memory_bytes_per_s == pytest.approx(1e11 / 3)
  with pytest.raises(ConfigError, match='must be 4 positive finite factors'):
    base.with_slowdowns((1, 2))
  with pytest.raises(ConfigError, match='must be 4 positive finite factors'):
    base.with_slowdowns((1, 1, 0, 1))


def test_regroup_splits_the_measured_devices_into_workers():
  one = ClusterSpec((WorkerSpec(8, 2e10, 4e9),), alpha_s=3e-5)
  four = one.regroup((2, 2, 2, 2))
  assert four.counts == (2, 2, 2, 2) and four.alpha_s == 3e-5
  assert one.regroup((4, 2, 1, 1)).counts == (4, 2, 1, 1)
  with pytest.raises(ConfigError, match='add up to the 8 devices'):
    one.regroup((4, 2))


def _cluster(slow=(1, 1, 3, 3), counts=(2, 2, 2, 2)):
  return ClusterSpec((WorkerSpec(8, 2e10, 4e9, 2e9),), 2e-5, 1e9).regroup(counts) \
      .with_slowdowns(slow)


def test_compute_heavy_sub_models_go_to_the_fast_workers():
  # A tower whose compute dwarfs its bytes: on all 4 workers it runs at the slow ones' pace
  # (8 devices at 1/3 speed = 2.7 fast devices), on the 2 fast ones at full speed (4).
  tower = SubmodelProfile('tower', 10**5, 4e5, 2e8, output_bytes_per_example=16,
                          split_sizes={'mlp': 64})
  plan = search([tower], _cluster(), 512, tie_tolerance=0, micro_batches=1)
  assert plan.submodels[0].group == (0, 1)
  assert plan.counts == (2, 2, 2, 2)
  # Equal workers: every worker.
  assert search([tower], _cluster(slow=(1, 1, 1, 1)), 512, micro_batches=1).submodels[0].group \
      in ((), (0, 1, 2, 3))


def test_groups_whose_devices_do_not_split_a_micro_batch_are_not_offered():
  tower = SubmodelProfile('tower', 10**5, 4e5, 2e8, split_sizes={'mlp': 64})
  cluster = _cluster(slow=(1, 3, 3), counts=(4, 2, 2))
  # The candidate groups are all 8 devices and the fastest worker's 4: a micro-batch of 6 rows
  # splits over neither, so no plan could be trained.
  with pytest.raises(ConfigError, match='no device group splits a micro-batch of 6 rows'):
    search([tower], cluster, 12, micro_batches=2)
  assert search([tower], cluster, 16, micro_batches=2).submodels[0].group in ((0,), ())


@pytest.mark.parametrize('name', sorted(MODELS))
def test_every_plan_the_search_returns_trains(name):
  """On 4 workers of 2 devices, two of them 3x slow (the cluster the unequal benchmark
  emulates), at two memory caps: the plan compiles, its memory is checked per stage, and a
  step runs."""
  kwargs, batch = MODELS[name]
  task = models.make_task(name, **kwargs)
  profiles = profile(task)
  trained = []
  for cap in (None, 2e6):
    try:
      plan = search(profiles, _cluster(), batch, memory_cap=cap, micro_batches=2)
    except ConfigError as e:  # a cap no plan fits is a one-line answer too
      assert 'no plan fits' in str(e)
      continue
    if plan in trained:  # the cap changed nothing: this very plan compiled and ran already
      continue
    trained.append(plan)
    compiled = compile_plan(plan, task, OPTIMIZER, batch, devices=require_devices(8),
                            micro_batches=2)
    info = next(training_steps(compiled.trainer, compiled.trainer.init_state(), 1))
    assert np.isfinite(float(info.stats.loss))


def test_explanations_name_every_other_group_and_its_cost():
  emb = SubmodelProfile('embedding', 10**6, 4e6, 2e3, output_bytes_per_example=256,
                        split_sizes={'table': 10**4})
  tower = SubmodelProfile('tower', 10**5, 4e5, 2e8, output_bytes_per_example=16,
                          split_sizes={'mlp': 64})
  cluster = _cluster()
  plan = search([emb, tower], cluster, 512, micro_batches=1)
  options = alternatives(plan, [emb, tower], cluster, 512)
  for name, (chosen, *others) in options.items():
    assert chosen.chosen and chosen.step_s == pytest.approx(plan.predicted_step_s)
    assert {o.group for o in others} | {chosen.group} == {(0, 1, 2, 3), (0,), (0, 1)}, name
    # The search's choice is at least as fast as any single change that fits.
    assert all(o.step_s >= chosen.step_s * (1 - 1e-9) for o in others if o.fits)
  lines = explain(plan, [emb, tower], cluster, 512)
  assert len(lines) == 2 and lines[1].startswith('tower: workers 0,1 (4 devices, slowest ')
  assert 'all workers (8 devices, slowest 6.7 GFLOP/s)' in lines[1]
