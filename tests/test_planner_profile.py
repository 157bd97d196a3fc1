"""Sub-model profiles from XLA against counts derived by hand from the models' shapes."""

import dataclasses
import doctest
import math

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from hetjax import ConfigError, models, planner
from hetjax import data as hdata
from hetjax.bench import compiled_bytes
from hetjax.planner._profile import profile_submodels
from hetjax.planner._profile_types import SubmodelProfile
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Task, Trainer

BATCH = 32


@pytest.fixture(scope='module')
def mlp():
  task = models.make_task('mlp', hidden=64, width=32)
  return task, profile_submodels(task, batch_size=BATCH)


def test_mlp_names_params_and_axes(mlp):
  task, profiles = mlp
  features = task.data.arrays['x'].shape[1]  # 64 pixels
  layers = [(features, 64), (64, 32), (32, 10)]
  assert [p.name for p in profiles] == ['up', 'down', 'head']
  assert [p.params for p in profiles] == [i * o + o for i, o in layers]
  assert [p.param_bytes for p in profiles] == [4.0 * (i * o + o) for i, o in layers]
  assert [p.output_bytes_per_example for p in profiles] == [4.0 * o for _, o in layers]
  # up is ('embed', 'mlp'), down ('mlp', 'embed'), head ('embed', 'classes'); 'classes' is
  # neither a tensor-parallel nor an FSDP axis.
  assert [dict(p.split_sizes) for p in profiles] == [{'mlp': 64}, {'mlp': 64}, {}]
  assert [dict(p.shard_sizes) for p in profiles] == [{'embed': features}, {'embed': 32},
                                                     {'embed': 32}]


def test_mlp_flops_are_three_matmuls_per_layer(mlp):
  """Each dense layer does three matmuls of 2·in·out FLOPs per example: ``x·W`` forward, and
  ``g·Wᵀ`` (input gradient) and ``xᵀ·g`` (weight gradient) backward, so 6·in·out. Besides them
  there are only the bias add (out per example) and the bias gradient's sum over the batch
  (fewer than out per example), hence the bounds. (This XLA counts exactly
  6·in·out + out·(2B − 1)/B.)"""
  task, profiles = mlp
  features = task.data.arrays['x'].shape[1]
  layers = [(features, 64), (64, 32), (32, 10)]
  for profile, (i, o) in zip(profiles, layers, strict=True):
    assert 6 * i * o <= profile.flops_per_example <= 6 * i * o + 2 * o, profile.name
  total = sum(p.flops_per_example for p in profiles)
  matmuls = 6 * sum(i * o for i, o in layers)
  assert matmuls <= total <= 1.01 * matmuls
  assert all(p.bytes_accessed_per_example > p.param_bytes / BATCH for p in profiles)


def test_wide_deep_embedding_dominates_memory():
  task = models.make_task('wide_deep', rows=2048, dim=16, hidden=64, hidden2=32)
  profiles = {p.name: p for p in profile_submodels(task, batch_size=BATCH)}
  assert list(profiles) == ['embedding', 'wide', 'tower']
  embedding = profiles['embedding']
  assert embedding.params == 2048 * 16
  assert embedding.param_bytes == max(p.param_bytes for p in profiles.values())
  assert embedding.split_sizes == {'table': 2048}
  assert embedding.shard_sizes == {'table': 2048, 'embed': 16}
  assert embedding.output_bytes_per_example == 4 * 16 * 4  # 4 fields × dim 16 × f32
  assert profiles['wide'].split_sizes == {'table': 2048}
  # the tower holds the model's matmuls: (4·16 + 8)·64 + 64·32 + 32·1 multiply-adds
  tower_matmuls = 6 * ((4 * 16 + 8) * 64 + 64 * 32 + 32)
  assert tower_matmuls <= profiles['tower'].flops_per_example <= 1.05 * tower_matmuls
  assert profiles['tower'].flops_per_example > 10 * embedding.flops_per_example


