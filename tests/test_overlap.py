"""The all-reduce scheduler (`OverlapTrainer`) against its plain recurrence and the synchronous
step, the emulated links on the synchronous step, fusion buckets, and background failures.

The launched cases share one 2-worker job (tests/workers/train_overlap.py, about 20 s); the
others run in this process as a single worker, where the local gradient is the whole gradient.
"""

import dataclasses
import doctest
import itertools
import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from hetjax import models
from hetjax._errors import ConfigError
from hetjax.core import Work
from hetjax.data import slice_batch
from hetjax.emulation import LinkedHost, Links
from hetjax.run._sections import ParallelismConfig
from hetjax.runtime import launch_local
from hetjax.train import (
  OverlapEstimate,
  OverlapTrainer,
  Strategy,
  WorkerTrainer,
  _background,
  _fused,
)
from hetjax.train._fused import FusedLayout, bucket_bounds
from tests.conftest import require_devices
from tests.workers.common import MODELS, OPTIMIZER, OVERLAP_HOST_S, OVERLAP_SHARES, OVERLAP_STEPS

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 180
KWARGS, BATCH = MODELS['mlp']


def test_doctests():
  assert doctest.testmod(_fused).failed == 0
  assert doctest.testmod(_background).failed == 0


@pytest.mark.parametrize('sizes, threshold, expected', [
    ((5, 32, 2048, 10), None, ((0, 2095),)),               # None: one bucket
    ((5, 32, 2048, 10), 4096, ((0, 37), (37, 2085), (2085, 2095))),  # a large leaf alone
    ((5, 32, 2048, 10), 10**9, ((0, 2095),)),
    ((5, 32, 10), 4 * 37, ((0, 37), (37, 47))),            # exactly at the threshold: kept
    ((5, 32, 10), 4, ((0, 5), (5, 37), (37, 47))),         # below every leaf: one leaf each
])
def test_bucket_bounds_cover_the_buffer_in_order(sizes, threshold, expected):
  bounds = bucket_bounds(sizes, threshold)
  assert bounds == expected
  assert bounds[0][0] == 0 and bounds[-1][1] == sum(sizes)
  assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize('threshold', [0, -8])
def test_bucket_bounds_refuse_a_non_positive_threshold(threshold):
  with pytest.raises(ConfigError, match=f'bucket_bytes {threshold} must be a positive'):
    bucket_bounds((1, 2), threshold)


# -- one worker, in this process ------------------------------------------------------------------


@pytest.fixture(scope='module')
def task():
  require_devices(8)
  return models.make_task('mlp', **KWARGS)


def _run(program, steps, shares=(BATCH,)):
  state, stats = program.init_state(), []
  for step in range(steps):
    state, s = program.step(state, Work(step, program.global_batch_at(step)), shares)
    stats.append(s)
  return state, stats


def test_one_worker_overlap_is_the_synchronous_step_bucketed_or_not(task):
  # One worker's local gradient is the whole gradient, so w̃ₜ₊₁ = wₜ₊₁: the overlap computes
  # what the synchronous step does (up to float rounding of two programs against one), and
  # buckets only cut the psum (elementwise, so exactly).
  steps = 4
  sync_state, sync_stats = _run(WorkerTrainer(task, OPTIMIZER, BATCH), steps)
  results = {}
  for bucket_bytes in (None, 4096):
    program = OverlapTrainer(task, OPTIMIZER, BATCH, bucket_bytes=bucket_bytes)
    state, stats = _run(program, steps)
    assert int(state.step) == steps and int(state.train.step) == steps - 1
    assert [s.step for s in stats] == [0, 0, 1, 2]  # each reports the step whose reduction landed
    assert stats[0].sampled == (False,) and math.isnan(float(stats[0].loss))
    np.testing.assert_allclose([float(s.loss) for s in stats[1:]],
                               [float(s.loss) for s in sync_stats[:-1]], rtol=1e-6)
    flushed = program.flush(state)
    assert int(flushed.step) == int(flushed.train.step) == steps and int(flushed.ahead) == 0
    assert program.flush(flushed) is flushed
    program.close()
    results[bucket_bytes] = (program.buckets, jax.device_get(flushed.train.params))
  buckets, one = results[None]
  split, params = results[4096]
  assert len(buckets) == 1 and len(split) == 4 and split[-1][1] == buckets[0][1]
  jax.tree.map(np.testing.assert_array_equal, params, one)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               one, jax.device_get(sync_state.params))


