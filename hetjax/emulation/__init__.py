"""Emulating heterogeneous hosts on one machine: slowdown traces, hosts of known speed, calibration.

A `SlowdownTrace` (text form: `parse_trace`) says how much slower each worker's host is at each
step and which steps a transient straggler hits; a `KnownSpeedHost` pads a real worker's steps
by sleep to the time that host takes, from a per-row cost that `calibrate_row_cost` measures
(`build_host`: the one builder, with the one `MARGIN`, the cost agreed across workers);
`Links` (text form: `parse_links`) does the same for transfers, by each worker's link latency
and bandwidth, the step's gradient crossing them as one ring all-reduce or each worker's own
push and pull (`Exchange`).

A program takes its emulated host through ``use_host`` as a `hetjax.core.Pace`, the one seam
between programs and emulation: a `KnownSpeedHost` (steps of rows), a `LinkedHost` (a host on
emulated links), a `StagePace` (a plan's stage actions) or a replica's host priced per step
(its slowdown from `replica_trace`). The virtual clock models the same hosts, by the same
`HostModel`. Nothing here imports the rest of hetjax but its root internals: the errors, the
value checks and the α–β link model (`hetjax.core.LinkCost`, `hetjax.core.Collective`).
"""

from ._build_host import MARGIN as MARGIN
from ._build_host import Board as Board
from ._build_host import Calibration as Calibration
from ._build_host import build_host as build_host
from ._calibrate import RowCost as RowCost
from ._calibrate import calibrate_row_cost as calibrate_row_cost
from ._grammar import parse_trace as parse_trace
from ._host_model import HostModel as HostModel
from ._host_pause import replica_trace as replica_trace
from ._hosts import KnownSpeedHost as KnownSpeedHost
from ._linked_host import LinkedHost as LinkedHost
from ._network import Exchange as Exchange
from ._network import Links as Links
from ._network import parse_links as parse_links
from ._stage_pace import StagePace as StagePace
from ._subset import SubsetTrace as SubsetTrace
from ._subset import subset as subset
from ._traces import ComposedTrace as ComposedTrace
from ._traces import CsvTrace as CsvTrace
from ._traces import MarkovTrace as MarkovTrace
from ._traces import SlowdownTrace as SlowdownTrace
from ._traces import StaticTrace as StaticTrace
from ._traces import StepChangeTrace as StepChangeTrace
from ._traces import TransientTrace as TransientTrace

__all__ = [
    'MARGIN',
    'Board',
    'Calibration',
    'ComposedTrace',
    'CsvTrace',
    'Exchange',
    'HostModel',
    'KnownSpeedHost',
    'LinkedHost',
    'Links',
    'MarkovTrace',
    'RowCost',
    'SlowdownTrace',
    'StagePace',
    'StaticTrace',
    'StepChangeTrace',
    'SubsetTrace',
    'TransientTrace',
    'build_host',
    'calibrate_row_cost',
    'parse_links',
    'parse_trace',
    'replica_trace',
    'subset',
]
