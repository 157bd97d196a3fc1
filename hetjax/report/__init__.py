"""Reports on a run's per-worker telemetry: a summary table and PNG plots.

  python -m hetjax.report runs/het4 --skip 1
"""

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

__all__ = [
    'IterationSummary',
    'Telemetry',
    'WorkerSummary',
    'format_table',
    'iteration_summary',
    'load_telemetry',
    'plot_shares',
    'plot_throughput',
    'plot_timeline',
    'summarise',
    'write_plots',
]
