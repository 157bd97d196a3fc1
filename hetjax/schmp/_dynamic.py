"""`DynamicScheduler`: SchMP's dynamic schedule for coordinate descent (Lasso, logistic
regression), as a policy value.

These rules make parallel coordinate descent both fast and safe (priority from the last
change and the dependency check are STRADS's, Kim et al.):

* **Priority.** Coordinates that moved a lot last time are likely to move again, and most of
  a sparse model's coordinates stay at zero: updating those is wasted work. Each coordinate
  keeps a weight wⱼ = |Δβⱼ| from its last update (or (Δβⱼ)² + η, `Priority.SQUARED`), and a
  round's candidates are drawn without replacement with probability ∝ wⱼ + ε; ε keeps every
  coordinate reachable (a coordinate at zero can become worth moving when others change).
  During the first ``warmup`` rounds nothing is known yet and candidates are drawn uniformly.
* **Current priority** (``Priority.CURRENT``, the apps' default; ours, not STRADS's). A last
  |Δβⱼ| is a stale guess of what coordinate j would move now: it stays high for a coordinate
  just minimised and low for one whose correlated partners moved since. With ``CURRENT`` the
  round itself reports, for every coordinate, the |Δβⱼ| its step would take from the β the
  round left (one more `lax.psum`, of d partial sums: Xᵀr over each device's rows), and
  those are the weights: Gauss–Southwell's rule, drawn and dependency-checked as above. The
  report is ``staleness`` rounds old when it arrives; the coordinates picked by the rounds
  decided since (the state remembers the last `IN_FLIGHT`) get weight 0 — their update is
  under way. No warm-up is needed. On the correlated designs of bench_schmp it reaches the
  target in about a tenth of the rounds that ``ABS`` needs; each round costs one pass over X
  more.
* **Dependency check.** Two coordinates updated at once from the same β both correct the part
  of the residual they share, and when their columns correlate they overshoot it together
  (Shotgun diverges this way). Candidates are taken in order of weight (draw order in the
  warm-up) and one is accepted only if |corr(xⱼ, xₖ)| < θ for every k already accepted this
  round, until the schedule's slots are full. Weights below ε count as equal and keep their
  random draw order: otherwise a converged coordinate whose float32 updates still jitter by
  1e-8 would always go before one that stayed at zero, and when the candidates are all d
  coordinates (small d) a coordinate correlated with every other could never be accepted.
* **Unknown first.** A coordinate never updated has no weight yet (+inf in the state): after
  the warm-up such coordinates are drawn before every other, in random order, and accepted
  first, so each coordinate is updated once before priorities decide (a first sweep, of d /
  accepted-per-round rounds). With weight 0 instead, one that the warm-up's dependency checks
  happened to skip would be drawn with probability ∝ ε only, and a coordinate of the
  optimum's support could wait thousands of rounds (L1 logistic regression on breast_cancer
  at θ = 0.3: one never picked in 3000 rounds).

Only the candidates' pairwise correlations are computed, on the host, by the app's
``correlations(blocks)`` (a ``c × c`` block of XᵀX from the host copy of X: c² · n flops with
c = 2 × the schedule size by default, whatever d is — 10⁵ features cost what 10³ do, apart
from the O(d) draw).

The state is the round whose schedule is decided, the weights (float64[d], +inf where
unknown) and the last rounds' picks; the round's randomness is a generator seeded by ``(seed, round)``, so a resumed run
draws exactly what the uninterrupted one would have, with no generator state to save.

Example::

  >>> corr = lambda blocks: np.where(blocks[:, None] // 2 == blocks[None] // 2, 0.9, 0.0)
  >>> policy = DynamicScheduler(blocks=8, size=4, correlations=corr, warmup=0)
  >>> schedule, state = policy.update(policy.init(), None)
  >>> sorted(int(j) // 2 for j in schedule.picked)      # one of each correlated pair
  [0, 1, 2, 3]
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Protocol

import numpy as np

from hetjax._errors import ConfigError, parse_choice
from hetjax.core import StepStats
from hetjax.schmp._schedule import RoundInfo, Schedule


class Correlations(Protocol):
  """``|corr(x_j, x_k)|`` for every pair of ``blocks`` (int[c]): float[c, c]."""

  def __call__(self, blocks: np.ndarray) -> np.ndarray: ...


class Priority(enum.Enum):
  """A coordinate's weight: from its last change, ``ABS`` |Δβ| (STRADS's code) or ``SQUARED``
  (Δβ)² + η (the paper's form); or ``CURRENT``, the |Δβ| its update would make now, for every
  coordinate, which the round computes (`RoundInfo.priority`; module docstring)."""

  ABS = 'abs'
  SQUARED = 'squared'
  CURRENT = 'current'

#: rounds in flight whose picks a ``CURRENT`` scheduler remembers (the staleness it covers)
IN_FLIGHT = 4


@dataclasses.dataclass(frozen=True)
class DynamicScheduler:
  """Priority-sampled, dependency-checked coordinates per round (module docstring).

  Args:
    blocks: how many coordinates (d).
    size: the schedule's slots (the most coordinates accepted in a round).
    correlations: the app's `Correlations` of candidate columns.
    seed: the draws' randomness (with the round number).
    theta: two coordinates whose |corr| is θ or more never share a round.
    warmup: rounds of uniform candidates before the weights are used (None: 10, or 0 with
      ``CURRENT``, whose weights are exact from the first report).
    candidates: how many are drawn per round (default: twice ``size``, at most ``blocks``).
    epsilon: added to every weight when drawing.
    priority: `Priority` (``'abs'``, ``'squared'`` or ``'current'``).
    eta: η of ``SQUARED`` (ignored by ``ABS``).

  Raises:
    ConfigError: sizes below 1, θ outside (0, 1], a negative warm-up, ε or η, fewer
      candidates than slots, a weight that can be 0 (ε = 0, and η = 0 or ``ABS``).
  """

  blocks: int
  size: int
  correlations: Correlations
  seed: int = 0
  theta: float = 0.1
  warmup: int | None = None
  candidates: int | None = None
  epsilon: float = 1e-4
  priority: Priority | str = Priority.ABS
  eta: float = 0.0
  name: str = 'schmp'

  def __post_init__(self):
    object.__setattr__(self, 'priority', parse_choice(Priority, self.priority, 'priority'))
    if self.warmup is None:
      object.__setattr__(self, 'warmup', 0 if self.priority is Priority.CURRENT else 10)
    if self.blocks < 1 or self.size < 1:
      raise ConfigError(f'a dynamic schedule needs blocks and size >= 1, got {self.blocks} '
                        f'and {self.size}')
    if not 0 < self.theta <= 1:
      raise ConfigError(f'theta must be in (0, 1], got {self.theta}')
    if self.warmup < 0 or self.epsilon < 0 or self.eta < 0:
      raise ConfigError(f'warmup, epsilon and eta must be >= 0, got {self.warmup}, '
                        f'{self.epsilon} and {self.eta}')
    if self.candidates is not None and self.candidates < min(self.size, self.blocks):
      raise ConfigError(f'{self.candidates} candidates cannot fill {self.size} slots')
    eta = self.eta if self.priority is Priority.SQUARED else 0.0
    if self.epsilon + eta == 0:
      raise ConfigError(f'epsilon must be > 0 with priority {self.priority.value}'
                        f'{" and eta 0" if self.priority is Priority.SQUARED else ""}: a '
                        'coordinate that stayed put would never be drawn again')

  @property
  def drawn(self) -> int:
    """Candidates per round."""
    return min(self.blocks, self.candidates or 2 * self.size)

  def init(self) -> dict[str, Any]:
    """The round to decide, the weights (+inf: unknown), and the picks of the last
    `IN_FLIGHT` rounds decided (row r mod `IN_FLIGHT`, -1 padded; their rounds, -1: none)."""
    return {'round': 0, 'weights': np.full(self.blocks, np.inf),
            'picks': np.full((IN_FLIGHT, self.size), -1, np.int64),
            'picked_round': np.full(IN_FLIGHT, -1, np.int64)}

  def update(self, state: dict[str, Any], stats: StepStats | None
             ) -> tuple[Schedule, dict[str, Any]]:
    """Learns from ``stats.local`` (a `RoundInfo`, or None while the staleness hides the first
    rounds) and decides the next round; ``stats=None`` decides ``state['round']`` again."""
    weights = state['weights']
    picks, picked_round = np.array(state['picks']), np.array(state['picked_round'])
    if stats is None:
      following = state['round']
    else:
      following = int(stats.step) + 1
      if isinstance(stats.local, RoundInfo):
        weights = self.learn(weights, stats.local, picks[picked_round > stats.local.round])
    schedule = self.schedule(following, weights)
    row = following % IN_FLIGHT
    picks[row], picked_round[row] = -1, following
    picks[row, :schedule.picked.size] = schedule.picked
    return schedule, {'round': following, 'weights': weights, 'picks': picks,
                      'picked_round': picked_round}

  def learn(self, weights: np.ndarray, info: RoundInfo,
            in_flight: np.ndarray | None = None) -> np.ndarray:
    """``weights`` after round ``info.round``: its coordinates re-weighted by their change
    (``ABS``, ``SQUARED``), or every weight the round's ``priority`` (``CURRENT``), those of
    the coordinates picked by rounds still in flight (``in_flight``, -1 padded) set to 0: their
    update is under way, and what they would still move is not known yet."""
    weights = np.array(weights, np.float64)
    if self.priority is Priority.CURRENT:
      if info.priority is None:
        raise ConfigError('priority current needs rounds that report every coordinate\'s '
                          'priority (a coordinate app made with priority=\'current\')')
      weights = np.abs(np.asarray(info.priority, np.float64))
      if in_flight is not None:
        weights[in_flight[in_flight >= 0]] = 0.0
      return weights
    delta = np.asarray(info.delta, np.float64)[info.schedule.mask]
    if self.priority is Priority.ABS:
      weights[info.schedule.picked] = np.abs(delta)
    else:
      weights[info.schedule.picked] = delta**2 + self.eta
    return weights

  def schedule(self, round_: int, weights: np.ndarray) -> Schedule:
    """Round ``round_``'s coordinates: drawn, ordered, dependency-checked."""
    order = self.ranked_candidates(round_, weights)
    return Schedule.of(self.accept(order), self.size)

  def ranked_candidates(self, round_: int, weights: np.ndarray) -> np.ndarray:
    """The round's candidates, in the order they are considered."""
    rng = np.random.default_rng([self.seed, round_])
    warm = round_ < self.warmup
    # Exponential keys E / weight: the c smallest are a draw without replacement ∝ weight
    # (Efraimidis & Spirakis), in one O(d) pass; their order is the draw order. An unknown
    # coordinate's key −1/E is below every other, and its order among them random.
    keys = rng.exponential(size=self.blocks)
    if not warm:
      unknown = np.isinf(weights)
      with np.errstate(divide='ignore'):
        keys = np.where(unknown, -1 / keys,
                        keys / np.where(unknown, 1.0, weights + self.epsilon))
    c = self.drawn
    drawn = np.argpartition(keys, c - 1)[:c] if c < self.blocks else np.arange(self.blocks)
    drawn = drawn[np.argsort(keys[drawn], kind='stable')]
    if not warm:  # by weight; weights below ε tie (float noise must not outrank a zero)
      drawn = drawn[np.argsort(-np.maximum(weights[drawn], self.epsilon), kind='stable')]
    return drawn

  def accept(self, order: np.ndarray) -> np.ndarray:
    """The greedy dependency check: ``order``'s coordinates kept while each one's |corr|
    with every one kept before it is below θ, at most ``size``."""
    conflicts = (np.asarray(self.correlations(order)) >= self.theta).tolist()
    kept: list[int] = []
    for i, row in enumerate(conflicts):
      if not any(row[k] for k in kept):
        kept.append(i)
        if len(kept) == self.size:
          break
    return order[kept]
