"""Pipeline parallelism: a model's chain of sub-models cut into stages that pass micro-batches on.

`split_stages` cuts the chain into contiguous stages of the least bottleneck
(`hetjax.planner.profile_split` does it on the planner's measured costs); `gpipe` and
`one_f_one_b` build the order in which each stage runs its forward and backward passes, as data
(`Schedule` of `Action`s) that `Schedule.validate` checks and `time_schedule` times. A model that
implements `HasChain` (its `Link`s in forward order and a ``chain_loss``) can be trained by
`PipelineTrainer`, which runs such a schedule on one device group per stage (in this process or
across processes), with the same gradients as the unpipelined model.

Data-parallel replicas of a pipeline and the policies that sync them (SDPipe) are `hetjax.replicas`.
"""

from hetjax.pipeline._chain import HasChain as HasChain
from hetjax.pipeline._chain import Link as Link
from hetjax.pipeline._chain import check_chain as check_chain
from hetjax.pipeline._executor import PipelineState as PipelineState
from hetjax.pipeline._executor import PipelineTrainer as PipelineTrainer
from hetjax.pipeline._roofline import roofline_costs as roofline_costs
from hetjax.pipeline._schedule import Action as Action
from hetjax.pipeline._schedule import Schedule as Schedule
from hetjax.pipeline._schedule import SimResult as SimResult
from hetjax.pipeline._schedule import gpipe as gpipe
from hetjax.pipeline._schedule import one_f_one_b as one_f_one_b
from hetjax.pipeline._schedule import time_schedule as time_schedule
from hetjax.pipeline._split import split_stages as split_stages
from hetjax.pipeline._stage_checkpoint import StageCheckpointer as StageCheckpointer
from hetjax.pipeline._stage_programs import StagePrograms as StagePrograms
from hetjax.pipeline._stages import StageLayout as StageLayout
from hetjax.pipeline._stages import equal_stages as equal_stages

__all__ = [
    'Action',
    'HasChain',
    'Link',
    'PipelineState',
    'PipelineTrainer',
    'Schedule',
    'SimResult',
    'StageCheckpointer',
    'StageLayout',
    'StagePrograms',
    'check_chain',
    'equal_stages',
    'gpipe',
    'one_f_one_b',
    'roofline_costs',
    'split_stages',
    'time_schedule',
]
