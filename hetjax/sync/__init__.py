"""Data-parallel replicas of a pipeline, and the policies that decide which replicas sync (SDPipe).

`GroupAverager` averages one stage's parameters over a group of replica processes;
`GroupScheduler` (SDPipe's rules) and the baselines (`AllReducePolicy`, `RandomPairsPolicy`,
`PeriodicAveragePolicy`), all `SyncPolicy`s from `make_sync_policy`, decide the groups. Their
state is a value (`SyncValuePolicy`: ``init`` / ``update(state, event) -> (groups, state)``),
saved in checkpoints. `hetjax.simulation.simulate_sync` runs the policies on the virtual clock.
On real workers, `SyncService` runs a policy on worker 0 over the coordination channel, each
replica's `ReplicaDriver` trains its `hetjax.pipeline.PipelineTrainer`, reports each step with its
`SyncClient` and averages within the groups it is given; `HostPause` pads its steps to its
emulated host (`--slowdown`'s trace). In `hetjax.train.training_steps`, `ReplicaSync` is the
loop's policy (the scheduler's state in every checkpoint) and `ReplicaCheckpointer` saves each
replica on its own.
"""

from hetjax.sync._averaging import GroupAverager as GroupAverager
from hetjax.sync._averaging import consensus_distance as consensus_distance
from hetjax.sync._driver import ReplicaDriver as ReplicaDriver
from hetjax.sync._driver import ReplicaStep as ReplicaStep
from hetjax.sync._driver import ServiceThread as ServiceThread
from hetjax.sync._driver import start_service as start_service
from hetjax.sync._host_pause import HostPause as HostPause
from hetjax.sync._host_pause import replica_trace as replica_trace
from hetjax.sync._in_loop import ReplicaCheckpointer as ReplicaCheckpointer
from hetjax.sync._in_loop import ReplicaSync as ReplicaSync
from hetjax.sync._policies import RENAMED_SYNC_NAMES as RENAMED_SYNC_NAMES
from hetjax.sync._policies import AllReducePolicy as AllReducePolicy
from hetjax.sync._policies import PeriodicAveragePolicy as PeriodicAveragePolicy
from hetjax.sync._policies import RandomPairsPolicy as RandomPairsPolicy
from hetjax.sync._policies import SDPipePolicy as SDPipePolicy
from hetjax.sync._policies import SyncName as SyncName
from hetjax.sync._policies import SyncPolicy as SyncPolicy
from hetjax.sync._policies import make_sync_policy as make_sync_policy
from hetjax.sync._policies import parse_sync_name as parse_sync_name
from hetjax.sync._scheduler import GroupRules as GroupRules
from hetjax.sync._scheduler import GroupScheduler as GroupScheduler
from hetjax.sync._scheduler import SyncGroup as SyncGroup
from hetjax.sync._service import ServiceReport as ServiceReport
from hetjax.sync._service import SyncClient as SyncClient
from hetjax.sync._service import SyncService as SyncService
from hetjax.sync._values import Arrive as Arrive
from hetjax.sync._values import Leave as Leave
from hetjax.sync._values import SyncValuePolicy as SyncValuePolicy
from hetjax.sync._values import Tick as Tick
from hetjax.sync._values import resume_state as resume_state

__all__ = [
    'RENAMED_SYNC_NAMES',
    'AllReducePolicy',
    'Arrive',
    'GroupAverager',
    'GroupRules',
    'GroupScheduler',
    'HostPause',
    'Leave',
    'PeriodicAveragePolicy',
    'RandomPairsPolicy',
    'ReplicaCheckpointer',
    'ReplicaDriver',
    'ReplicaStep',
    'ReplicaSync',
    'SDPipePolicy',
    'ServiceReport',
    'ServiceThread',
    'SyncClient',
    'SyncGroup',
    'SyncName',
    'SyncPolicy',
    'SyncService',
    'SyncValuePolicy',
    'Tick',
    'consensus_distance',
    'make_sync_policy',
    'parse_sync_name',
    'replica_trace',
    'resume_state',
    'start_service',
]