def test_a_shrunk_estimate_follows_its_recurrence(task):
  # α = 0.5: w̃ = opt(w, 0.5 · g), so even one worker's overlap is another trajectory than the
  # synchronous step's, the one `_reference` computes on one device.
  steps = 4
  program = OverlapTrainer(task, OPTIMIZER, BATCH, estimate_scale=0.5)
  init = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(program.init_state().train.params))]
  state, _ = _run(program, steps)
  got = jax.device_get(program.flush(state).train.params)
  program.close()
  want = _reference(init, steps, (BATCH,), scale=0.5)
  for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-5, atol=1e-6)
  one = _reference(init, steps, (BATCH,))
  assert not all(np.allclose(a, b, rtol=1e-5, atol=1e-6)
                 for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(want), strict=True))


def test_the_estimate_is_own_or_int8_and_bad_names_are_one_line(task):
  with pytest.raises(ConfigError, match=r"^unknown all-reduce scheduler estimate 'int4'; "
                                        r'choose one of: own, int8$'):
    OverlapTrainer(task, OPTIMIZER, BATCH, estimate='int4')
  with pytest.raises(ConfigError, match=r"^unknown parallelism.overlap_estimate 'x'"):
    ParallelismConfig(overlap_estimate='x')
  program = OverlapTrainer(task, OPTIMIZER, BATCH, estimate='int8')
  assert program.estimate is OverlapEstimate.INT8
  program.close()


@pytest.mark.parametrize('scale', [0, 1.5, -1, True, float('nan')])
def test_the_estimate_scale_is_a_fraction(task, scale):
  with pytest.raises(ConfigError, match=r"^the all-reduce scheduler's estimate_scale must be in "
                                        r'\(0, 1\], got '):
    OverlapTrainer(task, OPTIMIZER, BATCH, estimate_scale=scale)


def test_overlap_state_is_its_abstract_state(task):
  program = OverlapTrainer(task, OPTIMIZER, BATCH)
  got = jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), program.init_state())
  want = jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), program.abstract_state())
  assert got == want
  program.close()


class _BrokenLinks(Links):
  """A link that fails when asked for an all-reduce's time: a failure on the background thread."""

  def all_reduce_s(self, workers, nbytes):
    raise RuntimeError('link down')


def test_a_failure_on_the_background_thread_surfaces_at_the_step(task):
  program = OverlapTrainer(task, OPTIMIZER, BATCH, host=LinkedHost(_BrokenLinks.none(1), 0))
  state = program.init_state()
  state, _ = program.step(state, Work(0, program.global_batch_at(0)), (BATCH,))  # no reduction
  start = time.monotonic()
  with pytest.raises(RuntimeError, match='link down'):
    program.step(state, Work(1, program.global_batch_at(1)), (BATCH,))
  program.close()
  assert not program._background.busy and time.monotonic() - start < 30


def test_overlap_refuses_gradients_split_inside_a_worker(task):
  with pytest.raises(ConfigError) as error:
    OverlapTrainer(task, OPTIMIZER, BATCH, (4, 2), Strategy.HYBRID.rules())
  message = str(error.value)
  assert '\n' not in message and 'strategy hybrid splits' in message, message


def test_leaves_split_only_over_axes_of_size_one_travel_in_the_fused_buffer():
  """Hybrid rules on one-device workers name the 'model' axis, but it has size 1: those leaves
  are replicated inside the worker and fused (one all-reduce), not reduced one by one."""
  params = {'a': jax.ShapeDtypeStruct((4, 8), jnp.float32),
            'b': jax.ShapeDtypeStruct((8,), jnp.float32),
            'c': jax.ShapeDtypeStruct((8, 2), jnp.float32)}
  specs = {'a': PartitionSpec(None, 'model'), 'b': PartitionSpec(None),
           'c': PartitionSpec(('data', 'model'), None)}
  one = FusedLayout.of(params, specs, head=3, axis_sizes={'data': 1, 'model': 1})
  assert one.fused == (0, 1, 2) and one.separate == () and one.size == 3 + 32 + 8 + 16
  split = FusedLayout.of(params, specs, head=3, axis_sizes={'data': 1, 'model': 2})
  assert split.fused == (1,) and split.separate == (0, 2) and split.separate_bytes == 4 * 48
  # Without sizes, any named axis counts as split (the conservative reading).
  assert FusedLayout.of(params, specs, head=3).separate == (0, 2)


# -- two launched workers ------------------------------------------------------------------------


@pytest.fixture(scope='module')
def launched(tmp_path_factory):
  out = tmp_path_factory.mktemp('overlap') / 'out.json'
  result = launch_local([sys.executable, str(ROOT / 'tests' / 'workers' / 'train_overlap.py'),
                         str(out)], workers=2, timeout=LAUNCH_TIMEOUT, init_timeout=60)
  assert result.returncode == 0, result
  return json.loads(out.read_text())


