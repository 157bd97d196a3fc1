"""Reports on a run's per-worker telemetry: a summary table and PNG plots; its goodput, loss
curves and TensorBoard event files.

  python -m hetjax.report runs/het4 --skip 1

Throughput here, in a run's ``summary.json`` and in its progress lines is one figure,
`steady_throughput`: the steps after the warm-up that no compile held up (none waited for one or
ran beside one compiling in the background).
"""

from hetjax.report._compare import ComparedRun as ComparedRun
from hetjax.report._compare import compare_runs as compare_runs
from hetjax.report._compare import format_comparison as format_comparison
from hetjax.report._compare import hosts_warning as hosts_warning
from hetjax.report._compare import plot_comparison as plot_comparison
from hetjax.report._goodput import Launch as Launch
from hetjax.report._goodput import format_goodput as format_goodput
from hetjax.report._goodput import goodput as goodput
from hetjax.report._hosts import describe_hosts as describe_hosts
from hetjax.report._hosts import hosts_of as hosts_of
from hetjax.report._live_throughput import LiveThroughput as LiveThroughput
from hetjax.report._loss import LossCurves as LossCurves
from hetjax.report._loss import load_loss as load_loss
from hetjax.report._loss import plot_loss as plot_loss
from hetjax.report._objective import METRICS_FILE as METRICS_FILE
from hetjax.report._objective import ObjectiveCurve as ObjectiveCurve
from hetjax.report._objective import load_objective as load_objective
from hetjax.report._objective import plot_objective as plot_objective
from hetjax.report._plots import plot_shares as plot_shares
from hetjax.report._plots import plot_throughput as plot_throughput
from hetjax.report._plots import plot_timeline as plot_timeline
from hetjax.report._plots import write_plots as write_plots
from hetjax.report._telemetry_table import IterationSummary as IterationSummary
from hetjax.report._telemetry_table import Telemetry as Telemetry
from hetjax.report._telemetry_table import WorkerSummary as WorkerSummary
from hetjax.report._telemetry_table import format_table as format_table
from hetjax.report._telemetry_table import iteration_summary as iteration_summary
from hetjax.report._telemetry_table import load_telemetry as load_telemetry
from hetjax.report._telemetry_table import summarise as summarise
from hetjax.report._telemetry_table import summary_fields as summary_fields
from hetjax.report._telemetry_table import telemetry_throughput as telemetry_throughput
from hetjax.report._tensorboard import TensorBoardWriter as TensorBoardWriter
from hetjax.report._throughput import SteadyCount as SteadyCount
from hetjax.report._throughput import Throughput as Throughput
from hetjax.report._throughput import steady_throughput as steady_throughput

__all__ = [
    'METRICS_FILE',
    'ComparedRun',
    'IterationSummary',
    'Launch',
    'LiveThroughput',
    'LossCurves',
    'ObjectiveCurve',
    'SteadyCount',
    'Telemetry',
    'TensorBoardWriter',
    'Throughput',
    'WorkerSummary',
    'compare_runs',
    'describe_hosts',
    'format_comparison',
    'format_goodput',
    'format_table',
    'goodput',
    'hosts_of',
    'hosts_warning',
    'iteration_summary',
    'load_loss',
    'load_objective',
    'load_telemetry',
    'plot_comparison',
    'plot_loss',
    'plot_objective',
    'plot_shares',
    'plot_throughput',
    'plot_timeline',
    'steady_throughput',
    'summarise',
    'summary_fields',
    'telemetry_throughput',
    'write_plots',
]
