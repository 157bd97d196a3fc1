"""When local SGD pays, from the cluster description the planner reads: one exchange of the
model over the workers' links against a step's compute.

Synchronous training (BSP, LB-BSP, the all-reduce scheduler) moves the gradient every step:
a ring all-reduce of the parameters' bytes, 2(n − 1)·α + 2(n − 1)/n · bytes / β on the
cluster's links (`ClusterSpec.link`). Local SGD (``local.inner_steps`` = H,
`hetjax.train.LocalTrainer`) moves it once every H steps. Where the exchange costs about a
step's compute or more, the links decide the run's time, and H spreads one exchange over H
steps; the smallest H that leaves a step at most ``overhead`` of exchange is the advice.

Example::

  >>> from hetjax.planner import ClusterSpec, WorkerSpec
  >>> cluster = ClusterSpec((WorkerSpec(1, 1e12, 1e10),) * 4, alpha_s=1e-3, beta_bytes_per_s=1e8)
  >>> advice = local_sgd_advice(cluster, param_bytes=4e8, step_flops=4e12)
  >>> round(advice.ratio, 3), advice.inner_steps   # 6 ms of latency, 6 s of bytes; 1 s compute
  (6.006, 61)
"""

from __future__ import annotations

import dataclasses
import math

from hetjax.planner._cluster import ClusterSpec

#: The exchange, as a fraction of a step's compute, under which synchronous training is kept.
WORTH_RATIO = 0.5


@dataclasses.dataclass(frozen=True)
class LocalAdvice:
  """One exchange of the model against a step's compute, and the H that hides it.

  Attributes:
    exchange_s: one ring all-reduce of the parameters over every worker's link.
    compute_s: a step's compute, balanced over every device of the cluster (FLOPs over their
      summed FLOP/s): the time no policy beats.
    inner_steps: the smallest H whose exchange a step is at most ``overhead`` × ``compute_s``.
    overhead: that fraction.
  """

  exchange_s: float
  compute_s: float
  inner_steps: int
  overhead: float

  @property
  def ratio(self) -> float:
    """Exchange over compute."""
    return self.exchange_s / self.compute_s

  @property
  def worth_it(self) -> bool:
    """Whether the links take a real part of a synchronous step (`WORTH_RATIO`)."""
    return self.ratio >= WORTH_RATIO

  def describe(self) -> str:
    """One line for ``hetjax-plan``."""
    said = (f'links: one exchange of the model costs {self.ratio:.3g}x a step\'s compute '
            f'({_seconds(self.exchange_s)} against {_seconds(self.compute_s)})')
    if not self.worth_it:
      return said + ': synchronous training keeps the links busy a small part of a step'
    return (said + f': local SGD (--set local.inner_steps={self.inner_steps}) pays it once in '
            f'{self.inner_steps} steps, under {self.overhead:.0%} of a step (docs/local.md)')


def local_sgd_advice(cluster: ClusterSpec, param_bytes: float, step_flops: float,
                     overhead: float = 0.1) -> LocalAdvice:
  """`LocalAdvice` for a model of ``param_bytes`` whose step (forward and backward over the
  global batch) takes ``step_flops``, on ``cluster``."""
  workers = len(cluster.workers)
  exchange = cluster.link(inside_worker=False).ring_all_reduce_s(param_bytes, workers)
  compute = step_flops / sum(w.devices * w.flops_per_s for w in cluster.workers)
  steps = max(1, math.ceil(exchange / (overhead * compute))) if compute > 0 else 1
  return LocalAdvice(exchange, compute, steps, overhead)


def _seconds(x: float) -> str:
  return f'{x:.3g} s' if x >= 1 else f'{1e3 * x:.3g} ms'