def _mlp():
  """The task, its graph and its parameters' tree structure, for plain JAX on one device."""
  task = models.make_task('mlp', **KWARGS)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: task.make_model(nnx.Rngs(0)))
  return task, nnx.graphdef(model), jax.tree.structure(nnx.to_pure_dict(nnx.state(model)))


def _int8_sum(grads):
  """Σᵢ of each worker's gradient tree in 8 bits: its leaves, in leaf order, flattened and cut
  into blocks of 256, each scaled by its absmax / 127 and rounded (written out here, apart
  from the program's `quantize_int8`)."""
  leaves = [jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(g)]) for g in grads]
  size = leaves[0].size
  total = 0.0
  for flat in leaves:
    blocks = jnp.pad(flat, (0, -size % 256)).reshape(-1, 256)
    scale = jnp.max(jnp.abs(blocks), axis=1, keepdims=True) / 127.0
    total = total + jnp.round(blocks / jnp.where(scale > 0, scale, 1.0)) * scale
  flat, shapes, out = total.reshape(-1)[:size], [x.shape for x in jax.tree.leaves(grads[0])], []
  for shape in shapes:
    n = int(np.prod(shape))
    out.append(flat[:n].reshape(shape))
    flat = flat[n:]
  return jax.tree.unflatten(jax.tree.structure(grads[0]), out)


