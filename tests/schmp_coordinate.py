"""What the Lasso and logistic-regression tests share: one app and one compiled program per
(data, devices), a scheduler that replays given schedules, and a run's objective curve."""

import numpy as np
import pytest

from hetjax.core import Work
from hetjax.schmp import Schedule, SchmpProgram, make_app
from hetjax.train import training_steps
from tests.conftest import require_devices

# 64 coordinates, half of them one group of columns correlating 0.9: Shotgun's P* ≈ d / ρ(XᵀX/n)
# = 64 / (1 + 31 · 0.9) ≈ 2.2, so 32 slots are far past it.
DESIGN = {'rows': 256, 'features': 64, 'groups': 1, 'group_size': 32, 'rho': 0.9}
SIZE = 32
U = np.finfo(np.float32).eps / 2  # float32's unit roundoff


class Programs:
  """The app ``name`` on `DESIGN` or on bundled data (rows padded), and its programs
  (staleness 0: exact; objective every 10 rounds), each made once."""

  def __init__(self, name):
    self.name, self._apps, self._programs = name, {}, {}

  def app(self, data='synthetic'):
    if data not in self._apps:
      self._apps[data] = (make_app(self.name, **DESIGN) if data == 'synthetic' else
                          make_app(self.name, data=data, pad_rows=True))
    return self._apps[data]

  def program(self, devices, data='synthetic'):
    """``(app, program)`` on ``devices`` devices: `SIZE` slots, or one per coordinate on
    bundled data."""
    key = (data, devices)
    if key not in self._programs:
      app = self.app(data)
      size = SIZE if data == 'synthetic' else app.blocks
      self._programs[key] = SchmpProgram(app, size, require_devices(devices), staleness=0,
                                         objective_every=10)
    return self.app(data), self._programs[key]


class Replay:
  """Round t runs ``schedules[t mod len]``: the same schedules whatever the devices computed."""

  name = 'replay'

  def __init__(self, schedules):
    self.schedules = schedules

  def init(self):
    return {'round': 0}

  def update(self, state, stats):
    following = state['round'] if stats is None else int(stats.step) + 1
    return self.schedules[following % len(self.schedules)], {'round': following}


def run(program, policy, rounds):
  """``(objective every 10 rounds, β after the last)``."""
  losses, beta = [], None
  for info in training_steps(program, program.init_state(), rounds, policy=policy):
    if info.step % 10 == 0:
      losses.append(float(info.stats.loss))
    beta = info.state.params['beta']
  return np.array(losses), np.asarray(beta)


def check_rounds_against_numpy(app, program, numpy_round, row_state, seed):
  """Three rounds (from β = 0, then twice from β ≠ 0; a masked slot each time) against
  ``numpy_round(app, β, per-row state, schedule) -> (Δβ, β, per-row state, bound)`` in float64
  from the device's own values: Δβ within the float32 ``bound``, β and the per-row state
  within what that bound and float32 rounding allow, the objective the host's."""
  x = app.design.x.astype(np.float64)
  rng = np.random.default_rng(seed)
  state = program.init_state()
  for step in range(3):
    schedule = Schedule.of(rng.choice(app.blocks, SIZE - 1, replace=False), SIZE)
    beta = np.asarray(state.params['beta'], np.float64)
    rows = np.asarray(state.params[row_state], np.float64)
    delta, new, moved, bound = numpy_round(app, beta, rows, schedule)
    state, stats = program.step(state, Work(step, {}), schedule)
    got = stats.local.delta
    assert got[-1] == 0.0                                     # the masked slot
    assert np.all(np.abs(got[:-1] - delta) <= bound), np.max(np.abs(got[:-1] - delta) / bound)
    assert np.count_nonzero(delta) > 0
    np.testing.assert_allclose(np.asarray(state.params['beta']), new, rtol=0,
                               atol=float(bound.max() + 4 * U * np.abs(new).max()))
    # X_J Δβ: Δβ's error times |X_J|, plus float32 rounding of the products and sums.
    rows_bound = np.abs(x[:, schedule.picked]) @ (bound + (SIZE + 2) * U * np.abs(delta))
    rows_bound += 2 * U * np.abs(rows)
    assert np.all(np.abs(np.asarray(state.params[row_state]) - moved) <= rows_bound)
    # The objective it reports is recomputed from β: the host's float64 one, to float32.
    loss = float(program.objective(state))
    assert loss == pytest.approx(app.objective_at(np.asarray(state.params['beta'])), rel=1e-5)
