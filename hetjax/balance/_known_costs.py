"""`KnownCosts`: what the job's hosts and links are known to cost, the one input of the policies
that plan from costs instead of measuring them.

Most policies learn speeds from the steps they see. Two take what is known in advance through
their constructors, and `make_policy` hands it to them from one value: `Oracle` plans each step
from every worker's true cost (per-row and fixed seconds, times the trace's slowdown), and
`LBBSP` starts its fixed fraction φ from the hosts' fixed and per-row costs and balances compute
plus each worker's own transfer. A run fills it from its emulated hosts and links
(`hetjax.run`); a benchmark from the costs it declared.

Example: hosts of 2 ms a row and 10 ms a step, worker 0 with two devices among one-device
workers (twice as fast per row)::

  >>> known = KnownCosts(row_s=2e-3, fixed_s=0.01, devices=(2, 1, 1))
  >>> known.worker_row_s()
  (0.001, 0.002, 0.002)
  >>> round(known.fixed_fraction(ShareRules(global_batch=40, workers=3)), 6)  # 10 / (10 + 20)
  0.333333
"""

from __future__ import annotations

import dataclasses

from hetjax._errors import ConfigError
from hetjax.core import ShareRules


@dataclasses.dataclass(frozen=True)
class KnownCosts:
  """What the hosts and links are known to cost (module docstring); the defaults know nothing.

  Attributes:
    row_s: seconds per row at slowdown 1: one value for every worker (a worker of the fewest
      devices', scaled by ``devices`` for the others), or one per worker; None: unknown.
    fixed_s: seconds per step whatever the rows, at slowdown 1.
    devices: each worker's device count (devices of equal speed: a worker of k devices is
      k / min(devices) as fast per row); empty: workers alike.
    transfer_s: each worker's own transfer a step, seconds, which no slowdown stretches (its
      link's exchange of the step's gradient); empty: none.
  """

  row_s: float | tuple[float, ...] | None = None
  fixed_s: float = 0.0
  devices: tuple[int, ...] = ()
  transfer_s: tuple[float, ...] = ()

  def worker_row_s(self) -> float | tuple[float, ...] | None:
    """Each worker's seconds per row at slowdown 1 (`Oracle`'s ``row_s``): ``row_s`` scaled by
    ``devices`` where given, else as it is."""
    if not self.devices or self.row_s is None:
      return self.row_s
    fewest = min(self.devices)
    return tuple(self._one_row_s() * fewest / k for k in self.devices)

  def fixed_fraction(self, rules: ShareRules) -> float:
    """φ of a uniform share (`LBBSP`'s ``fixed_fraction``): the fixed cost over the step of a
    uniform share of a worker of the fewest devices, fixed plus rows × row cost; 0 when the row
    cost is unknown (time ∝ rows)."""
    if self.row_s is None:
      return 0.0
    devices = self.devices or (1,) * rules.workers
    row = self._one_row_s() * rules.global_batch / sum(devices) * min(devices)
    return self.fixed_s / (self.fixed_s + row) if self.fixed_s + row > 0 else 0.0

  def _one_row_s(self) -> float:
    if isinstance(self.row_s, tuple):
      raise ConfigError(f'known costs: one row cost per worker {self.row_s} gives no fixed '
                        'fraction and takes no device counts: give one row_s (and devices)')
    return self.row_s
