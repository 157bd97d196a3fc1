"""Pipeline parallelism: a model's chain of sub-models cut into stages that pass micro-batches on.

`split_stages` cuts the chain into contiguous stages of the least bottleneck
(`hetjax.planner.profile_split` does it on the planner's measured costs); `gpipe` and
`one_f_one_b` build the order in which each stage runs its forward and backward passes, as data
(`Schedule` of `Action`s) that `Schedule.validate` checks and `time_schedule` times. A model that
implements `HasChain` (its `Link`s in forward order and a ``chain_loss``) can be trained by
`PipelineTrainer`, which runs such a schedule on one device group per stage (in this process or
across processes), with the same gradients as the unpipelined model.

Replicas (SDPipe): `GroupAverager` averages one stage's parameters over a group of replica
processes; `GroupScheduler` (SDPipe's rules) and the baselines (`AllReducePolicy`,
`RandomPairsPolicy`, `PeriodicAveragePolicy`) decide the groups. Their state is a value
(`SyncValuePolicy`: ``init`` / ``update(state, event) -> (groups, state)``), saved in
checkpoints. `simulate_sync` runs the policies on the virtual clock. On real workers,
`SyncService` runs a policy on worker 0 over the coordination channel, each replica's
`ReplicaDriver` trains its pipeline, reports each step with its `SyncClient` and averages within
the groups it is given; `HostPause` pads its steps to its emulated host (`--slowdown`'s trace).
In `hetjax.train.training_steps`, `ReplicaSync` is the loop's policy (the scheduler's state in
every checkpoint) and `ReplicaCheckpointer` saves each replica on its own.
"""

from hetjax.pipeline._chain import HasChain as HasChain
from hetjax.pipeline._chain import Link as Link
from hetjax.pipeline._executor import PipelineState as PipelineState
from hetjax.pipeline._executor import PipelineTrainer as PipelineTrainer
from hetjax.pipeline._groups import GroupRules as GroupRules
from hetjax.pipeline._groups import GroupScheduler as GroupScheduler
from hetjax.pipeline._groups import SyncGroup as SyncGroup
from hetjax.pipeline._injection import HostPause as HostPause
from hetjax.pipeline._injection import replica_trace as replica_trace
from hetjax.pipeline._policies import RENAMED_SYNC_NAMES as RENAMED_SYNC_NAMES
from hetjax.pipeline._policies import AllReducePolicy as AllReducePolicy
from hetjax.pipeline._policies import PeriodicAveragePolicy as PeriodicAveragePolicy
from hetjax.pipeline._policies import RandomPairsPolicy as RandomPairsPolicy
from hetjax.pipeline._policies import SDPipePolicy as SDPipePolicy
from hetjax.pipeline._policies import SyncName as SyncName
from hetjax.pipeline._policies import SyncPolicy as SyncPolicy
from hetjax.pipeline._policies import make_sync_policy as make_sync_policy
from hetjax.pipeline._policies import parse_sync_name as parse_sync_name
from hetjax.pipeline._replica_run import ReplicaCheckpointer as ReplicaCheckpointer
from hetjax.pipeline._replica_run import ReplicaSync as ReplicaSync
from hetjax.pipeline._replicas import GroupAverager as GroupAverager
from hetjax.pipeline._replicas import consensus_distance as consensus_distance
from hetjax.pipeline._replicated import ReplicaDriver as ReplicaDriver
from hetjax.pipeline._replicated import ReplicaStep as ReplicaStep
from hetjax.pipeline._replicated import ServiceThread as ServiceThread
from hetjax.pipeline._replicated import start_service as start_service
from hetjax.pipeline._schedule import Action as Action
from hetjax.pipeline._schedule import Schedule as Schedule
from hetjax.pipeline._schedule import SimResult as SimResult
from hetjax.pipeline._schedule import gpipe as gpipe
from hetjax.pipeline._schedule import one_f_one_b as one_f_one_b
from hetjax.pipeline._schedule import time_schedule as time_schedule
from hetjax.pipeline._split import split_stages as split_stages
from hetjax.pipeline._stage_checkpoint import StageCheckpointer as StageCheckpointer
from hetjax.pipeline._stage_pace import ActionPace as ActionPace
from hetjax.pipeline._stage_pace import StagePace as StagePace
from hetjax.pipeline._stage_pace import roofline_costs as roofline_costs
from hetjax.pipeline._stage_programs import StagePrograms as StagePrograms
from hetjax.pipeline._stage_programs import dispatch_order as dispatch_order
from hetjax.pipeline._stages import StageLayout as StageLayout
from hetjax.pipeline._stages import equal_stages as equal_stages
from hetjax.pipeline._sync_service import ServiceReport as ServiceReport
from hetjax.pipeline._sync_service import SyncClient as SyncClient
from hetjax.pipeline._sync_service import SyncService as SyncService
from hetjax.pipeline._sync_values import Arrive as Arrive
from hetjax.pipeline._sync_values import Leave as Leave
from hetjax.pipeline._sync_values import SyncValuePolicy as SyncValuePolicy
from hetjax.pipeline._sync_values import Tick as Tick
from hetjax.pipeline._sync_values import resume_state as resume_state
from hetjax.pipeline._virtual_sdpipe import SyncRun as SyncRun
from hetjax.pipeline._virtual_sdpipe import simulate_sync as simulate_sync

__all__ = [
    'RENAMED_SYNC_NAMES',
    'Action',
    'ActionPace',
    'AllReducePolicy',
    'Arrive',
    'GroupAverager',
    'GroupRules',
    'GroupScheduler',
    'HasChain',
    'HostPause',
    'Leave',
    'Link',
    'PeriodicAveragePolicy',
    'PipelineState',
    'PipelineTrainer',
    'RandomPairsPolicy',
    'ReplicaCheckpointer',
    'ReplicaDriver',
    'ReplicaStep',
    'ReplicaSync',
    'SDPipePolicy',
    'Schedule',
    'ServiceReport',
    'ServiceThread',
    'SimResult',
    'StageCheckpointer',
    'StageLayout',
    'StagePace',
    'StagePrograms',
    'SyncClient',
    'SyncGroup',
    'SyncName',
    'SyncPolicy',
    'SyncRun',
    'SyncService',
    'SyncValuePolicy',
    'Tick',
    'consensus_distance',
    'dispatch_order',
    'equal_stages',
    'gpipe',
    'make_sync_policy',
    'one_f_one_b',
    'parse_sync_name',
    'replica_trace',
    'resume_state',
    'roofline_costs',
    'simulate_sync',
    'split_stages',
    'start_service',
    'time_schedule',
]