def _reference(init, steps, shares, scale=1.0, int8=False):
  """The overlap's recurrence on one device: each worker i computes its partial gradient at its
  own w̃ᵢ; w̃ᵢ ← opt(w, α · gᵢ · X / xᵢ) (α: ``scale``), or with ``int8`` every worker's
  w̃ ← opt(w, α · Σᵢ q(gᵢ)) (q: 8 bits, `_int8_sum`); w ← opt(w, Σᵢ gᵢ)."""
  task, graphdef, treedef = _mlp()
  params = jax.tree.unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in init])

  def update(p, opt_state, g):
    updates, opt_state = OPTIMIZER.update(g, opt_state, p)
    return jax.tree.map(jnp.add, p, updates), opt_state

  @jax.jit
  def step(params, opt_state, tilde, batches):
    grads = [jax.grad(lambda q, b=b: jnp.sum(task.loss(nnx.merge(graphdef, q), b)) / BATCH)(w)
             for w, b in zip(tilde, batches, strict=True)]
    if int8:
      coarse = jax.tree.map(lambda x: x * scale, _int8_sum(grads))
      tilde = [update(params, opt_state, coarse)[0]] * len(grads)
    else:
      tilde = [update(params, opt_state, jax.tree.map(lambda x, r=r: x * scale * BATCH / r, g))[0]
               for g, r in zip(grads, shares, strict=True)]
    return *update(params, opt_state, jax.tree.map(lambda *g: sum(g), *grads)), tilde

  opt_state, tilde = OPTIMIZER.init(params), [params] * len(shares)
  for t in range(steps):
    host = task.data.global_batch(0, t, BATCH)
    params, opt_state, tilde = step(params, opt_state, tilde,
                                    [slice_batch(host, shares, i) for i in range(len(shares))])
  return params


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_links_pad_the_synchronous_all_reduce(launched):
  links = launched['links']
  assert links['modelled_s'] == pytest.approx(0.040)  # link:20:inf, 2 workers: 2 steps of 20 ms
  for timing in links['sync']:
    assert timing['collective_s'] >= links['modelled_s'], timing
    assert timing['iter_s'] >= OVERLAP_HOST_S + links['modelled_s'], timing


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_overlap_hides_the_links_behind_the_next_gradient(launched):
  # The synchronous step waits the links' 40 ms after its compute (the test above); the
  # overlap's reduction runs during the next gradient (40 ms of padded compute), so what it
  # still waits for after its compute is a small part. The exposed wait, not whole steps: the
  # two programs run one after the other, and a machine loaded in one of those phases and not
  # the other (2 test processes on 2 cores) slows its steps' compute, not this wait.
  exposed = np.median([t['collective_s'] for t in launched['links']['overlap'][2:]])
  assert exposed < 0.25 * launched['links']['modelled_s'], exposed


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_overlap_after_a_flush_is_the_plain_recurrence(launched):
  want = _reference(launched['init'], OVERLAP_STEPS, OVERLAP_SHARES)
  got = launched['overlap']
  assert got['reported'] == [0, *range(OVERLAP_STEPS - 1)]
  for got_leaf, want_leaf in zip(got['params'], jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(got_leaf), want_leaf, rtol=1e-4, atol=1e-6)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_overlap_trains_as_well_as_the_synchronous_step(launched):
  task, graphdef, treedef = _mlp()
  held_out = task.data.global_batch(0, OVERLAP_STEPS, BATCH)  # a batch neither run trained on

  def loss(leaves):
    params = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in leaves])
    return float(jnp.mean(task.loss(nnx.merge(graphdef, params), held_out)))

  # The overlap is another trajectory (gradients at w̃): it must end no more than 1% above the
  # synchronous loss (the goal); ending lower is allowed.
  sync, overlap = loss(launched['sync']['params']), loss(launched['overlap']['params'])
  assert overlap <= 1.01 * sync, (overlap, sync)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_the_int8_estimate_follows_its_recurrence_near_the_synchronous_step(launched):
  got = launched['int8']
  assert got['reported'] == [0, *range(OVERLAP_STEPS - 1)]
  want = _reference(launched['init'], OVERLAP_STEPS, OVERLAP_SHARES, int8=True)
  for got_leaf, want_leaf in zip(got['params'], jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(got_leaf), want_leaf, rtol=1e-4, atol=1e-6)
  # One 8-bit exchange puts w̃ within rounding of the exact parameters: far nearer the
  # synchronous run than the worker's own estimate gets.
  sync = [np.asarray(x) for x in launched['sync']['params']]

  def gap(run):
    return max(float(np.max(np.abs(np.asarray(a) - b)))
               for a, b in zip(run['params'], sync, strict=True))

  assert gap(got) < 0.1 * gap(launched['overlap']), (gap(got), gap(launched['overlap']))
  # its bytes: int8 gradients (all but the 1 + 6 × 2 head slots) and a float32 scale a block
  fused = launched['buckets']['fused_size']
  assert got['coarse_bytes'] == (fused - 13) + 4 * -(-(fused - 13) // 256)


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_the_int8_exchange_waits_its_all_gather_on_the_links(launched):
  links = launched['links']
  assert links['gather_s'] == pytest.approx(0.020)   # 2 workers: one ring step of 20 ms
  for timing in links['int8'][1:]:                  # the first step has nothing to exchange
    assert timing['collective_s'] >= links['gather_s'], timing


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_buckets_split_in_leaf_order_and_reduce_exactly_as_one(launched):
  split, one = launched['buckets'], launched['overlap']
  assert one['buckets'] == [[0, split['fused_size']]]
  # The head (1 + 6 x 2 slots) and down's bias (32) first, then down's kernel (64 x 32, 8 KB,
  # over 4 KB: alone), head's bias and kernel and up's bias, then up's kernel (64 x 64).
  assert split['buckets'] == [[0, 45], [45, 2093], [2093, 2487], [2487, 6583]]
  for a, b in zip(split['params'], one['params'], strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # 2 workers: a + b either way
  assert split['losses'][1:] == one['losses'][1:]


def test_partial_gradient_timing_is_a_value():
  # The frozen record a step is assembled from: replacing its start moves step_s only.
  from hetjax.train._partial import PartialGradient
  part = PartialGradient(None, 3, 8, 1.0, 0.1, 0.2, 0.0, 0.05, 0.0, 1.0, True, 1.0)
  moved = dataclasses.replace(part, start=0.5)
  assert part.timing(0, 0.3, 2.0).step_s == 1.0 and moved.timing(0, 0.3, 2.0).step_s == 1.5
  assert part.head_values() == {'busy_s': 0.25, 'load': 1.0, 'sampled': True, 'rows': 8,
                               'compile_s': 0.0, 'ready': 1.0}


@pytest.mark.multiprocess
@pytest.mark.timeout(2 * LAUNCH_TIMEOUT + 60)
def test_train_py_overlap_checkpoints_and_resumes(tmp_path):
  """``--set overlap=True`` under train.py: the scheduler's state (with its pending gradient)
  is checkpointed, and --resume continues the metrics at the next step."""
  def run(steps, *extra):
    command = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp',
               '--mode=shares', '--mesh=1x1', '--strategy=data_parallel', '--set',
               'overlap=True', '--set', 'checkpoint_every=2', '--set', 'global_batch=32',
               f'--steps={steps}', f'--workdir={tmp_path / "run"}', *extra]
    with open(tmp_path / 'log.txt', 'a') as log:
      return launch_local(command, 2, network='link:1:100', timeout=LAUNCH_TIMEOUT,
                          init_timeout=60, stdout=log)

  assert run(4).returncode == 0, (tmp_path / 'log.txt').read_text()[-3000:]
  assert run(6, '--resume').returncode == 0, (tmp_path / 'log.txt').read_text()[-3000:]
  rows = [json.loads(x) for x in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows] == list(range(1, 7))
  summary = json.loads((tmp_path / 'run' / 'summary.json').read_text())
  assert summary['checkpoint_steps'][-1] == 6
