"""Workers: joining a job, launching local ones, the coordination channel and telemetry.

Step records (`StepStats`) and policies come from `hetjax.core`; hosts of known speed and their
slowdown traces from `hetjax.emulation`; the virtual clock is `hetjax.simulation`.
"""

from hetjax.runtime._cache import enable_compilation_cache as enable_compilation_cache
from hetjax.runtime._calibrate import AllReduceFit as AllReduceFit
from hetjax.runtime._calibrate import chain_length as chain_length
from hetjax.runtime._calibrate import device_flops_per_s as device_flops_per_s
from hetjax.runtime._calibrate import device_memory as device_memory
from hetjax.runtime._calibrate import fit_allreduce as fit_allreduce
from hetjax.runtime._calibrate import median_seconds as median_seconds
from hetjax.runtime._calibrate import seconds_per_call as seconds_per_call
from hetjax.runtime._calibrate import time_allreduce as time_allreduce
from hetjax.runtime._discovery import Cluster as Cluster
from hetjax.runtime._discovery import WorkerInfo as WorkerInfo
from hetjax.runtime._discovery import discover_cluster as discover_cluster
from hetjax.runtime._distributed import WorkerContext as WorkerContext
from hetjax.runtime._distributed import initialize as initialize
from hetjax.runtime._elastic import launch_elastic as launch_elastic
from hetjax.runtime._elastic_env import hosts as hosts
from hetjax.runtime._elastic_env import original_workers as original_workers
from hetjax.runtime._elastic_env import restart_attempt as restart_attempt
from hetjax.runtime._elastic_env import restart_cause as restart_cause
from hetjax.runtime._elastic_env import stall_timeout as stall_timeout
from hetjax.runtime._elastic_env import verdict_dir as verdict_dir
from hetjax.runtime._kv import Channel as Channel
from hetjax.runtime._launcher import LaunchResult as LaunchResult
from hetjax.runtime._launcher import launch_local as launch_local
from hetjax.runtime._local_channel import LocalChannel as LocalChannel
from hetjax.runtime._peak_flops import measure_peak_flops as measure_peak_flops
from hetjax.runtime._peak_flops import peak_flops as peak_flops
from hetjax.runtime._rendezvous import port_in_use as port_in_use
from hetjax.runtime._telemetry import TelemetryGatherer as TelemetryGatherer
from hetjax.runtime._watchdog import ProgressWatchdog as ProgressWatchdog

__all__ = [
    'AllReduceFit',
    'Channel',
    'Cluster',
    'LaunchResult',
    'LocalChannel',
    'ProgressWatchdog',
    'TelemetryGatherer',
    'WorkerContext',
    'WorkerInfo',
    'chain_length',
    'device_flops_per_s',
    'device_memory',
    'discover_cluster',
    'enable_compilation_cache',
    'fit_allreduce',
    'hosts',
    'initialize',
    'launch_elastic',
    'launch_local',
    'measure_peak_flops',
    'median_seconds',
    'original_workers',
    'peak_flops',
    'port_in_use',
    'restart_attempt',
    'restart_cause',
    'seconds_per_call',
    'stall_timeout',
    'time_allreduce',
    'verdict_dir',
]
