"""The virtual clock: share, token and sync policies on modelled hosts, no devices.

`simulate_shares` drives a share policy (the same value `train.training_steps` drives on real
workers) against a slowdown trace and a `ClockCosts` model; `simulate_tokens` does the same for
Fela's token pulling; `simulate_sync` runs one pipeline stage's replicas under a sync policy
(`hetjax.replicas.SyncPolicy`) as a discrete-event simulation (`SyncRun`). Every time they
report is virtual (modelled), never measured. A pipeline schedule's makespan is
`hetjax.pipeline.time_schedule`.

`simulate_local` is `simulate_shares`' sibling for local SGD (DiLoCo): rounds of H inner steps
on each worker's share of the global batch with no communication, then one exchange of the model
(`ClockCosts.grad_bytes`) a round, with the share policy asked once a round and an optional
cutoff that stops a worker's round at a multiple of the last round's median busy time
(`LocalRun`: per-round shares, rows done, busy and round times, the bytes a worker sends per
inner step). With one inner step a round it is `simulate_shares`' BSP clock.

`simulate_comm` trains a `CommProblem` (`LeastSquares`, or any task's model as a `TaskProblem`)
by a parameter-server or all-reduce communication `Scheme` on modelled links
(`hetjax.emulation.Links`), 1…1024 workers, and `iteration_s` is each scheme's closed-form
iteration time.
"""

from hetjax.simulation._local import LocalRun as LocalRun
from hetjax.simulation._local import simulate_local as simulate_local
from hetjax.simulation._shares import ClockCosts as ClockCosts
from hetjax.simulation._shares import VirtualRun as VirtualRun
from hetjax.simulation._shares import simulate_shares as simulate_shares
from hetjax.simulation._sync import SyncRun as SyncRun
from hetjax.simulation._sync import simulate_sync as simulate_sync
from hetjax.simulation._tokens import simulate_tokens as simulate_tokens

__all__ = ['ClockCosts', 'LocalRun', 'SyncRun', 'VirtualRun', 'simulate_local', 'simulate_shares',
           'simulate_sync', 'simulate_tokens']
from hetjax.simulation._comm import CommRun as CommRun
from hetjax.simulation._comm import simulate_comm as simulate_comm
from hetjax.simulation._comm_problem import CommProblem as CommProblem
from hetjax.simulation._comm_problem import LeastSquares as LeastSquares
from hetjax.simulation._comm_schemes import Scheme as Scheme
from hetjax.simulation._comm_schemes import iteration_s as iteration_s
from hetjax.simulation._task_problem import TaskProblem as TaskProblem

__all__ += ['CommProblem', 'CommRun', 'LeastSquares', 'Scheme', 'TaskProblem', 'iteration_s',
           'simulate_comm']
