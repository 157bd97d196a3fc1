"""What hetjax's own benchmarks and tests measure with: hooks into the library's internals, with
no promise of stability; not part of the public surface.

A name lives here when only ``experiments/`` or ``tests/`` use it (never another package of
hetjax, the README, ``docs/`` or ``examples/``); it keeps its home in its package's private
module, and ``import hetjax`` does not import this package.
"""

from hetjax.balance._markov_limit import MarkovLimit as MarkovLimit
from hetjax.emulation._host_pause import HostPause as HostPause
from hetjax.pipeline._stage_programs import dispatch_order as dispatch_order
from hetjax.planner._check import compiled_bytes as compiled_bytes
from hetjax.planner._hlo import collective_bytes as collective_bytes
from hetjax.planner._layout import group_factors as group_factors
from hetjax.planner._layout import mesh_factors as mesh_factors
from hetjax.planner._layout import tensor_degrees as tensor_degrees
from hetjax.run._build import default_bucket as default_bucket
from hetjax.run._build import default_token_rows as default_token_rows
from hetjax.run._build import fsdp_notice as fsdp_notice
from hetjax.runtime._discovery import local_worker_info as local_worker_info
from hetjax.runtime._distributed import ENV_LAUNCHER_PID as ENV_LAUNCHER_PID
from hetjax.runtime._distributed import ENV_WORKER_ID as ENV_WORKER_ID
from hetjax.runtime._launcher import find_free_ports as find_free_ports
from hetjax.runtime._telemetry import split_collective as split_collective
from hetjax.runtime._verdict import proc_stat as proc_stat
from hetjax.train._endgame import may_leave as may_leave
from hetjax.train._flops import compiled_flops as compiled_flops
from hetjax.train._flops import flops_ratio as flops_ratio
from hetjax.train._flops import matmul_equations as matmul_equations
from hetjax.train._flops import matmul_flops as matmul_flops
from hetjax.train._flops import step_flops as step_flops
from hetjax.train._int8 import QUANT_BLOCK as QUANT_BLOCK
from hetjax.train._int8 import int8_bytes as int8_bytes
from hetjax.train._int8 import quantize_int8 as quantize_int8
from hetjax.train._matmul_time import MatmulTime as MatmulTime
from hetjax.train._matmul_time import TimedMatmul as TimedMatmul
from hetjax.train._matmul_time import time_matmuls as time_matmuls

__all__ = [
    'ENV_LAUNCHER_PID',
    'ENV_WORKER_ID',
    'QUANT_BLOCK',
    'HostPause',
    'MarkovLimit',
    'MatmulTime',
    'TimedMatmul',
    'collective_bytes',
    'compiled_bytes',
    'compiled_flops',
    'default_bucket',
    'default_token_rows',
    'dispatch_order',
    'find_free_ports',
    'flops_ratio',
    'fsdp_notice',
    'group_factors',
    'int8_bytes',
    'local_worker_info',
    'matmul_equations',
    'matmul_flops',
    'may_leave',
    'mesh_factors',
    'proc_stat',
    'quantize_int8',
    'split_collective',
    'step_flops',
    'tensor_degrees',
    'time_matmuls',
]
