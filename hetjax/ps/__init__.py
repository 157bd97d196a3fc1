"""A parameter server: servers hold the parameters, workers push gradients and pull parameters.

Transfers go point to point through `jax.experimental.transfer` (`Transport`); requests,
addresses and versions through the key-value channel (`hetjax.runtime.Channel`). Modes bsp, asp
and ssp; eager pull; the staleness-aware learning rate (η / τ) and DC-ASGD (`PsConfig`);
servers checkpoint with orbax, verified on restore (`ServerCheckpointer`). Launch with
``python -m hetjax.launch --workers N --servers K``; see `hetjax.ps._job` for an example.
"""

from hetjax.ps._checkpoint import ServerCheckpointer as ServerCheckpointer
from hetjax.ps._checkpoint import ServerState as ServerState
from hetjax.ps._client import PsClient as PsClient
from hetjax.ps._client import PushResult as PushResult
from hetjax.ps._client import ServerError as ServerError
from hetjax.ps._config import Consistency as Consistency
from hetjax.ps._config import LrRule as LrRule
from hetjax.ps._config import PsConfig as PsConfig
from hetjax.ps._config import parse_ps as parse_ps
from hetjax.ps._job import ENV_NUM_SERVERS as ENV_NUM_SERVERS
from hetjax.ps._job import PsRole as PsRole
from hetjax.ps._job import make_server as make_server
from hetjax.ps._job import make_worker as make_worker
from hetjax.ps._job import ps_role as ps_role
from hetjax.ps._job import serve as serve
from hetjax.ps._layout import ServerLayout as ServerLayout
from hetjax.ps._server import ParameterServer as ParameterServer
from hetjax.ps._server import ServerReport as ServerReport
from hetjax.ps._server import UpdateRecord as UpdateRecord
from hetjax.ps._server import write_report as write_report
from hetjax.ps._transport import Transport as Transport
from hetjax.ps._update import ShardUpdate as ShardUpdate
from hetjax.ps._worker import PsStep as PsStep
from hetjax.ps._worker import PsWorker as PsWorker
from hetjax.ps._worker import PsWorkerState as PsWorkerState

__all__ = [
    'ENV_NUM_SERVERS',
    'Consistency',
    'LrRule',
    'ParameterServer',
    'PsClient',
    'PsConfig',
    'PsRole',
    'PsStep',
    'PsWorker',
    'PsWorkerState',
    'PushResult',
    'ServerCheckpointer',
    'ServerError',
    'ServerLayout',
    'ServerReport',
    'ServerState',
    'ShardUpdate',
    'Transport',
    'UpdateRecord',
    'make_server',
    'make_worker',
    'parse_ps',
    'ps_role',
    'serve',
]
