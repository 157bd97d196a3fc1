"""Pipeline parallelism: a model's chain of sub-models cut into stages that pass micro-batches on.

`split_stages` cuts the chain into contiguous stages of the least bottleneck; `gpipe` and
`one_f_one_b` build the order in which each stage runs its forward and backward passes, as data
(`Schedule` of `Action`s) that `Schedule.validate` checks and `simulate` times. The executor that
runs a schedule on devices (SDPipe / GPipe / 1F1B) comes later and builds on these.
"""

from hetjax.pipeline._schedule import Action as Action
from hetjax.pipeline._schedule import Schedule as Schedule
from hetjax.pipeline._schedule import SimResult as SimResult
from hetjax.pipeline._schedule import gpipe as gpipe
from hetjax.pipeline._schedule import one_f_one_b as one_f_one_b
from hetjax.pipeline._schedule import simulate as simulate
from hetjax.pipeline._split import split_stages as split_stages

__all__ = [
    'Action',
    'Schedule',
    'SimResult',
    'gpipe',
    'one_f_one_b',
    'simulate',
    'split_stages',
]
