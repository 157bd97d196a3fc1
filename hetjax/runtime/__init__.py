"""Workers: joining a job, launching local ones, emulating slowness, telemetry, a virtual clock."""

from hetjax.runtime._cache import enable_compilation_cache as enable_compilation_cache
from hetjax.runtime._calibrate import AllReduceFit as AllReduceFit
from hetjax.runtime._calibrate import fit_allreduce as fit_allreduce
from hetjax.runtime._calibrate import time_allreduce as time_allreduce
from hetjax.runtime._cluster import Cluster as Cluster
from hetjax.runtime._cluster import WorkerInfo as WorkerInfo
from hetjax.runtime._cluster import discover_cluster as discover_cluster
from hetjax.runtime._cluster import local_worker_info as local_worker_info
from hetjax.runtime._distributed import WorkerContext as WorkerContext
from hetjax.runtime._distributed import initialize as initialize
from hetjax.runtime._kv import Channel as Channel
from hetjax.runtime._launcher import LaunchResult as LaunchResult
from hetjax.runtime._launcher import find_free_ports as find_free_ports
from hetjax.runtime._launcher import launch_local as launch_local
from hetjax.runtime._local_channel import LocalChannel as LocalChannel
from hetjax.runtime._slowdown import CsvTrace as CsvTrace
from hetjax.runtime._slowdown import MarkovTrace as MarkovTrace
from hetjax.runtime._slowdown import SlowdownTrace as SlowdownTrace
from hetjax.runtime._slowdown import StaticTrace as StaticTrace
from hetjax.runtime._slowdown import StepChangeTrace as StepChangeTrace
from hetjax.runtime._slowdown import TimeDilation as TimeDilation
from hetjax.runtime._slowdown import dilation_seconds as dilation_seconds
from hetjax.runtime._slowdown import parse_slowdown as parse_slowdown
from hetjax.runtime._telemetry import TelemetryGatherer as TelemetryGatherer
from hetjax.runtime._telemetry import WorkerStepStats as WorkerStepStats
from hetjax.runtime._telemetry import split_collective as split_collective
from hetjax.runtime._virtual_clock import CostModel as CostModel
from hetjax.runtime._virtual_clock import SharePolicy as SharePolicy
from hetjax.runtime._virtual_clock import StepStats as StepStats
from hetjax.runtime._virtual_clock import UniformShares as UniformShares
from hetjax.runtime._virtual_clock import VirtualRun as VirtualRun
from hetjax.runtime._virtual_clock import simulate as simulate
from hetjax.runtime._virtual_tokens import simulate_tokens as simulate_tokens

__all__ = [
    'AllReduceFit',
    'Channel',
    'Cluster',
    'CostModel',
    'CsvTrace',
    'LaunchResult',
    'LocalChannel',
    'MarkovTrace',
    'SharePolicy',
    'SlowdownTrace',
    'StaticTrace',
    'StepChangeTrace',
    'StepStats',
    'TelemetryGatherer',
    'TimeDilation',
    'UniformShares',
    'VirtualRun',
    'WorkerContext',
    'WorkerInfo',
    'WorkerStepStats',
    'dilation_seconds',
    'discover_cluster',
    'enable_compilation_cache',
    'find_free_ports',
    'fit_allreduce',
    'initialize',
    'launch_local',
    'local_worker_info',
    'parse_slowdown',
    'simulate',
    'simulate_tokens',
    'split_collective',
    'time_allreduce',
]
