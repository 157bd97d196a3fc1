"""Data-parallel replicas of a pipeline, and the policy that decides which replicas sync (SDPipe).

`SyncPolicy` is the one sync policy a user makes: a value of its settings (``'sdpipe'``, SDPipe's
adaptive groups with bounded staleness, `GroupRules`; or a baseline, ``'all-reduce'``,
``'random-pairs'``, ``'periodic-average'``), with ``init`` / ``on_event(state, event) -> (groups,
state)`` over `Arrive`, `Leave` and `Tick` events; its state is saved in checkpoints
(`resume_state` cuts it at one). ``SyncPolicy.engine(state)`` is the event-driven object that
`SyncService` and `hetjax.simulation.simulate_sync` drive, and `ReplicaPolicy` the
policy `hetjax.train.training_steps` runs for a replica: worker 0 runs the policy's
`SyncService` over the coordination channel and the policy's state goes into every checkpoint.
Each replica's `ReplicaDriver` trains its `hetjax.pipeline.PipelineTrainer`, reports each step
with its `SyncClient` and averages within the groups it is given (`GroupAverager`), padding its
steps to its emulated host (``use_host``, a `hetjax.core.Pace`; ``--slowdown``'s trace), and
`ReplicaCheckpointer` saves each replica on its own. Given an outer optimizer, a driver runs
local SGD (DiLoCo) over the replicas: under ``'periodic-average'`` every round's mean makes an
outer step, whose state the replica's checkpoints hold.
"""

from hetjax.replicas._averaging import GroupAverager as GroupAverager
from hetjax.replicas._averaging import consensus_distance as consensus_distance
from hetjax.replicas._driver import ReplicaDriver as ReplicaDriver
from hetjax.replicas._driver import ReplicaStep as ReplicaStep
from hetjax.replicas._driver import ServiceThread as ServiceThread
from hetjax.replicas._driver import start_service as start_service
from hetjax.replicas._engine_base import SyncGroup as SyncGroup
from hetjax.replicas._in_loop import ReplicaCheckpointer as ReplicaCheckpointer
from hetjax.replicas._in_loop import ReplicaPolicy as ReplicaPolicy
from hetjax.replicas._policy import RENAMED_SYNC_NAMES as RENAMED_SYNC_NAMES
from hetjax.replicas._policy import Arrive as Arrive
from hetjax.replicas._policy import Leave as Leave
from hetjax.replicas._policy import SyncName as SyncName
from hetjax.replicas._policy import SyncPolicy as SyncPolicy
from hetjax.replicas._policy import Tick as Tick
from hetjax.replicas._policy import parse_sync_name as parse_sync_name
from hetjax.replicas._policy import resume_state as resume_state
from hetjax.replicas._scheduler import GroupRules as GroupRules
from hetjax.replicas._service import ServiceReport as ServiceReport
from hetjax.replicas._service import SyncClient as SyncClient
from hetjax.replicas._service import SyncService as SyncService

__all__ = [
    'RENAMED_SYNC_NAMES',
    'Arrive',
    'GroupAverager',
    'GroupRules',
    'Leave',
    'ReplicaCheckpointer',
    'ReplicaDriver',
    'ReplicaPolicy',
    'ReplicaStep',
    'ServiceReport',
    'ServiceThread',
    'SyncClient',
    'SyncGroup',
    'SyncName',
    'SyncPolicy',
    'SyncService',
    'Tick',
    'consensus_distance',
    'parse_sync_name',
    'resume_state',
    'start_service',
]
