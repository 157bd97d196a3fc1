"""The SchMP executor: a round is one SPMD program over the devices' rows; the scheduler hears
about round t − staleness; schedules are fixed in size and masked."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec

from hetjax import ConfigError
from hetjax.schmp import RoundInfo, Schedule, SchmpProgram, StaticRotation
from hetjax.train import training_steps
from tests.conftest import require_devices


@dataclasses.dataclass
class BlockMeans:
  """A toy app: θⱼ is block j's mean over all rows; a round sets the picked blocks' means
  exactly (partial sums over each device's rows, one psum)."""

  x: np.ndarray
  name: str = 'means'
  config: dict = dataclasses.field(default_factory=dict)

  @property
  def blocks(self) -> int:
    return self.x.shape[1]

  def host_data(self, shards):
    return {'x': self.x}

  def init_params(self, data, axis):
    return {'theta': jnp.zeros(self.blocks, jnp.float32)}

  def param_specs(self, axis):
    return {'theta': PartitionSpec()}

  def round(self, params, shard, blocks, mask, offset, key, axis):
    theta = params['theta']
    means = lax.psum(shard['x'][:, blocks].sum(0), axis) / self.x.shape[0]
    delta = jnp.where(mask, means - theta[blocks], 0.0)
    return {'theta': theta.at[blocks].add(delta)}, delta

  def objective(self, params, shard, axis):
    return lax.psum(((shard['x'] - params['theta']) ** 2).sum(), axis)


def _app(rows=16, blocks=6):
  x = np.random.default_rng(0).normal(size=(rows, blocks)).astype(np.float32)
  return BlockMeans(x)


class Cycle:
  """Picks blocks in order, ``per`` a round, into a schedule of ``size`` slots."""

  name = 'cycle'

  def __init__(self, blocks, per, size):
    self.blocks, self.per, self.size = blocks, per, size
    self.heard = []

  def init(self):
    return {'next': 0}

  def update(self, state, stats):
    if stats is not None:
      self.heard.append(stats.local)
    start = state['next']
    picked = [(start + i) % self.blocks for i in range(self.per)]
    return Schedule.of(picked, self.size), {'next': start + self.per}


@pytest.mark.parametrize('devices', [1, 4])
def test_rounds_set_exactly_the_picked_blocks(devices):
  app = _app()
  program = SchmpProgram(app, 4, require_devices(devices), staleness=0)
  policy = Cycle(app.blocks, per=3, size=4)  # one slot masked every round
  infos = list(training_steps(program, program.init_state(), 2, policy=policy))
  theta = np.asarray(infos[-1].state.params['theta'])
  np.testing.assert_allclose(theta, app.x.mean(0), rtol=1e-6, atol=1e-7)
  best = ((app.x - app.x.mean(0)) ** 2).sum()
  assert float(infos[-1].stats.loss) == pytest.approx(best, rel=1e-5)
  # Round 0 moved blocks 0, 1, 2 from 0 to their means; the masked slot moved nothing.
  first = policy.heard[0]
  assert isinstance(first, RoundInfo) and first.round == 0
  np.testing.assert_allclose(first.delta[:3], app.x.mean(0)[:3], rtol=1e-6)
  assert first.delta[3] == 0.0


@pytest.mark.parametrize('staleness', [0, 1, 2])
def test_the_scheduler_hears_of_round_t_minus_staleness(staleness):
  app = _app()
  program = SchmpProgram(app, 2, require_devices(2), staleness=staleness)
  policy = Cycle(app.blocks, per=2, size=2)
  list(training_steps(program, program.init_state(), 5, policy=policy))
  heard = [None if info is None else info.round for info in policy.heard]
  assert heard == [None] * staleness + list(range(5 - staleness))


def test_objective_every_k_rounds_and_the_state_counts_rounds():
  app = _app()
  program = SchmpProgram(app, 2, require_devices(2), objective_every=2)
  infos = list(training_steps(program, program.init_state(), 4,
                              policy=Cycle(app.blocks, 2, 2)))
  losses = [float(i.stats.loss) for i in infos]
  assert np.isnan(losses[0]) and np.isnan(losses[2]) and np.isfinite(losses[1])
  assert int(infos[-1].state.step) == 4
  assert [i.stats.rows for i in infos] == [(16,)] * 4


def test_abstract_state_matches_and_bad_input_is_one_line():
  app = _app()
  program = SchmpProgram(app, 2, require_devices(2))
  abstract = program.abstract_state()
  assert abstract.params['theta'].shape == (6,) and abstract.step.dtype == jnp.int32
  with pytest.raises(ConfigError, match='schedule size must be an integer >= 1, got 0'):
    SchmpProgram(app, 0, require_devices(2))
  with pytest.raises(ConfigError, match='staleness must be an integer >= 0'):
    SchmpProgram(app, 2, require_devices(2), staleness=-1)
  with pytest.raises(ConfigError, match='data of \\[15\\] rows cannot be split evenly over 2'):
    SchmpProgram(_app(rows=15), 2, require_devices(2))
  state = program.init_state()
  with pytest.raises(ConfigError, match='schedule of 3 slots for a program of 2'):
    program.step(state, __import__('hetjax').core.Work(0, {}), Schedule.of([0], 3))


def test_a_static_rotation_shifts_by_one_block_a_round_and_resumes():
  policy = StaticRotation(3)
  state = policy.init()
  offsets = []
  schedule, state = policy.update(state, None)
  for step in range(4):
    offsets.append(schedule.offset)
    stats = type('S', (), {'step': step})()
    schedule, state = policy.update(state, stats)
  assert offsets == [0, 1, 2, 0] and state == {'round': 4}
  again, _ = policy.update({'round': 4}, None)  # a resumed run continues the rotation
  assert again.offset == 1 and again.mask.all()
  with pytest.raises(ConfigError, match='at least one block'):
    StaticRotation(0)


def test_a_restored_state_tells_the_scheduler_what_the_uninterrupted_run_would(tmp_path):
  """The rounds not yet reported (staleness 2) are in the state: a run checkpointed after
  round 3 and resumed hears of rounds 2 and 3 next, as the uninterrupted run does."""
  from hetjax.checkpoint import Checkpointer

  app = _app()
  program = SchmpProgram(app, 2, require_devices(2), staleness=2)
  whole = Cycle(app.blocks, per=2, size=2)
  list(training_steps(program, program.init_state(), 6, policy=whole))
  first = Cycle(app.blocks, per=2, size=2)
  infos = list(training_steps(program, program.init_state(), 4, policy=first))
  ckpt = Checkpointer(tmp_path / 'ckpt')
  ckpt.save(infos[-1].state, {'step': 4}, infos[-1].policy_state)
  ckpt.wait()
  state, _ = ckpt.restore(program.abstract_state())
  second = Cycle(app.blocks, per=2, size=2)
  list(training_steps(program, state, 6, policy=second, policy_state=infos[-1].policy_state))
  rounds = [None if i is None else (i.round, i.schedule.picked.tolist(), i.delta.tolist())
            for i in first.heard + second.heard]
  assert rounds == [None if i is None else (i.round, i.schedule.picked.tolist(),
                                            i.delta.tolist()) for i in whole.heard]
  assert [r[0] for r in rounds[2:]] == [0, 1, 2, 3]
  ckpt.close()