def test_transformer_blocks_cost_the_same():
  task = models.make_task('transformer')
  profiles = profile_submodels(task, batch_size=8)
  assert [p.name for p in profiles] == ['embed', 'block_0', 'block_1', 'head']
  _, block_0, block_1, head = profiles
  assert dataclasses.replace(block_1, name='block_0') == block_0
  assert block_0.flops_per_example > 0 and block_0.activation_bytes_per_example > 0
  assert block_0.output_bytes_per_example == 64 * 128 * 4  # seq_len × d_model × f32
  assert head.output_bytes_per_example == 64 * 256 * 4     # seq_len × vocab × f32
  assert block_0.split_sizes == {'mlp': 512, 'heads': 8}
  assert head.split_sizes == {'vocab': 256}
  # Attention output and MLP down are row-parallel: two all-reduces per pass under TP.
  assert [p.tensor_reductions for p in profiles] == [1, 2, 2, 1]
  # Arrays with an 'embed' axis (FSDP gathers each): 4 attention, up and down kernels, down
  # bias, 2 × 2 norm parameters = 11 per block; token and position tables; head kernel, norm.
  assert [p.fsdp_arrays for p in profiles] == [2, 11, 11, 3]
  assert SubmodelProfile.from_json(block_0.to_json()) == block_0


def test_model_without_submodels_is_profiled_whole():
  """As one part, ``'model'`` (`tests/test_planner_whole_model.py` plans and trains one)."""
  source = hdata.ArraySource({'x': np.zeros((8, 2), np.float32), 'y': np.zeros(8, np.int32)})
  task = Task('plain', lambda rngs: nnx.Linear(2, 2, rngs=rngs),
              lambda m, b: optax.softmax_cross_entropy_with_integer_labels(m(b['x']), b['y']),
              source)
  [whole] = profile_submodels(task, batch_size=4)
  assert (whole.name, whole.params, whole.param_bytes) == ('model', 6, 24.0)
  assert whole.tensor_bytes_per_example is None  # nothing tensor parallelism splits
  with pytest.raises(ConfigError, match='batch_size'):
    profile_submodels(task, batch_size=0)


def test_a_dense_embedding_gradient_is_per_step_traffic():
  """Two batch sizes separate traffic: the table's dense gradient does not grow with rows."""
  profiles = {p.name: p for p in profile_submodels(
      models.make_task('wide_deep', rows=2048, dim=16, hidden=64, hidden2=32))}
  table = profiles['embedding']
  assert table.bytes_accessed_per_step >= table.param_bytes
  assert table.bytes_accessed_per_example * 32 < table.bytes_accessed_per_step


def test_a_large_vocabularys_step_memory_matches_xlas():
  # The logits' gradient (batch × sequence × vocabulary float32: 16.8 MB here) is most of this
  # step's memory; compiled alone the head gets it as an argument, so the profile adds it to the
  # last sub-model's activations. Without it the planner said 0.62 of XLA's bytes for a gpt of
  # vocabulary 50304 on this CPU, and 0.65 on an H200 at GPT-2 small's size.
  task = models.make_task('gpt', vocab_size=8192, d_model=64, heads=2, layers=1, mlp=128,
                          seq_len=64, dtype='bfloat16', tie_embeddings=True)
  batch = 8
  profiles = profile_submodels(task, batch_size=batch)
  logits = batch * 64 * 8192 * 4
  assert profiles[-1].name == 'head'
  assert profiles[-1].activation_bytes_per_example * batch > 2 * logits  # logits + gradient
  mesh = make_mesh((1, 1), devices=jax.devices()[:1])
  xla = compiled_bytes(Trainer(  # the donated state counted once
      task, optax.adamw(1e-3), batch, mesh, Strategy.DATA_PARALLEL.rules(), 0).compile_step())
  cluster = planner.ClusterSpec.uniform(1, 1, 1e12, 16e9)
  plan = planner.search(profiles, cluster, batch, memory_cap=float('inf'), micro_batches=1)
  ratio = sum(s.memory_bytes for s in plan.submodels) / xla  # 0.98 at jax 0.10.2
  assert 0.85 < ratio < 1.25, ratio


def test_a_tied_table_counts_once():
  """The head tied to the embedding's table holds it too; it is stored and updated once, so
  it counts in the embedding only: the profiles' parameters add up to the model's."""
  tied = models.make_task('gpt', d_model=32, heads=2, layers=1, mlp=64, seq_len=16,
                          tie_embeddings=True)
  untied = models.make_task('gpt', d_model=32, heads=2, layers=1, mlp=64, seq_len=16)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: tied.make_model(nnx.Rngs(0)))
  total = sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  profiles, separate = profile_submodels(tied, 4), profile_submodels(untied, 4)
  assert sum(p.params for p in profiles) == total
  assert [p.params for p in profiles[:-1]] == [p.params for p in separate[:-1]]
  table = 256 * 32
  assert profiles[-1].params == separate[-1].params - table == 2 * 32  # the head's norm
  assert profiles[-1].param_bytes == 4 * 2 * 32


def test_a_timed_profile_times_each_submodel_on_the_device():
  """``timed=True`` keeps every analysis (the programs compiled at XLA's default give the same
  counts) and adds each sub-model's forward + backward time, fitted over the batch and twice
  it; identical blocks share one timing."""
  task = models.make_task('gpt', d_model=32, heads=2, layers=2, mlp=64, seq_len=16)
  counted = profile_submodels(task, batch_size=8)
  timed = profile_submodels(task, batch_size=8, timed=True)
  assert [p.name for p in timed] == ['embed', 'block_0', 'block_1', 'head']
  call = timed[0].call_seconds
  for c, t in zip(counted, timed, strict=True):
    assert not c.timed and t.timed
    untimed = dataclasses.replace(t, seconds_per_example=None, seconds_per_step=0.0,
                                  call_seconds=0.0)
    assert untimed == c, t.name
    assert t.seconds_per_example >= 0 and t.seconds_per_step >= 0
    # Less a call's fixed cost, a small sub-model may be left 0 s; the first carries the call.
    assert 0 <= t.timed_seconds(8) < 1.0
    assert t.call_seconds == call >= 0  # one figure for the profile
  assert timed[0].timed_seconds(8) > 0
  assert timed[1].timed_seconds(8) == timed[2].timed_seconds(8)


def test_a_program_calls_cost_is_paid_once_a_step():
  """Sub-models timed as separate programs each pay a call's fixed cost that the step, one
  program, pays once: the excess over the whole program is split over the calls too many."""
  from hetjax.planner._profile_timing import call_seconds

  # An H200's wide & deep sub-models (measured), against a whole gradient of 0.25 ms.
  assert call_seconds([0.088e-3, 0.142e-3, 0.178e-3], 0.25e-3) == pytest.approx(79e-6)
  assert call_seconds([1e-3, 2e-3], 3.5e-3) == 0.0  # the one program is slower: no floor
  assert call_seconds([1e-3], 0.5e-3) == 0.0  # one sub-model: one call either way
  from hetjax.planner import _profile_timing

  assert doctest.testmod(_profile_timing, raise_on_error=True).attempted == 2


def test_a_state_that_cannot_be_made_up_is_a_config_error():
  from hetjax.planner._profile_timing import filled

  keys = {'rng': jax.eval_shape(lambda: jax.random.key(0))}
  with pytest.raises(ConfigError, match='cannot time the sub-models: their state holds a '
                                        r'key<fry> array of shape \(\)'):
    filled(keys, jax.devices()[0], np.random.default_rng(0))
  made = filled({'w': jax.ShapeDtypeStruct((2, 3), np.float32),
                 'n': jax.ShapeDtypeStruct((), np.int32)}, jax.devices()[0],
                np.random.default_rng(0))
  assert made['w'].shape == (2, 3) and 0 < float(np.abs(made['w']).max()) < 1
  assert int(made['n']) == 0
